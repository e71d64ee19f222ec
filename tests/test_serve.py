"""`codec-serve` as a user runs it (a process of its own on 127.0.0.1, `--port 0`, the printed
URL parsed), spoken to by the shared client (codecport/serve/client.py): a served stream gives
exactly what the runtime's streams give for the same input; concurrent clients that come and go
each get their own exact results; every refusal is a JSON error that closes that connection
only; a client that leaves frees its slot at once; a slow reader is warned, then dropped, while
the others go on; the queue; /health and /metrics; SIGTERM drains and exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import time
import urllib.request

import aiohttp
import numpy as np
import onnx
import pytest
import soxr
from click.testing import CliRunner
from serve_support import (
    BIN,
    Gate,
    RawSocket,
    chunks,
    closed_with,
    frame_chunks,
    get_json,
    in_process,
    in_thread,
    ref_decode,
    ref_encode,
    run,
    serving,
    slots_freed,
    until,
)
from shared_exports import TINY_SLOTS, copy_folder
from support import noise

import codecport
from codecport.cli.serve import serve_cli
from codecport.serve import Result, ServeError, connect, stream
from codecport.serve.protocol import CLOSE_CODES

SR = 24000  # the tiny Mimi's rate


@pytest.fixture(scope="module")
def mimi(tiny_mimi_export, tmp_path_factory):
    with serving(tiny_mimi_export, tmp_path_factory.mktemp("serve") / "mimi.log", "--slots", 8,
                 "--max-message", 65536) as s:
        yield s


@pytest.fixture(scope="module")
def snac(tiny_snac_export, tmp_path_factory):
    with serving(tiny_snac_export, tmp_path_factory.mktemp("serve") / "snac.log", "--slots", 2) as s:
        yield s


@pytest.fixture(scope="module")
def mimi_codec(tiny_mimi_export):
    return codecport.load(tiny_mimi_export)


# ---- exact results ------------------------------------------------------------------------------
@pytest.mark.parametrize("pcm, rate", [("f32", SR), ("s16", SR), ("f32", 16000)])
def test_encode_gives_the_encoder_streams_codes(mimi, mimi_codec, pcm, rate):
    x = noise(int(0.3 * rate), seed=1)[0]
    if pcm == "s16":
        x = np.round(x * 32767).astype(np.int16)
    model_rate = (x.astype(np.float32) / 32768 if pcm == "s16" else x)
    if rate != SR:
        model_rate = soxr.resample(model_rate, rate, SR, quality="VHQ").astype(np.float32)
    want = ref_encode(mimi_codec, model_rate, 3)

    async def go():
        async with await connect(mimi.url, "encode", pcm=pcm, sample_rate=rate, codebooks=3) as c:
            assert (c.info["codec"], c.info["sample_rate"], c.info["codebooks"]) == ("mimi", SR, 3)
            assert c.info["input_sample_rate"] == rate and c.info["code_layout"] == [[3, 1]]
            return await stream(c, chunks(x, [331, 48, 1000, 7]))

    got = run(go())
    assert np.array_equal(got.codes()[0], want)
    assert got.done["frames"] == {"encoder": want.shape[1]}


@pytest.mark.parametrize("pcm", ["f32", "s16"])
def test_decode_gives_the_decoder_streams_audio(mimi, mimi_codec, pcm):
    codes = np.random.default_rng(2).integers(0, mimi_codec.codebook_size, (4, 301))
    want = ref_decode(mimi_codec, codes)
    if pcm == "s16":
        want = np.clip(np.round(want * 32768), -32768, 32767) / 32768

    async def go():
        async with await connect(mimi.url, "decode", pcm=pcm, codebooks=4) as c:
            return await stream(c, frame_chunks(codes, [5, 1, 64, 2]))

    got = run(go())
    assert got.audio().dtype == np.float32 and np.array_equal(got.audio(), want.astype(np.float32))


@pytest.mark.parametrize("op", ["encode", "decode", "duplex"])
def test_an_end_after_all_the_output_still_gets_done(mimi, mimi_codec, op):
    """Input of whole steps, all its output received, then the end: nothing is left to step, and
    done comes at once; so it does for a stream that never got any input."""
    step = mimi_codec.frame_size * 2  # the tiny Mimi steps 2 frames a call
    x = noise(50 * step, seed=11)[0]
    codes = ref_encode(mimi_codec, x, 4)

    async def go(empty: bool):
        async with await connect(mimi.url, op, codebooks=4) as c:
            if not empty:
                await (c.send_codes(codes) if op == "decode" else c.send_pcm(x))
                want = {"encode": [codes.shape[1], 0], "decode": [0, x.size],
                        "duplex": [codes.shape[1], x.size]}
                have = [0, 0]  # code frames, samples
                while have != want[op]:
                    piece = await c.receive(timeout=10)
                    have[piece.kind == "audio"] += (piece.data[0].shape[1] if piece.kind == "codes"
                                                    else piece.data.size)
            await c.end()
            assert await c.receive(timeout=10) is None and c.done is not None

    run(go(False))
    run(go(True))


def test_duplex_gives_both_streams(mimi, mimi_codec):
    x = noise(7000, seed=3)[0]
    codes = ref_encode(mimi_codec, x, 2)
    audio = ref_decode(mimi_codec, codes)

    async def go():
        async with await connect(mimi.url, "duplex", codebooks=2) as c:
            assert set(c.info["slot"]) == {"encoder", "decoder"}
            return await stream(c, chunks(x, [500, 3, 2048]))

    got = run(go())
    assert np.array_equal(got.codes()[0], codes) and np.array_equal(got.audio(), audio)
    kinds = [p.kind for p in got.pieces]
    assert kinds.index("codes") < kinds.index("audio")  # codes go out before their audio


def test_snac_decodes_with_the_noise_asked_for(snac, tiny_snac_export):
    codec = codecport.load(tiny_snac_export)
    frames = 37
    levels = [np.random.default_rng(lv).integers(0, codec.codebook_size, (1, frames * codec.strides[0] // s))
              for lv, s in enumerate(codec.strides)]
    per = [codec.strides[0] // s for s in codec.strides]
    pieces = [[a[:, i * p:(i + n) * p] for a, p in zip(levels, per)] for i, n in ((0, 5), (5, 1), (6, 31))]

    async def go(seed):
        async with await connect(snac.url, "decode", noise=seed) as c:
            assert c.info["strides"] == list(codec.strides) and c.info["code_layout"] == [[1, p] for p in per]
            return await stream(c, pieces)

    for asked in (7, "zero"):
        assert np.array_equal(run(go(asked)).audio(), ref_decode(codec, levels, noise=asked))
    fresh = run(go(None))  # fresh noise, as the official decode; the reply says which seed
    seed = fresh.info["noise"]
    assert isinstance(seed, int) and np.array_equal(fresh.audio(), ref_decode(codec, levels, noise=seed))


@pytest.mark.parametrize("batched", [True, False])
def test_clients_that_come_and_go_each_get_their_own(mimi, tiny_mimi_export, tmp_path, mimi_codec, batched):
    """Streams join and leave at different times, some leave mid-stream; each finished one is
    exact, as if it had the server to itself: stepped 3 slots a call through the folder's batched
    graphs (`--slots 3` at export), or one a call (`--no-batch`)."""
    if batched:
        assert mimi.get("/health")[1]["pools"]["encoder"]["batch"] == TINY_SLOTS
        _clients_that_come_and_go(mimi, mimi_codec)
        return
    with serving(tiny_mimi_export, tmp_path / "log", "--no-batch") as server:
        assert server.get("/health")[1]["pools"]["encoder"]["batch"] == 1
        _clients_that_come_and_go(server, mimi_codec)


def _clients_that_come_and_go(mimi, mimi_codec):
    rng = np.random.default_rng(4)
    xs = [noise(int(rng.integers(1500, 6000)), seed=10 + i)[0] for i in range(6)]
    cs = [rng.integers(0, mimi_codec.codebook_size, (4, int(rng.integers(50, 250)))) for _ in range(3)]

    async def encoder(i):
        await asyncio.sleep(0.03 * i)
        async with await connect(mimi.url, "encode", codebooks=1 + i % 4) as c:
            return await stream(c, chunks(xs[i], [int(rng.integers(10, 900)) for _ in range(4)]),
                                interval=0.002)

    async def decoder(i):
        await asyncio.sleep(0.05 * i)
        async with await connect(mimi.url, "decode", codebooks=4) as c:
            return await stream(c, frame_chunks(cs[i], [3, 17, 1]))

    async def leaver(i):
        await asyncio.sleep(0.02 * i)
        c = await connect(mimi.url, "encode")
        await c.send_pcm(xs[i][:1000])
        await asyncio.sleep(0.02)
        await c.close()  # gone mid-stream, without an end

    async def go():
        return await asyncio.gather(*[encoder(i) for i in range(4)], *[decoder(i) for i in range(3)],
                                    leaver(4), leaver(5))

    got = run(go())
    for i in range(4):
        assert np.array_equal(got[i].codes()[0], ref_encode(mimi_codec, xs[i], 1 + i % 4)), i
    for i in range(3):
        assert np.array_equal(got[4 + i].audio(), ref_decode(mimi_codec, cs[i])), i


# ---- refusals -----------------------------------------------------------------------------------
BAD_HANDSHAKES = [
    ("not json", "bad_request"),
    ('["op", "encode"]', "bad_request"),
    ('{"op": "transcode"}', "bad_request"),
    ('{"op": "encode", "rate": 16000}', "bad_request"),
    ('{"op": "encode", "codebooks": 0}', "bad_request"),
    ('{"op": "encode", "codebooks": 5}', "bad_request"),
    ('{"op": "encode", "codebooks": "3"}', "bad_request"),
    ('{"op": "encode", "sample_rate": 10}', "bad_request"),
    ('{"op": "encode", "pcm": "f64"}', "bad_request"),
    ('{"op": "decode", "noise": 3}', "bad_request"),
    ('{"op": "encode", "protocol": 2}', "bad_request"),
    ('{"op": "encode", "protocol": true}', "bad_request"),  # equal to 1 in Python, not a version
    ('{"op": "encode", "protocol": 1.0}', "bad_request"),
    (b"\x00\x00\x80\x3f", "bad_request"),  # binary before the handshake
    ('{"op": "encode", "pcm": ["f32"]}', "bad_request"),
    ("[" * 5000, "bad_request"),  # past the JSON parser's recursion
]


@pytest.mark.parametrize("first, code", BAD_HANDSHAKES)
def test_a_bad_handshake_is_refused_in_one_json_error(mimi, first, code):
    async def go():
        async with aiohttp.ClientSession() as s, s.ws_connect(mimi.url + "/stream") as ws:
            await (ws.send_str(first) if isinstance(first, str) else ws.send_bytes(first))
            msg = await ws.receive(timeout=10)
            assert msg.type is aiohttp.WSMsgType.TEXT, msg
            error = json.loads(msg.data)
            assert (error["op"], error["code"]) == ("error", code) and error["message"], error
            closing = await ws.receive(timeout=10)
            assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), closing
            assert ws.close_code == CLOSE_CODES[code]

    run(go())


NAN = np.array([0.1, np.nan], "<f4").tobytes()
BAD_MESSAGES = [  # (op, messages after the handshake, the error)
    ("encode", [NAN], "bad_input"),
    ("encode", [np.array([0.1, np.inf], "<f4").tobytes()], "bad_input"),
    ("encode", [b"\x00\x00\x00"], "bad_input"),  # not whole float32 samples
    ("decode", [np.array([[0, 1], [2, 64], [0, 0], [0, 0]], "<i4").tobytes()], "bad_input"),  # 64 >= size
    ("decode", [np.array([0, -1, 0, 0], "<i4").tobytes()], "bad_input"),
    ("decode", [np.zeros(6, "<i4").tobytes()], "bad_input"),  # 1.5 frames of 4 codebooks
    ("encode", [np.zeros(20000, "<f4").tobytes()], "too_large"),  # 80 kB > --max-message 64 kB
    ("encode", ['{"op": "flush"}'], "bad_request"),
    ("encode", ["{"], "bad_request"),
    ("encode", ['{"op": "end"}', np.zeros(10, "<f4").tobytes()], "bad_request"),  # input after end
    ("decode", ['{"op": "encode"}'], "bad_request"),
]


@pytest.mark.parametrize("op, messages, code", BAD_MESSAGES)
def test_a_bad_message_ends_that_stream_only(mimi, mimi_codec, op, messages, code):
    x = noise(2000, seed=5)[0]

    async def go():
        bystander = await connect(mimi.url, "encode", codebooks=4)
        await bystander.send_pcm(x[:1000])
        c = await connect(mimi.url, op, codebooks=4)
        for m in messages:
            await c.send_raw(m)
        await closed_with(c, code)
        await bystander.send_pcm(x[1000:])
        await bystander.end()
        got = Result(bystander.info, [p async for p in bystander])
        await bystander.close()
        return got

    got = run(go())
    assert np.array_equal(got.codes()[0], ref_encode(mimi_codec, x, 4))
    status, health = mimi.get("/health")
    assert status == 200 and health["ok"]


def test_a_broken_websocket_frame_is_answered_in_a_json_error(mimi):
    """Text that is not UTF-8: aiohttp closes the connection itself (1007), after the error."""
    async def go():
        c = await connect(mimi.url, "encode")
        await c.ws.send_frame(b"\xff\xfe", aiohttp.WSMsgType.TEXT)
        with pytest.raises(ServeError, match="not a valid WebSocket message") as e:
            await c.receive(timeout=10)
        await c.close()
        return e.value.code

    assert run(go()) == "bad_request"


def test_the_client_says_what_stands_in_the_way_in_a_serve_error(mimi):
    async def go():
        for url, code, words in ((mimi.url + "/health", "unreachable", "answered HTTP 200"),
                                 ("no-scheme:8000", "bad_request", "not a server URL"),
                                 ("http://127.0.0.1:1", "unreachable", "is codec-serve running there")):
            with pytest.raises(ServeError, match=words) as e:
                await connect(url, "encode")
            assert e.value.code == code, (url, e.value)

    run(go())


def test_snac_refuses_what_it_cannot_stream(snac):
    async def go():
        with pytest.raises(ServeError, match="decoder") as e:
            await connect(snac.url, "encode")
        assert e.value.code == "bad_request"
        with pytest.raises(ServeError, match="codebooks") as e:
            await connect(snac.url, "decode", codebooks=2)

    run(go())


def test_more_clients_than_slots_are_told_busy(tiny_mimi_export, tmp_path, mimi_codec):
    """--slots 1: a second client is refused at once; the first one's leaving (mid-stream, by a
    dropped socket) frees the slot at once, reset: the next stream on it is exact."""
    x = noise(3000, seed=6)[0]
    with serving(tiny_mimi_export, tmp_path / "log", "--slots", 1) as server:
        async def go():
            first = await connect(server.url, "encode")
            await first.send_pcm(x[:2000])
            assert (await first.receive(timeout=10)).kind == "codes"
            with pytest.raises(ServeError, match="slots are taken") as e:
                await connect(server.url, "duplex")  # needs an encoder slot too
            assert e.value.code == "busy"
            async with await connect(server.url, "decode") as other:  # the decoder pool has its own
                assert other.info["slot"] == {"decoder": 0}
            first.ws.get_extra_info("socket").shutdown(socket.SHUT_RDWR)  # vanishes, no close

            async def freed() -> bool:
                return (await get_json(server.url + "/health"))[1]["slots"]["active"] == 0

            await until(freed, "the slot was not freed")
            await first.close()
            async with await connect(server.url, "encode") as again:
                assert again.info["slot"] == {"encoder": 0}
                return await stream(again, [x])

        got = run(go())
        assert np.array_equal(got.codes()[0], ref_encode(mimi_codec, x, 4))
        _, metrics = server.get("/metrics")
        assert "codec_serve_busy_total 1" in metrics.splitlines()


def test_the_queue_waits_for_a_slot_then_times_out(tiny_mimi_export, tmp_path, mimi_codec):
    x = noise(1000, seed=7)[0]
    with serving(tiny_mimi_export, tmp_path / "log", "--slots", 1, "--queue", 1,
                 "--queue-timeout", 1) as server:
        async def go():
            first = await connect(server.url, "encode")
            waiting = asyncio.ensure_future(connect(server.url, "encode"))

            async def queued() -> int:
                return (await get_json(server.url + "/health"))[1]["queued"]

            await until(queued, "the second stream was never queued")
            with pytest.raises(ServeError, match="queue of 1 is full") as e:  # the queue holds one
                await connect(server.url, "encode")
            assert e.value.code == "busy" and not waiting.done()
            await stream(first, [x])  # ends: its slot goes to the one waiting
            second = await waiting
            assert second.queued and second.queued[0]["position"] == 1
            # second holds the slot past --queue-timeout: a third waits it out, then is refused
            with pytest.raises(ServeError, match="no slot came free in 1 s of waiting") as e:
                await connect(server.url, "encode")
            return await stream(second, [x])

        assert np.array_equal(run(go()).codes()[0], ref_encode(mimi_codec, x, 4))


def test_a_slow_reader_is_warned_then_dropped_and_nobody_waits(tiny_mimi_export, tmp_path, mimi_codec):
    """Output waiting for a client past half of --max-backlog is a warning (ahead of the backlog it
    warns of); past all of it, the client is dropped. Another stream meanwhile is exact."""
    codes = np.random.default_rng(8).integers(0, mimi_codec.codebook_size, (4, 40000))
    with serving(tiny_mimi_export, tmp_path / "log", "--max-backlog", 1 << 18,
                 "--send-buffer", 4096) as server:
        def metrics() -> dict:
            text = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
            return {k: float(v) for k, v in re.findall(r"^codec_serve_(\S+) (\S+)$", text, re.MULTILINE)}

        # Warned: reads nothing until the warning, then everything; sends until then (however much
        # the buffers between the server and the client hold). At most 600 frames (58 KB of audio)
        # are ever waiting to be decoded, well under the half of the bound between the warning and
        # the drop: however late this process starts reading on a busy machine, it is not dropped.
        warned, sent = RawSocket(server.url, {"op": "decode"}), 0
        deadline = time.monotonic() + 30
        while not metrics()["behind_warnings_total"]:
            assert time.monotonic() < deadline, f"no warning after {sent} frames"
            if sent - metrics()['frames_total{side="decoder"}'] < 300 and sent < codes.shape[1]:
                warned.send(codes[:, sent:sent + 300].astype("<i4").tobytes())
                sent += 300
            time.sleep(0.005)
        warned.send(json.dumps({"op": "end"}))
        audio, texts, close = warned.rest()
        assert close == 1000 and texts[-1]["op"] == "done" and texts[:-1], texts
        assert all(t["op"] == "warning" and t["code"] == "behind" and t["backlog"] > 1 << 17
                   for t in texts[:-1])
        assert np.array_equal(audio, ref_decode(mimi_codec, codes[:, :sent]))

        # Dropped: never reads, while another stream runs.
        dropped = RawSocket(server.url, {"op": "decode"})
        for i in range(0, codes.shape[1], 2000):
            dropped.send(codes[:, i:i + 2000].astype("<i4").tobytes())
        quick = codes[:, :300]

        async def other():
            async with await connect(server.url, "decode") as c:
                return await stream(c, frame_chunks(quick, [50]))

        fast = run(other())
        assert np.array_equal(fast.audio(), ref_decode(mimi_codec, quick))
        deadline = time.monotonic() + 30
        while not metrics()["drops_total"]:
            assert time.monotonic() < deadline, "the slow reader was never dropped"
            time.sleep(0.01)
        _, texts, close = dropped.rest()
        assert close == CLOSE_CODES["behind"] and texts[-1]["code"] == "behind" and "read faster" in \
            texts[-1]["message"], texts


# ---- health, metrics, CLI -----------------------------------------------------------------------
def test_health_and_metrics(mimi):
    status, health = mimi.get("/health")
    assert status == 200 and health["ok"] and health["codec"] == "mimi"
    assert health["slots"]["total"] == 8 and health["pools"]["decoder"]["total"] == 8
    with pytest.raises(ServeError):
        run(connect(mimi.url, "encode", codebooks=9))
    status, text = mimi.get("/metrics")
    assert status == 200
    sample = re.compile(r'^codec_serve_[a-z_]+(\{[a-z]+="[^"]*"(,[a-z]+="[^"]*")*\})? [0-9.e+-]+$')
    assert all(sample.match(line) for line in text.splitlines() if not line.startswith("#")), text
    for name in ("slots", "active_slots", "frames_total", "step_seconds", "drops_total", "errors_total",
                 "busy_total"):
        assert f"# TYPE codec_serve_{name} " in text
    buckets = [int(v) for v in re.findall(r'^codec_serve_step_seconds_bucket\{side="encoder",'
                                          r'le="[^"]+"\} (\d+)$', text, re.MULTILINE)]
    count = int(re.search(r'^codec_serve_step_seconds_count\{side="encoder"\} (\d+)$', text,
                          re.MULTILINE).group(1))
    assert buckets == sorted(buckets) and buckets[-1] == count > 0
    assert re.search(r'^codec_serve_errors_total\{code="bad_request"\} [1-9]', text, re.MULTILINE)


def test_cli_errors_are_one_line(tiny_mimi_export, tmp_path):
    r = CliRunner().invoke(serve_cli, ["-m", str(tmp_path / "nothing")])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: "), r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = in_thread(CliRunner().invoke, serve_cli, ["-m", str(tiny_mimi_export), "--port", str(port)])
    assert r.exit_code == 1 and "cannot listen on 127.0.0.1" in r.stderr and \
        "Traceback" not in r.stderr, r.stderr


# ---- SIGTERM ------------------------------------------------------------------------------------
def test_sigterm_lets_streams_finish_then_exits_0(tiny_mimi_export, tmp_path, mimi_codec):
    x = noise(4000, seed=9)[0]
    with serving(tiny_mimi_export, tmp_path / "log", "--grace", 1) as server:
        async def go():
            finishing = await connect(server.url, "encode")
            lingering = await connect(server.url, "encode")
            await finishing.send_pcm(x[:2000])
            await lingering.send_pcm(x[:100])
            server.proc.send_signal(signal.SIGTERM)
            host, port = server.url[len("http://"):].split(":")

            async def refused() -> bool:
                try:
                    _, writer = await asyncio.open_connection(host, int(port))
                except ConnectionRefusedError:
                    return True
                writer.close()
                return False

            await until(refused, "the port stayed open after SIGTERM")
            with pytest.raises(ServeError, match="is codec-serve running there") as e:  # no longer accepting
                await connect(server.url, "encode")
            assert e.value.code == "unreachable"
            await finishing.send_pcm(x[2000:])
            await finishing.end()
            done = Result(finishing.info, [p async for p in finishing])
            await finishing.close()
            error = await closed_with(lingering, "shutting_down")  # past the grace time
            return done, error

        done, error = run(go())
        assert np.array_equal(done.codes()[0], ref_encode(mimi_codec, x, 4))
        assert "grace" in str(error)
        assert server.proc.wait(10) == 0
        assert b"stopped" in server.proc.stdout.read()


def test_a_stream_that_sends_nothing_gives_its_slot_back(tiny_mimi_export, tmp_path, mimi_codec):
    """--idle-timeout: a client that holds a slot and sends nothing (pings are not input) is ended
    (timeout), the slot free for the next; a client that ended its input may wait as long as its
    output takes. --handshake-timeout: a connection that sends no HTTP request, or no stream
    request, is closed."""
    x = noise(2000, seed=8)[0]
    with serving(tiny_mimi_export, tmp_path / "log", "--slots", 1, "--idle-timeout", 0.5,
                 "--handshake-timeout", 0.5) as server:
        async def pings(ws):
            while not ws.closed:
                await ws.ping()
                await asyncio.sleep(0.1)

        async def empties(c):
            with contextlib.suppress(ServeError):
                while True:
                    await c.send_raw(b"")
                    await asyncio.sleep(0.1)

        async def go():
            idle = await connect(server.url, "encode")
            pinging = asyncio.ensure_future(pings(idle.ws))
            assert "no input for 0.5 s" in str(await closed_with(idle, "timeout"))
            pinging.cancel()
            empty = await connect(server.url, "encode")  # empty messages are no input either
            sending = asyncio.ensure_future(empties(empty))
            assert "no input for 0.5 s" in str(await closed_with(empty, "timeout"))
            sending.cancel()
            async with aiohttp.ClientSession() as s, s.ws_connect(server.url + "/stream") as ws:
                pinging = asyncio.ensure_future(pings(ws))
                error = json.loads((await ws.receive(timeout=5)).data)
                pinging.cancel()
                assert error["code"] == "timeout" and "no request in 0.5 s" in error["message"]
            reader, writer = await asyncio.open_connection(*server.url[len("http://"):].split(":"))
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed: no request came
            writer.close()
            async with await connect(server.url, "encode") as again:
                return await stream(again, [x])

        got = run(go())
        assert np.array_equal(got.codes()[0], ref_encode(mimi_codec, x, 4))


def test_a_client_gone_while_its_input_waits_frees_its_slot_at_once(mimi_codec):
    """A client that sends faster than the engine steps is no longer read (its input waits); if
    it leaves meanwhile, its slot goes back after the step in flight, not after the engine has
    stepped through all it had sent. In process, the engine's steps held at a gate."""
    async def go():
        async with in_process(mimi_codec, max_message=4096) as (server, url):
            sched = server.scheduler
            with Gate(sched.pools["encoder"]) as gate:
                c = await connect(url, "encode")
                for _ in range(32):  # 64 KB: past the 16 KB the server takes before it stops reading
                    await c.send_pcm(np.zeros(512, np.float32))
                (live,) = sched.lives
                await until(lambda: not live.room.is_set(), "the server never stopped reading")
                await until(lambda: gate.started == 1, "no step reached the gate")
                await c.session.close()  # the socket closed with its input still waiting
                await until(lambda: not sched.lives, "the stream never left")
                assert server.health()["slots"]["active"] == 1  # its slot goes back after the step
                gate.let(1)
                await slots_freed(server)
                return gate.started

    assert run(go()) == 1  # it had sent a hundred steps: none ran after the one in flight


