"""The `codec-serve` client (asyncio, aiohttp): what the tests, the load generator and users share.

    async with await connect("ws://127.0.0.1:8000/stream", "encode", sample_rate=16000) as s:
        await s.send_pcm(pcm)                 # float samples (or int16 with pcm="s16")
        await s.end()
        async for piece in s:                 # Piece: kind, data, t (time.perf_counter())
            ...
    codes = await encode(url, pcm, 16000)     # the whole round trip, in one call

`StreamClient.info` is the server's ready reply (the codec's facts); each received `Piece`
carries the time it arrived, each `send_*` returns the time it was sent. Sending and receiving
may run in two tasks at once (`stream()` does, pacing the input in real time if asked).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import numpy as np

from .protocol import PCM_FORMATS, TAG_AUDIO, TAG_CODES, CodeLayout, ProtocolError, pcm_to_bytes


class ServeError(ProtocolError):
    """The server refused or ended the stream: `code` (busy, bad_request, bad_input, too_large,
    too_fast, behind, timeout, shutting_down, internal; "closed" when it closed without a word or the
    connection broke, "unreachable" when no codec-serve stream answered at the URL) and its
    message. A `CodecportError`, as every codecport error."""


def _reply(text: str) -> dict:
    """A text message of the server's as JSON; its error as `ServeError`."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ServeError("bad_request", f"the server sent a text message that is not the protocol's JSON: "
                                        f"{text[:80]!r}; is the URL a codec-serve stream?")
    if data.get("op") == "error":
        raise ServeError(str(data.get("code", "internal")), str(data.get("message", "")))
    return data


@dataclass(frozen=True)
class Piece:
    """One output message: `kind` "codes" (`data`: one int64 `[codebooks, frames_l]` array per
    level) or "audio" (`data`: float32 samples at the model's rate), and `t`, its arrival."""

    kind: str
    data: list[np.ndarray] | np.ndarray
    t: float
    nbytes: int


# What codec-serve refuses before the upgrade (docs/serve.md, Deployment), by HTTP status.
REFUSED = {421: "it answers to the address it listens on, localhost and 127.0.0.1 only; connect by one of "
                "them",
           403: "this page's Origin is not one it allows (codec-serve --allow-origin)"}


