"""Qwen3-TTS tokenizer's decoder streams through `codec-serve` (a process of its own on
127.0.0.1, the tiny preset with `--slots 4`): streams joining and leaving at different times,
more than the slots, each get exactly what its stream alone gives in a pool of one slot; the
encode side, which has no stream, is refused in the protocol's own error."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from serve_support import frame_chunks, ref_decode, run, serving
from shared_exports import qwen3tts_slots

import codecport
from codecport.serve import ServeError, connect, stream


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return qwen3tts_slots(tmp_path_factory)


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    # Six streams for four slots: the two past them wait in the queue and join as others leave.
    with serving(folder, tmp_path_factory.mktemp("serve") / "qwen3tts.log", "--slots", 4, "--queue", 4) as s:
        yield s


def test_concurrent_decode_streams_are_each_their_own(server, folder):
    codec = codecport.load(folder)
    rng = np.random.default_rng(11)
    seqs = [rng.integers(0, 64, (4, n)) for n in (37, 5, 61, 1, 23, 44)]

    async def one(codes, sizes):
        async with await connect(server.url, "decode") as c:
            assert c.info["latency"]["decoder"]["samples"] == 0
            return await stream(c, frame_chunks(codes, sizes))

    sizes = ([3, 1, 9], [5], [7, 2], [1], [4, 4, 1], [11])

    async def go():
        return await asyncio.gather(*(one(codes, cut) for codes, cut in zip(seqs, sizes)))

    for got, codes in zip(run(go()), seqs):
        want = ref_decode(codec, codes)
        assert want.size == codes.shape[1] * codec.frame_size
        np.testing.assert_allclose(got.audio(), want, rtol=0, atol=1e-6)
    status, health = server.get("/health")
    pool = health["pools"]["decoder"]
    assert status == 200 and pool["total"] == 4 and pool["active"] == 0 and pool["batch"] == 4


def test_encode_is_refused_as_a_stream_it_has_not(server):
    async def go():
        with pytest.raises(ServeError) as e:
            async with await connect(server.url, "encode"):
                pass
        return e.value

    err = run(go())
    assert "streams only its decoder side" in str(err) and "ask for decode" in str(err)