def test_a_client_the_server_stopped_reading_is_not_idle(mimi_codec):
    """A stream paused longer than --idle-timeout (the engine held, its input waiting) goes on
    when the engine does, every code exact. The time that passed is another stream's: one whose
    last input came after the pause began, ended for its idleness while the gate still holds."""
    x = noise(6144, seed=12)[0]

    async def go():
        async with in_process(mimi_codec, max_message=4096, idle_timeout=0.3) as (server, url):
            with Gate(server.scheduler.pools["encoder"]) as gate:
                clock = await connect(url, "decode")  # the decoder pool's slot: its own
                c = await connect(url, "encode")
                sending = asyncio.ensure_future(stream(c, [x[i:i + 512] for i in range(0, len(x), 512)]))
                paused = server.scheduler.lives[-1].room
                await until(lambda: not paused.is_set(), "the server never stopped reading")
                await clock.send_codes(np.zeros((clock.info["codebooks"], 1), np.int64))
                assert "no input for 0.3 s" in str(await closed_with(clock, "timeout"))
                assert not sending.done()
                gate.open()
                got = await sending
                await c.close()
                return got

    assert np.array_equal(run(go()).codes()[0], ref_encode(mimi_codec, x, 4))


def test_tiny_messages_meet_the_input_bound_and_a_client_gone_is_not_fed(mimi_codec):
    """Each waiting piece of input counts its cost beyond its data (`PIECE_BYTES`), so a client
    sending one sample a message is stopped being read after as few pieces as the bound allows,
    not after thousands. And a client that vanishes while aiohttp still holds messages it read
    frees its slot at once: those messages are not fed to the engine (they took 9.5 s of the
    server's CPU on the tiny Mimi before). The engine's steps held at a gate meanwhile."""
    from codecport.serve.live import PIECE_BYTES

    async def tiny_pieces():
        async with in_process(mimi_codec, max_message=4096) as (server, url):
            with Gate(server.scheduler.pools["encoder"]):
                c = await connect(url, "encode")
                for _ in range(400):
                    await c.send_pcm(np.zeros(1, np.float32))
                (live,) = server.scheduler.lives
                await until(lambda: not live.room.is_set(), "the server never stopped reading")
                waiting = len(live.pending["encoder"])
                await c.close()
                return waiting

    assert run(tiny_pieces()) <= 4 * 4096 // PIECE_BYTES + 1

    async def vanish():
        async with in_process(mimi_codec, max_message=4096) as (server, url):
            sched = server.scheduler
            with Gate(sched.pools["decoder"]) as gate:
                c = await connect(url, "decode")
                (live,) = sched.lives
                put, given = live.put_codes, []
                live.put_codes = lambda levels: (given.append(levels), put(levels))
                frame, sent = np.zeros((c.info["codebooks"], 1), np.int32).tobytes(), 0
                while live.room.is_set() or sent < 1000:  # small messages, past what the server reads
                    await c.send_raw(frame)
                    sent += 1
                    await asyncio.sleep(0)
                c.ws._response.connection.transport.abort()  # no close frame: the socket is gone
                # Its audio is what shows the server it is gone (a write fails): a step at a time.
                while sched.lives:
                    started = gate.started
                    gate.let(1)
                    await until(lambda n=started: gate.started > n or not sched.lives, "no step")
                return sent, len(given)

    sent, given = run(vanish())
    assert given < sent, (given, sent)  # what aiohttp still held once it was gone was not taken in