def stream_url(url: str) -> str:
    """`ws://host:port/stream` from a server's URL (http:// or ws://, with or without the path)."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path if parts.path not in ("", "/") else "/stream"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))


class StreamClient:
    """One stream on a `codec-serve` server; make it with `connect`."""

    def __init__(self, session: aiohttp.ClientSession, ws, owns_session: bool):
        self.session, self.ws, self._owns = session, ws, owns_session
        self.info: dict = {}  # the ready reply
        self.queued: list[dict] = []  # queue notices before it
        self.warnings: list[dict] = []  # "behind" warnings
        self.done: dict | None = None  # the done message, once received
        self.layout: CodeLayout | None = None

    async def _handshake(self, request: dict, timeout: float | None) -> None:
        await self._send(json.dumps(request))
        while True:
            msg = await self._next_text(timeout)
            if msg["op"] == "queued":
                self.queued.append(msg)
            elif msg["op"] == "ready":
                self.info = msg
                self.layout = CodeLayout(tuple(map(tuple, msg["code_layout"])), msg["codebook_size"])
                return
            else:
                raise ServeError("bad_request", f"unexpected reply to the handshake: {msg}")

    async def _receive(self, timeout: float | None):
        try:
            return await self.ws.receive(timeout=timeout)
        except asyncio.TimeoutError:
            raise ServeError("timeout", f"nothing from the server in {timeout:g} s") from None

    async def _next_text(self, timeout: float | None) -> dict:
        msg = await self._receive(timeout)
        if msg.type is aiohttp.WSMsgType.TEXT:
            return _reply(msg.data)
        raise self._gone(msg)

    def _gone(self, msg) -> ServeError:
        if msg.type is aiohttp.WSMsgType.BINARY:
            return ServeError("bad_request", "binary data before the ready reply")
        code = self.ws.close_code
        if code in (None, 1006) or msg.type is aiohttp.WSMsgType.ERROR:
            # No close frame: the process that held the stream is gone (a server or a Ray replica
            # killed, a node lost, a proxy restarted) or the network cut; nothing of it is left.
            return ServeError("closed", "the connection dropped without a close from the server (1006): "
                                        "the server, or the replica holding this stream, died or was cut "
                                        "off; the stream is lost: connect again and resend from the start")
        return ServeError("closed", f"the server closed the stream ({msg.type.name}, close code {code})")

    # ---- sending ------------------------------------------------------------------------------
    async def _send(self, data: bytes | str) -> None:
        try:
            await (self.ws.send_str(data) if isinstance(data, str) else self.ws.send_bytes(data))
        except (ConnectionError, aiohttp.ClientError) as e:
            raise ServeError("closed", f"the connection to the server broke ({e}); "
                                       f"its close code: {self.ws.close_code}") from None

    async def send_pcm(self, samples: np.ndarray) -> float:
        """Send mono samples (float in [-1, 1], converted to the stream's format; or int16 as
        they are, for `pcm="s16"`); returns the time sent."""
        samples = np.asarray(samples)
        fmt = self.info["pcm"]
        if samples.dtype == np.int16:
            data = samples.astype("<i2").tobytes() if fmt == "s16" else \
                pcm_to_bytes(samples.astype(np.float32) / 32768, fmt)
        else:
            data = pcm_to_bytes(samples.astype(np.float32, copy=False), fmt)
        await self._send(data)
        return time.perf_counter()

    async def send_codes(self, codes: np.ndarray | Sequence[np.ndarray]) -> float:
        """Send code frames: `[codebooks, frames]` (one level), or one array per level (each
        `[codebooks, frames_l]` or `[frames_l]`); returns the time sent."""
        levels = [codes] if isinstance(codes, np.ndarray) else list(codes)
        await self._send(self.layout.pack([np.atleast_2d(a) for a in levels]))
        return time.perf_counter()

    async def send_raw(self, data: bytes | str) -> None:
        """A message as it is (the tests' malformed ones)."""
        await self._send(data)

    async def end(self) -> float:
        """End the input: the server sends the rest, then done."""
        await self._send(json.dumps({"op": "end"}))
        return time.perf_counter()

    # ---- receiving ----------------------------------------------------------------------------
    async def receive(self, timeout: float | None = None) -> Piece | None:
        """The next output piece, or None once done; warnings are kept in `warnings`; an error
        raises `ServeError`."""
        if self.done is not None:
            return None
        while True:
            msg = await self._receive(timeout)
            t = time.perf_counter()
            if msg.type is aiohttp.WSMsgType.BINARY:
                return self._piece(msg.data, t)
            if msg.type is not aiohttp.WSMsgType.TEXT:
                raise self._gone(msg)
            data = _reply(msg.data)
            if data.get("op") == "done":
                self.done = data
                return None
            if data.get("op") == "warning":
                self.warnings.append({**data, "t": t})

    def _piece(self, data: bytes, t: float) -> Piece:
        op = self.info["stream"]
        kind = "codes" if op == "encode" else "audio"
        body = data
        if op == "duplex":
            tag, body = data[:4], data[4:]
            kind = {TAG_CODES: "codes", TAG_AUDIO: "audio"}.get(tag)
            if kind is None:
                raise ServeError("bad_request", f"a duplex message with an unknown tag {tag!r}")
        if kind == "codes":
            return Piece(kind, self.layout.unpack(body), t, len(data))
        dtype = PCM_FORMATS[self.info["pcm"]]
        audio = np.frombuffer(body, dtype)
        audio = audio.astype(np.float32) / 32768 if self.info["pcm"] == "s16" else audio.astype(np.float32)
        return Piece(kind, audio, t, len(data))

    async def __aiter__(self) -> AsyncIterator[Piece]:
        while (piece := await self.receive()) is not None:
            yield piece

    async def close(self) -> None:
        await self.ws.close()
        if self._owns:
            await self.session.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


async def connect(url: str, op: str, *, pcm: str = "f32", sample_rate: int | None = None,
                  codebooks: int | None = None, noise: int | str | None = None,
                  session: aiohttp.ClientSession | None = None, timeout: float | None = 30.0,
                  max_msg_size: int = 64 << 20) -> StreamClient:
    """Open a stream (`op`: encode, decode or duplex) and wait for the ready reply (through the
    queue, if the server has one); a refusal raises `ServeError`. `session`: one to share
    (many streams of a load generator); else the stream makes and closes its own."""
    request = {"op": op, "pcm": pcm}
    for key, value in (("sample_rate", sample_rate), ("codebooks", codebooks), ("noise", noise)):
        if value is not None:
            request[key] = value
    owns = session is None
    session = session or aiohttp.ClientSession()
    try:
        ws = await _open(session, url, max_msg_size)
        client = StreamClient(session, ws, owns)
        try:
            await client._handshake(request, timeout)
        except BaseException:
            await ws.close()
            raise
    except BaseException:
        if owns:
            await session.close()
        raise
    return client


async def _open(session: aiohttp.ClientSession, url: str, max_msg_size: int):
    """The WebSocket of `url`'s stream endpoint; what stands in the way as a `ServeError`."""
    where = stream_url(url)
    if urlsplit(where).scheme not in ("ws", "wss"):
        raise ServeError("bad_request", f"{url!r} is not a server URL; give http://HOST:PORT (or ws://)")
    try:
        return await session.ws_connect(where, max_msg_size=max_msg_size, autoping=True)
    except aiohttp.WSServerHandshakeError as e:
        if e.status in REFUSED:
            raise ServeError("bad_request", f"{where} refused the connection (HTTP {e.status}): "
                                            f"{REFUSED[e.status]}") from None
        raise ServeError("unreachable", f"{where} answered HTTP {e.status}, not a WebSocket stream; give "
                                        "codec-serve's URL (http://HOST:PORT)") from None
    except (aiohttp.InvalidURL, ValueError) as e:
        raise ServeError("bad_request", f"{url!r} is not a server URL ({e}); give http://HOST:PORT") from None
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        raise ServeError("unreachable", f"cannot connect to {where} ({e or type(e).__name__}); is "
                                        "codec-serve running there?") from None


@dataclass
class Result:
    """What a whole stream gave: its pieces (with arrival times), the send times, the replies."""

    info: dict
    pieces: list[Piece] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)  # perf_counter() of each input message
    done: dict | None = None
    warnings: list[dict] = field(default_factory=list)

    def codes(self) -> list[np.ndarray]:
        """Every codes piece joined: one `[codebooks, frames_l]` array per level."""
        got = [p.data for p in self.pieces if p.kind == "codes"]
        if not got:
            return [np.zeros((rows, 0), np.int64) for rows, _ in self.info["code_layout"]]
        return [np.concatenate(lv, axis=1) for lv in zip(*got)]

    def audio(self) -> np.ndarray:
        """Every audio piece joined (float32, the model's rate)."""
        got = [p.data for p in self.pieces if p.kind == "audio"]
        return np.concatenate(got) if got else np.zeros(0, np.float32)


