"""`codec-serve`'s engine beside its event loop: a message's bytes (resampled, joined, packed) are
worked on other threads; a duplex stream's codes for its decoder count against the input bound;
a slot that opens again with the same settings takes up its stream again rather than a new one
(whose own state would be made and thrown away)."""

from __future__ import annotations

import asyncio
import threading
import types

import numpy as np
import pytest
import soxr
from conftest import noise
from serve_support import in_process, ref_encode, run

import codecport
from codecport.runtime.slots import open_pool
from codecport.serve.live import PIECE_BYTES, Limits, Live
from codecport.serve.metrics import Metrics
from codecport.serve.protocol import Request

SR = 24000  # the tiny Mimi's rate


@pytest.fixture(scope="module")
def mimi_codec(tiny_mimi_export):
    return codecport.load(tiny_mimi_export)


def test_the_bytes_of_a_stream_are_worked_off_the_event_loop(mimi_codec, monkeypatch):
    """Resampling a large message (up to --max-message), joining a stream's waiting input (up to 4
    x that) and packing its output into messages run on threads of their own: a megabyte of soxr
    VHQ held every other connection for tens of milliseconds on the event loop. The client runs
    on a thread of its own, so that what runs on the server's loop thread is the server's."""
    from codecport.serve import engine, live

    seen: dict[str, set] = {"resample": set(), "join": set(), "pack": set()}
    real_stream, real_join, real_pack = soxr.ResampleStream, np.concatenate, live.pcm_to_bytes

    class Stream(real_stream):
        def resample_chunk(self, x, *a, **k):
            if len(x) > 4096:
                seen["resample"].add(threading.get_ident())
            return super().resample_chunk(x, *a, **k)

    def join(*a, **k):
        seen["join"].add(threading.get_ident())
        return real_join(*a, **k)

    def pack(*a, **k):
        seen["pack"].add(threading.get_ident())
        return real_pack(*a, **k)

    monkeypatch.setattr(soxr, "ResampleStream", Stream)
    monkeypatch.setattr(engine, "np", types.SimpleNamespace(**{**vars(np), "concatenate": join}))
    monkeypatch.setattr(live, "pcm_to_bytes", pack)
    x = noise(80_000, seed=4)[0]  # 320 KB a message at 16 kHz: resampled up to 24 kHz

    async def go():
        async with in_process(mimi_codec, max_message=1 << 20) as (_, url):
            from codecport.serve import duplex

            def client():
                return asyncio.run(duplex(url, x, 16000, chunk=len(x) // 2, codebooks=4))

            codes, audio = await asyncio.get_running_loop().run_in_executor(None, client)
            return threading.get_ident(), codes, audio

    loop, codes, audio = run(go())
    assert all(seen.values()), seen  # each was seen at work
    assert not any(loop in threads for threads in seen.values()), seen
    want = ref_encode(mimi_codec, soxr.resample(x, 16000, SR, quality="VHQ").astype(np.float32), 4)
    assert np.array_equal(codes[0], want) and audio.size == want.shape[1] * mimi_codec.frame_size


def test_a_duplex_streams_codes_for_its_decoder_count_against_the_input_bound(mimi_codec):
    """The codes a duplex stream's encoder gives wait for its decoder as the client's own input
    waits: counted (their bytes and `PIECE_BYTES` a piece), so that the connection stops being
    read past the bound (they went to the decoder's input uncounted)."""
    woken = []
    stream = Live(Request("duplex", "f32", SR, 4, None), mimi_codec,
                  Limits(input_bound=8192, max_backlog=1 << 20), Metrics(("encoder", "decoder"), dict),
                  lambda: woken.append(1))
    codes = np.zeros((4, 2), np.int64)
    pieces = 8192 // (codes.nbytes + PIECE_BYTES)
    for _ in range(pieces):
        stream.to_decoder(codes)
    assert stream.room.is_set() and len(woken) == pieces
    stream.to_decoder(codes)
    assert not stream.room.is_set()
    assert stream.pending_bytes["decoder"] == (pieces + 1) * (codes.nbytes + PIECE_BYTES)
    assert len(stream.take("decoder")) == pieces + 1 and stream.room.is_set()


def test_a_slot_opened_again_takes_up_its_stream_again(mimi_codec, monkeypatch):
    """Each stream of a slot pool made its own step state (the released Mimi: 8 MB a side), then
    lost it to its row of the pool's bank. A slot that opens again with the same settings takes
    up its last stream, reset when the slot closed: no state made, and every stream on it exact.
    Other settings make a new stream."""
    from codecport.runtime import step

    made = []
    real = step.StepRunner.__init__

    def counted(self, *a, **k):
        made.append(1)
        real(self, *a, **k)

    monkeypatch.setattr(step.StepRunner, "__init__", counted)
    pool = open_pool(mimi_codec, "encoder", 2)
    new = []
    for i, k in enumerate((4, 4, 4, 2, 2, 4)):
        x = noise(900 + 37 * i, seed=20 + i)[0]
        made.clear()
        slot = pool.open(n_codebooks=k)
        new.append(len(made))
        assert slot.index == 0
        slot.feed(x)
        slot.end()
        out = []
        while not slot.finished:
            pieces, failed = pool.step([slot])
            assert not failed
            out.append(pieces[slot])
        slot.close()
        assert np.array_equal(np.concatenate(out, axis=1), ref_encode(mimi_codec, x, k)), i
    assert new == [1, 0, 0, 1, 0, 1]