def test_a_message_that_would_grow_past_the_bound_when_resampled_is_refused(mimi):
    async def go():
        c = await connect(mimi.url, "encode", sample_rate=1000)  # 24 times up to the model's rate
        # 40 KB here, under --max-message 65536; 960 KB at 24 kHz, past its input bound (4 x that)
        await c.send_pcm(np.zeros(10_000, np.float32))
        return await closed_with(c, "too_large")

    assert "samples a message" in str(run(go()))


def test_a_folder_whose_step_graphs_hold_no_batch_rows_is_refused(tiny_snac_export, tmp_path):
    """A SNAC folder of codecport 0.3 held a window graph as its step decoder: it still streams
    in the library, but a server cannot keep its streams in slots, and says so at startup."""
    folder = copy_folder(tiny_snac_export, tmp_path / "old")
    for name in ("decoder_step", "decoder_slots"):
        (folder / f"{name}.onnx").unlink()
    window = onnx.load(str(folder / "decoder.onnx"))  # a window graph, as 0.3 wrote it
    meta = {p.key: p.value for p in window.metadata_props}
    meta.update(mode="step", step_frames=meta["unit_frames"])
    del window.metadata_props[:]
    for k, v in meta.items():
        window.metadata_props.add(key=k, value=v)
    onnx.save(window, str(folder / "decoder_step.onnx"))
    codec = codecport.load(folder)
    assert not codec.stateful_steps and codec.decode_stream(noise=0).push(
        [np.zeros(1, np.int64), np.zeros(2, np.int64), np.zeros(4, np.int64)]).dtype == np.float32
    proc = subprocess.run([str(BIN / "codec-serve"), "-m", str(folder), "--port", "0"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "re-export the folder to serve it" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ---- a codec whose stream runs whole windows (NeuCodec) -------------------------------------------
@pytest.fixture(scope="module")
def neucodec(smoke_exports, tmp_path_factory):
    with serving(smoke_exports["neucodec"], tmp_path_factory.mktemp("serve") / "neucodec.log",
                 "--slots", 2) as s:
        yield s


def test_neucodec_streams_are_served_through_their_windows(neucodec, smoke_exports):
    """NeuCodec has no step graph (its model attends to a whole window): its decoder stream runs
    the windowed mode's windows, and the server runs each slot's through it. Two streams at once,
    in uneven pieces, each get exactly what the runtime's stream alone gives (the decode of their
    whole sequence: windowed past one window, the fixed graph within one); the ready reply
    states the windows' rhythm and latency."""
    codec = codecport.load(smoke_exports["neucodec"])
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, codec.codebook_size, (1, n)) for n in (3 * codec.frames + 7, codec.frames - 4)]

    async def one(codes, sizes):
        async with await connect(neucodec.url, "decode") as c:
            assert c.info["step_frames"] == {"decoder": codec.frames - codec.overlap}
            assert c.info["latency"]["decoder"]["frames"] == codec.frames - 1
            return await stream(c, frame_chunks(codes, sizes))

    async def go():
        return await asyncio.gather(one(seqs[0], [5, 1, 30]), one(seqs[1], [7]))

    for got, codes in zip(run(go()), seqs):
        want = ref_decode(codec, codes)
        assert want.size == codes.shape[1] * codec.frame_size
        assert np.array_equal(got.audio(), want.astype(np.float32))
        np.testing.assert_allclose(want, codec.decode(codes)[0][0], atol=1e-6)
    status, health = neucodec.get("/health")
    assert status == 200 and health["pools"] == {"decoder": {"total": 2, "active": 0, "batch": 1}}


