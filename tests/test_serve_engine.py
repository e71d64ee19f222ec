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
from serve_support import in_process, ref_encode, run
from support import noise

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


def test_any_failure_opening_a_streams_slots_refuses_it_and_gives_them_back(mimi_codec, monkeypatch):
    """A slot that fails to open with something other than a CodecportError (an ONNX Runtime
    error, a MemoryError) refuses that stream with `internal`, counts no slot as held, and the
    streams granted with it still open: a duplex stream whose decoder slot fails leaves both
    sides free, and the next stream is served exactly."""
    from codecport.runtime import slots as slots_module
    from codecport.serve import ServeError, connect, stream

    real, fail = slots_module.SlotPool.open, {"decoder": 1}

    def open_or_fail(pool, **settings):
        if fail.get(pool.side):
            fail[pool.side] -= 1
            raise MemoryError("injected: no memory for a decoder state")
        return real(pool, **settings)

    monkeypatch.setattr(slots_module.SlotPool, "open", open_or_fail)
    x = noise(4800, seed=9)[0]

    async def go():
        async with in_process(mimi_codec, slots=1) as (server, url):
            with pytest.raises(ServeError) as refused:
                await connect(url, "duplex", codebooks=2)
            held = dict(server.scheduler.admission.held)
            async with await connect(url, "duplex", codebooks=2) as c:  # the one slot of each side
                got = await stream(c, [x[:2000], x[2000:]])
            return refused.value, held, got, server.scheduler.metrics.errors["internal"]

    refused, held, got, internal = run(go())
    assert refused.code == "internal" and "no memory for a decoder state" in str(refused), refused
    assert held == {"encoder": 0, "decoder": 0} and internal == 1
    codes = ref_encode(mimi_codec, x, 2)
    assert np.array_equal(got.codes()[0], codes)


def test_a_step_that_never_returns_turns_health_unhealthy(mimi_codec, monkeypatch):
    """A job in flight past every plausible step time (a hung ONNX Runtime call) is seen: the
    scheduler says how long it has been stuck, and /health answers 503 with ok false (a Ray
    replica fails its health check on the same fact and is replaced: tests/test_ray.py)."""
    import json
    import urllib.error
    import urllib.request

    from codecport.serve import connect, engine

    release = threading.Event()
    monkeypatch.setattr(engine, "STUCK_S", 0.3)
    real = engine.Job.run

    def hang(job):
        release.wait(30)
        return real(job)

    async def go():
        async with in_process(mimi_codec, slots=1) as (server, url):
            def health():
                try:
                    with urllib.request.urlopen(url + "/health", timeout=10) as r:
                        return r.status, json.loads(r.read())
                except urllib.error.HTTPError as e:
                    return e.code, json.loads(e.read())

            before = await asyncio.to_thread(health)
            monkeypatch.setattr(engine.Job, "run", hang)
            c = await connect(url, "encode")
            await c.send_pcm(noise(2400, seed=2)[0])
            await until_stuck(server)
            during = await asyncio.to_thread(health)
            release.set()
            await c.close()
            return before, during

    async def until_stuck(server):
        while server.scheduler.stuck() is None:
            await asyncio.sleep(0.05)

    before, during = run(go())
    assert before[0] == 200 and before[1]["ok"] and "stuck_s" not in before[1]
    assert during[0] == 503 and not during[1]["ok"] and during[1]["stuck_s"] >= 0.3, during