async def stream(client: StreamClient, chunks: Iterable | AsyncIterable, *, interval: float | None = None,
                 result: Result | None = None) -> Result:
    """Send `chunks` (PCM arrays, or codes as `send_codes` takes them) then end, while receiving
    everything; `interval`: seconds between chunks (real-time pacing), None as fast as it goes.
    `chunks` may be an async iterable (a model's output as it comes). `result`: the Result to
    fill as pieces arrive (to watch a stream in flight); a new one by default."""
    result = result if result is not None else Result(client.info)
    send = client.send_codes if client.info["stream"] == "decode" else client.send_pcm

    async def each():
        if isinstance(chunks, AsyncIterable):
            async for chunk in chunks:
                yield chunk
        else:
            for chunk in chunks:
                yield chunk

    async def sender() -> None:
        start, i = time.perf_counter(), 0
        async for chunk in each():
            if interval:
                await asyncio.sleep(max(0.0, start + i * interval - time.perf_counter()))
            result.sent.append(await send(chunk))
            i += 1
        await client.end()

    task = asyncio.ensure_future(sender())
    try:
        async for piece in client:
            result.pieces.append(piece)
        await task
    finally:
        if not task.done():
            task.cancel()
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # the receive side's error is the one raised; the sender's is seen
    result.done, result.warnings = client.done, client.warnings
    return result


def _chunks(x, n: int) -> list:
    return [x[i:i + n] for i in range(0, len(x), n)] or [x[:0]]


async def encode(url: str, pcm: np.ndarray, sample_rate: int, *, chunk: int = 4096, **kw) -> list[np.ndarray]:
    """The codes of `pcm` (mono float) through a server: one array per level."""
    async with await connect(url, "encode", sample_rate=sample_rate, **kw) as client:
        return (await stream(client, _chunks(np.asarray(pcm, np.float32), chunk))).codes()


async def decode(url: str, codes: Sequence[np.ndarray], *, chunk_frames: int = 64, **kw) -> np.ndarray:
    """The audio (float32, the model's rate) of code frames, one `[codebooks, frames_l]` array
    per level (or one array for a codec of one level)."""
    levels = [codes] if isinstance(codes, np.ndarray) else [np.atleast_2d(a) for a in codes]
    async with await connect(url, "decode", codebooks=sum(a.shape[0] for a in levels), **kw) as client:
        per = [p for _, p in client.layout.levels]
        frames = levels[0].shape[1] // per[0]
        chunks = [[a[:, i * p:(i + chunk_frames) * p] for a, p in zip(levels, per)]
                  for i in range(0, max(frames, 1), chunk_frames)]
        return (await stream(client, chunks)).audio()


async def duplex(url: str, pcm: np.ndarray, sample_rate: int, *, chunk: int = 4096,
                 **kw) -> tuple[list[np.ndarray], np.ndarray]:
    """(codes, decoded audio) of `pcm` through a server's duplex stream."""
    async with await connect(url, "duplex", sample_rate=sample_rate, **kw) as client:
        result = await stream(client, _chunks(np.asarray(pcm, np.float32), chunk))
        return result.codes(), result.audio()


__all__ = ["Piece", "Result", "ServeError", "StreamClient", "connect", "decode", "duplex", "encode", "stream",
           "stream_url"]