def test_neucodec_refuses_what_it_cannot_stream_and_bad_codes_end_that_stream_only(neucodec, smoke_exports):
    codec = codecport.load(smoke_exports["neucodec"])
    codes = np.random.default_rng(5).integers(0, codec.codebook_size, (1, 2 * codec.frames))

    async def go():
        with pytest.raises(ServeError, match="decoder") as e:
            await connect(neucodec.url, "encode")
        assert e.value.code == "bad_request"
        bystander = await connect(neucodec.url, "decode")
        await bystander.send_codes(codes[:, :codec.frames + 3])
        c = await connect(neucodec.url, "decode")
        await c.send_codes(np.full((1, 4), codec.codebook_size, np.int64))  # one past the codebook
        assert f"codes must be in [0, {codec.codebook_size})" in str(await closed_with(c, "bad_input"))
        await bystander.send_codes(codes[:, codec.frames + 3:])
        await bystander.end()
        got = Result(bystander.info, [p async for p in bystander])
        await bystander.close()
        return got

    assert np.array_equal(run(go()).audio(), ref_decode(codec, codes).astype(np.float32))


def test_a_folder_without_streams_is_refused_in_one_line(smoke_exports):
    r = CliRunner().invoke(serve_cli, ["-m", str(smoke_exports["dac"])])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "DAC has no encoder or decoder stream" in r.stderr and "codec-run" in r.stderr, r.stderr


