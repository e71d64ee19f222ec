"""`codec-bench serve --abuse SECONDS`: what a client that does not play by the rules costs a
server, on each engine: the resident memory of each of its processes by role (procs.py: the
local server; Serve's proxy and the replica on Ray) before and at its peak while

- a flooding client sends PCM as fast as the connection takes it for SECONDS (64 KiB messages,
  reading all it is sent): how much went in (a server that reads it all takes gigabytes), and
  how its stream ended (slowed by TCP: still open; or told, with the error's code);
- a slow reader sends its input (codes of a decode stream, or PCM) and reads nothing, on a 4 KiB
  receive buffer, for up to SECONDS: how much output it was sent before the server dropped it
  (`behind`), and how long that took.

Run it with the engines side by side (`--engine local --engine ray`): the local server is the
control, the cluster path must hold the same bounds.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import urlsplit

import click
import numpy as np

from . import procs
from .load import open_folder

CHUNK = 64 << 10  # bytes of a flooding message


def run(configs, seconds: float, period: float) -> dict:
    """A flooding client, then a slow reader, on each of `configs`' servers (bench/serve.py's
    Config: url, proc, engine, folder) in turn; `period`: seconds of a coarse code frame."""
    from ..serve.protocol import CodeLayout

    codec = open_folder(configs[0].folder)
    layout = CodeLayout.of(codec, codec.codebooks(None))
    out = {}
    for cfg in configs:
        click.echo(f"  {cfg.name}: a flooding client for {seconds:g} s, then a slow reader ...")
        out[cfg.name] = {
            "flood": asyncio.run(flood(cfg.url, codec.streams, seconds, cfg.proc.pid, cfg.engine)),
            "slow_reader": slow_reader(cfg.url, codec.streams, seconds, cfg.proc.pid, cfg.engine, layout,
                                       1 / period)}
    return out


def lines(abused: dict) -> list[str]:
    """The report's lines: each configuration's two clients, and what each process grew by."""
    out = []
    for name, a in abused.items():
        f, r = a["flood"], a["slow_reader"]

        def grown(d: dict) -> str:
            return ", ".join(f"{role} +{mb:.0f}" for role, mb in d.items() if role != "node")

        out.append(f"{name}: flood ({f['op']}, {f['seconds']:g} s): {f['sent_mib']:.1f} MiB went in, "
                   f"{f['ended']}; peak RSS MB {grown(f['rss_grown_mb'])}")
        out.append(f"{name}: slow reader: {r['ended']} after {r['seconds']:g} s, "
                   f"{r['output_kib_sent']:.0f} KiB sent to it; peak RSS MB {grown(r['rss_grown_mb'])}")
    return out


def _peak(pids: dict[str, list[int]], peak: dict[str, float]) -> None:
    for role, p in pids.items():
        peak[role] = max(peak.get(role, 0.0), procs.rss_mb(p))


async def flood(url: str, spec_streams: tuple[str, ...], seconds: float, server_pid: int,
                engine: str) -> dict:
    """A client sending PCM as fast as it is taken for `seconds`, reading everything back."""
    import aiohttp

    op = "duplex" if "encoder" in spec_streams and "decoder" in spec_streams else "encode"
    pids = procs.roles(server_pid, engine)
    base = {role: procs.rss_mb(p) for role, p in pids.items()}
    peak = dict(base)
    chunk = (np.random.default_rng(0).standard_normal(CHUNK // 4) * 0.1).astype("<f4").tobytes()
    sent, error, loop = 0, None, asyncio.get_running_loop()
    async with aiohttp.ClientSession() as s, s.ws_connect(url.replace("http", "ws", 1) + "/stream",
                                                          compress=0, max_msg_size=0) as ws:
        await ws.send_str(json.dumps({"op": op}))
        await ws.receive()

        async def read():
            nonlocal error
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data).get("op") == "error":
                    error = json.loads(msg.data)["code"]

        reader = asyncio.ensure_future(read())
        t0 = loop.time()
        deadline = t0 + seconds
        while (left := deadline - loop.time()) > 0 and error is None and not ws.closed:
            try:
                await asyncio.wait_for(ws.send_bytes(chunk), left)
            except (asyncio.TimeoutError, ConnectionError):
                break
            sent += len(chunk)
            if sent % (8 * CHUNK) == 0:
                _peak(pids, peak)
        _peak(pids, peak)
        reader.cancel()
    return {"op": op, "seconds": seconds, "sent_mib": sent / 2**20, "mib_per_s": sent / 2**20 / seconds,
            "ended": error or "slowed", "rss_base_mb": base, "rss_peak_mb": peak,
            "rss_grown_mb": {r: peak[r] - base[r] for r in base}}


def slow_reader(url: str, spec_streams: tuple[str, ...], seconds: float, server_pid: int, engine: str,
                layout, frame_rate: float) -> dict:
    """A stream whose client sends input for a minute of output at once (codes in `layout`, a
    CodeLayout, at `frame_rate` coarse frames a second), then reads nothing (a 4 KiB receive
    buffer) until the server drops it (its /metrics say so) or `seconds` pass; then what it had
    been sent, and how the stream ended."""
    pids = procs.roles(server_pid, engine)
    base = {role: procs.rss_mb(p) for role, p in pids.items()}
    peak = dict(base)
    parts = urlsplit(url)
    drops = _drops(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    _upgrade(sock, parts.netloc)
    decode = "decoder" in spec_streams
    _send(sock, json.dumps({"op": "decode" if decode else "duplex"}).encode(), 1)
    _read_frame(sock)  # ready
    rng = np.random.default_rng(1)
    if decode:
        frames = int(60 * frame_rate)
        for i in range(0, frames, 500):
            n = min(500, frames - i)
            levels = [rng.integers(0, layout.codebook_size, (rows, n * per)) for rows, per in layout.levels]
            _send(sock, layout.pack(levels), 2)
    else:  # a duplex stream's audio comes back as its codes' decoding
        for _ in range(16):
            _send(sock, (rng.standard_normal(CHUNK // 4) * 0.1).astype("<f4").tobytes(), 2)
    _send(sock, json.dumps({"op": "end"}).encode(), 1)  # all its input is in: never idle-timed out
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds and _drops(url) == drops:
        _peak(pids, peak)
        time.sleep(0.1)
    took = time.monotonic() - t0
    got, code, closed = 0, None, False
    try:
        while True:
            op, payload = _read_frame(sock)
            if op == 2:
                got += len(payload)
            elif op == 1 and json.loads(payload).get("op") in ("error", "done"):
                message = json.loads(payload)
                code = message.get("code", message["op"])
            elif op == 8:
                closed = True
                break
    except OSError:
        pass
    sock.close()
    # A client that reads nothing answers no ping either: the server's keepalive may cut it first.
    ended = code or ("closed without an error" if closed else "cut off (no close: it answered no ping)")
    return {"seconds": round(took, 1), "ended": ended, "output_kib_sent": got / 1024,
            "rss_base_mb": base, "rss_peak_mb": peak, "rss_grown_mb": {r: peak[r] - base[r] for r in base}}


def _drops(url: str) -> float:
    """Slow readers the server dropped so far (its /metrics, summed over replicas)."""
    import re
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:  # noqa: S310 (the bench's own server)
        text = r.read().decode()
    found = re.findall(r"^codec_serve_drops_total(?:{[^}]*})? (\S+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


def _upgrade(sock: socket.socket, host: str) -> None:
    import base64
    import os

    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET /stream HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            raise ConnectionError("the server closed the connection before the upgrade")
        head += chunk


def _send(sock: socket.socket, data: bytes, op: int) -> None:
    import os
    import struct

    n = len(data)
    size = bytes([0x80 | n]) if n < 126 else (bytes([0x80 | 126]) + struct.pack(">H", n) if n < 1 << 16
                                             else bytes([0x80 | 127]) + struct.pack(">Q", n))
    mask = os.urandom(4)
    body = np.frombuffer(data, np.uint8) ^ np.resize(np.frombuffer(mask, np.uint8), n)
    sock.sendall(bytes([0x80 | op]) + size + mask + body.tobytes())


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    import struct

    def exactly(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    b0, b1 = exactly(2)
    n = b1 & 0x7F
    if n >= 126:
        n = struct.unpack(">H" if n == 126 else ">Q", exactly(2 if n == 126 else 8))[0]
    return b0 & 0x0F, exactly(n)
