"""What the codec-serve tests share: a server as a user runs it (a process of its own on
127.0.0.1, `--port 0`, the printed URL parsed), the client in a thread, a bare WebSocket client,
the references, and what the tests wait on: a condition (`until`) or a held step (`Gate`),
never a sleep or a measured time."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
import os
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

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


async def until(condition, what: str, timeout: float = 30) -> None:
    """Until `condition()` (a function, or a coroutine function) is true, looked at every 10 ms:
    the wait for an event that must come. `timeout` is a bound on a hang, far past what any
    machine takes, never a measured time; past it, AssertionError saying `what` never came."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not in {timeout:g} s")
        await asyncio.sleep(0.01)


async def slots_freed(server) -> None:
    """Until an in-process `server` holds no slot."""
    await until(lambda: not server.health()["slots"]["active"], "the slots never went back")


class Gate:
    """Holds the steps of one pool of an in-process server: each waits (on the step thread, the
    event loop going on) until `let(n)` lets n through, or `open()` all. `started`: steps that
    reached the gate. A context manager that opens it on exit, so the server can stop."""

    def __init__(self, pool):
        self.pool, self._real = pool, pool.step
        self._passes = threading.Semaphore(0)
        self._open = False
        self.started = 0
        pool.step = self._step

    def _step(self, slots):
        self.started += 1
        if not self._open:
            self._passes.acquire()
        return self._real(slots)

    def let(self, n: int = 1) -> None:
        for _ in range(n):
            self._passes.release()

    def open(self) -> None:
        self._open = True
        self.let(1 << 16)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.open()


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


class RawSocket:
    """A WebSocket client on a bare blocking socket with a 4 kB receive buffer, set before it
    connects: a reader that reads nothing holds nothing (aiohttp's client would read ahead and
    queue half a megabyte on its own). It sends `request` (unless None) and reads the reply into
    `info`; `headers` go with the upgrade request (an Origin, another Host)."""

    def __init__(self, url: str, request: dict | None, timeout: float = 30, headers: dict | None = None):
        parts = urlsplit(url)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(timeout)
        self.sock.connect((parts.hostname, parts.port))
        key = base64.b64encode(os.urandom(16)).decode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in {"Host": parts.netloc, **(headers or {})}.items())
        self.sock.sendall(f"GET /stream HTTP/1.1\r\n{extra}Upgrade: websocket\r\n"
                          f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                          "Sec-WebSocket-Version: 13\r\n\r\n".encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            self.buf += chunk
        self.head, self.buf = self.buf.split(b"\r\n\r\n", 1) if b"\r\n\r\n" in self.buf else (self.buf, b"")
        if request is not None:
            assert self.head.startswith(b"HTTP/1.1 101"), self.head
            self.send(json.dumps(request))
            self.info = json.loads(self.recv()[1])

    def send(self, data: bytes | str, masked: bool = True) -> None:
        """A whole message in one frame, masked as a client's must be (unless `masked=False`)."""
        op, data = (1, data.encode()) if isinstance(data, str) else (2, data)
        n, bit = len(data), 0x80 if masked else 0
        if n < 126:
            size = bytes([bit | n])
        else:
            size = bytes([bit | 126]) + struct.pack(">H", n) if n < 1 << 16 else \
                bytes([bit | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4) if masked else b""
        body = np.frombuffer(data, np.uint8) ^ np.resize(np.frombuffer(mask or b"\0", np.uint8), n)
        self.sock.sendall(bytes([0x80 | op]) + size + mask + body.tobytes())

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv(self) -> tuple[int, bytes]:
        """(opcode, payload) of the next frame: 1 text, 2 binary, 8 close."""
        b0, b1 = self._read(2)
        n = b1 & 0x7F
        if n >= 126:
            n = struct.unpack(">H" if n == 126 else ">Q", self._read(2 if n == 126 else 8))[0]
        return b0 & 0x0F, self._read(n)

    def rest(self) -> tuple[np.ndarray, list[dict], int]:
        """(audio, text messages, close code) of everything up to the close."""
        audio, texts = [], []
        while True:
            op, data = self.recv()
            if op == 2:
                audio.append(np.frombuffer(data, "<f4"))
            elif op == 1:
                texts.append(json.loads(data))
            elif op == 8:
                self.sock.close()
                return np.concatenate(audio) if audio else np.zeros(0, np.float32), texts, \
                    struct.unpack(">H", data[:2])[0]