def test_the_queue_is_kept_by_sides(mimi_codec):
    """A stream waits only for those queued before it that need a side it needs: with the one
    decoder slot taken and a decode stream queued for it, an encode stream gets the free encoder
    slot at once (it waited the whole --queue-timeout before); a duplex stream queued for the
    decoder holds the encoder slot for itself, so a later encode stream waits behind it. And
    /health's batch is what --slots allows, not the folder's largest slot graph."""
    x = noise(2000, seed=8)[0]

    async def go():
        async with in_process(mimi_codec, queue=3, queue_timeout=5) as (server, url):
            # the folder's slot graphs step 3 slots a call, but one slot is all --slots 1 has
            assert {p["batch"] for p in server.health()["pools"].values()} == {1}
            holder = await connect(url, "decode")
            waiting = asyncio.ensure_future(connect(url, "decode"))
            await until(lambda: server.health()["queued"] == 1, "the decode stream was never queued")
            async with await connect(url, "encode") as enc:  # not queued behind the decode stream
                assert not enc.queued and not waiting.done()
                got = await stream(enc, [x])
            await holder.close()
            await (await waiting).close()
            await slots_freed(server)

            holder = await connect(url, "decode")
            duplex = asyncio.ensure_future(connect(url, "duplex"))
            await until(lambda: server.health()["queued"] == 1, "the duplex stream was never queued")
            encode = asyncio.ensure_future(connect(url, "encode"))
            # the encoder slot is free, but the duplex stream waits for it: the encode stream queues
            await until(lambda: server.health()["queued"] == 2, "the encode stream was never queued")
            assert not encode.done()
            await holder.close()
            first = await duplex
            assert not encode.done()  # the duplex stream took the encoder slot before it
            await first.close()
            second = await encode
            assert second.queued and second.queued[0]["position"] == 2
            await second.close()
            return got

    assert np.array_equal(run(go()).codes()[0], ref_encode(mimi_codec, x, 4))
