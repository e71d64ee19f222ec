"""What the codec-serve tests share: a server as a user runs it (a process of its own on
127.0.0.1, `--port 0`, the printed URL parsed), the client in a thread, and the references."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from codecport.serve import ServeError
from codecport.serve.protocol import CLOSE_CODES

BIN = Path(sys.executable).parent


def in_thread(fn, *args):
    """`fn(*args)` on a thread of its own: a file before this one in the same pytest worker may
    leave an event loop running on the main thread (Playwright's, for the browser tests), and
    asyncio.run refuses to start under it."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *args).result()


class Served:
    """A `codec-serve` process and its URL."""

    def __init__(self, proc: subprocess.Popen, url: str, log: Path):
        self.proc, self.url, self.log = proc, url, log

    def get(self, path: str):
        return in_thread(asyncio.run, get_json(self.url + path))


async def get_json(url: str):
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else await r.text())


@contextlib.contextmanager
def serving(folder: Path, log: Path, *args):
    """`codec-serve -m folder --port 0 ARGS`, stopped (SIGTERM) on exit."""
    with open(log, "w") as err:
        proc = subprocess.Popen([str(BIN / "codec-serve"), "-m", str(folder), "--port", "0", *map(str, args)],
                                stdout=subprocess.PIPE, stderr=err, bufsize=0)
    try:
        yield Served(proc, _url(proc, log), log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()


def _url(proc: subprocess.Popen, log: Path, timeout: float = 60) -> str:
    """The URL the server prints, read from its stdout as it comes (unbuffered, by select)."""
    deadline, seen = time.monotonic() + timeout, b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            seen += chunk
            if m := re.search(rb"listening on (http://127\.0\.0\.1:\d+)", seen):
                return m.group(1).decode()
            if not chunk and proc.poll() is not None:
                break
    raise AssertionError(f"codec-serve did not start: {seen.decode()}{log.read_text()}")


@contextlib.asynccontextmanager
async def in_process(codec, **config):
    """codec-serve for `codec` in this process on a free port (one slot, no heartbeat, unless
    `config` says otherwise), so a test can reach its scheduler: (server, url)."""
    from codecport.serve.server import ServeConfig, Server

    server = Server(codec, ServeConfig(**{"slots": 1, "port": 0, "heartbeat": None, **config}))
    url = await server.start()
    try:
        yield server, url
    finally:
        await server.close()


async def slots_freed(server, timeout: float = 20) -> tuple[float, int]:
    """Seconds until `server` holds no slot (at most `timeout`), and the slots still held then."""
    start = time.monotonic()
    while server.health()["slots"]["active"] and time.monotonic() - start < timeout:
        await asyncio.sleep(0.05)
    return time.monotonic() - start, server.health()["slots"]["active"]


def run(coro):
    return in_thread(asyncio.run, asyncio.wait_for(coro, 60))


def chunks(x, sizes) -> list:
    """`x` cut into pieces of the given sizes, cycled (uneven on purpose)."""
    out, i, k = [], 0, 0
    while i < len(x):
        n = sizes[k % len(sizes)]
        out.append(x[i:i + n])
        i, k = i + n, k + 1
    return out


def ref_encode(codec, pcm, k: int) -> np.ndarray:
    s = codec.encoder_stream(k)
    return np.concatenate([s.push(pcm), s.flush()], axis=1)


def ref_decode(codec, codes, **kw) -> np.ndarray:
    """The audio a server gives for `codes`: the stream alone in a pool of one slot, one step a
    call. That is a decoder stream of its own within float rounding (checked here): Mimi's slot
    graphs keep attention as rings, summed in another order than the step graph's window."""
    from codecport.runtime.slots import open_pool

    s = codec.decoder_stream(**kw)
    alone = np.concatenate([s.push(codes), s.flush()])
    pool = open_pool(codec, "decoder", 1, batched=False)
    slot = pool.open(**kw)
    slot.feed(codes)
    slot.end()
    out = []
    while not slot.finished:
        pieces, failed = pool.step([slot])
        assert not failed
        out.append(pieces[slot])
    got = np.concatenate(out)
    np.testing.assert_allclose(got, alone, rtol=0, atol=1e-5)
    return got


def frame_chunks(codes: np.ndarray, sizes) -> list:
    out, i, k = [], 0, 0
    while i < codes.shape[1]:
        out.append(codes[:, i:i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    return out


async def closed_with(client, code: str) -> ServeError:
    """The error a stream ends with; the server closes the connection after it."""
    with pytest.raises(ServeError) as e:
        while await client.receive(timeout=10) is not None:
            pass
    assert e.value.code == code, e.value
    msg = await client.ws.receive(timeout=10)
    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING), msg
    if msg.type is aiohttp.WSMsgType.CLOSE:
        assert msg.data == CLOSE_CODES[code]
    await client.close()
    return e.value
