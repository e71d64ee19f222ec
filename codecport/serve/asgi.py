"""An ASGI WebSocket (Starlette's, as Ray Serve's proxy hands one to a replica) with the surface
`Connection` uses of ws.Socket, so that the protocol's code (connection.py, live.py, protocol.py)
runs unchanged on both transports.

What aiohttp does for ws.Socket and an ASGI server does not, this does: messages come as aiohttp's
`WSMessage` (the vocabulary connection.py reads), one reader task takes them from the ASGI
`receive` (an awaited ASGI receive that is cancelled may lose its message; a queue's `get` may be
cancelled freely), and a message past `max_message` is refused here with the JSON error and 1009,
as aiohttp refuses it before a handler hears of it (Serve's proxy passes up to 16 MiB). Unmasked
frames and broken framing are the front server's (uvicorn's) to refuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WebSocketError, WSCloseCode, WSMessage, WSMsgType

from .protocol import error_message

log = logging.getLogger(__name__)


class AsgiSocket:
    """Starlette's `ws`, once accepted (`await start()`), as ws.Socket is to a Connection."""

    def __init__(self, ws, *, max_message: int):
        self.ws, self.max_message = ws, max_message
        self.guard = None  # ws.Socket's frame guard: framing is the front server's here
        self.told = False
        self.closed = False
        self.close_code: int | None = None
        self._discard = False
        self._left = False  # the client's disconnect has been read
        self._inbox: asyncio.Queue = asyncio.Queue(1)  # one message ahead: backpressure as aiohttp's
        self._reader: asyncio.Task | None = None

    async def start(self) -> None:
        await self.ws.accept()
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    self._left, self.close_code = True, msg.get("code", 1005)
                    await self._inbox.put(WSMessage(WSMsgType.CLOSE, self.close_code, msg.get("reason")))
                    return
                data = msg.get("bytes")
                kind = WSMsgType.BINARY
                if data is None:
                    data, kind = msg.get("text") or "", WSMsgType.TEXT
                if self._discard:
                    continue
                if len(data) > self.max_message:
                    await self._too_large()
                    await self._inbox.put(WSMessage(WSMsgType.ERROR, WebSocketError(
                        WSCloseCode.MESSAGE_TOO_BIG, "message too big"), None))
                    return
                await self._inbox.put(WSMessage(kind, data, None))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the proxy's side of the socket failed: the connection is gone
            self._left = True
            await self._inbox.put(WSMessage(WSMsgType.ERROR, e, None))

    async def _too_large(self) -> None:
        self.told = True
        with contextlib.suppress(Exception):
            await self.ws.send_text(error_message("too_large", f"a message holds at most {self.max_message} "
                                                               "bytes (--max-message); send smaller pieces"))
        await self.close(code=WSCloseCode.MESSAGE_TOO_BIG)

    async def receive(self) -> WSMessage:
        if self.closed and self._inbox.empty():
            return WSMessage(WSMsgType.CLOSED, None, None)
        return await self._inbox.get()

    async def send_str(self, text: str) -> None:
        await self._send(self.ws.send_text, text)

    async def send_bytes(self, data: bytes) -> None:
        await self._send(self.ws.send_bytes, data)

    async def _send(self, fn, data) -> None:
        if self.closed or self._left:
            raise ConnectionResetError("the client has left")
        try:
            await fn(data)
        except Exception as e:  # Starlette's and Serve's failures of a send: the client is gone
            self._left = True
            raise ConnectionResetError(f"cannot send: {type(e).__name__}: {e}") from None

    async def close(self, *, code: int = WSCloseCode.OK, **_) -> bool:
        if self.closed:
            return False
        self.closed = True
        with contextlib.suppress(Exception):
            await self.ws.close(code=code)
        if self._reader is not None and not self._reader.done():
            # The client's close answers ours; past the close timeout the reader goes anyway.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._reader), 2.0)
        return True

    def gone(self) -> bool:
        return self.closed or self._left

    def abort(self) -> None:
        """ASGI has no cut without a close: the close frame goes, and the reader stops."""
        if self._reader is not None:
            self._reader.cancel()
        if not self.closed:
            self.closed = True
            asyncio.ensure_future(_quietly(self.ws.close(code=WSCloseCode.INTERNAL_ERROR)))

    def discard_input(self) -> None:
        self._discard = True
        with contextlib.suppress(asyncio.QueueEmpty):
            while True:
                self._inbox.get_nowait()

    async def refuse(self, text: str, code: int, timeout: float) -> None:
        """The error `text`, then the close `code`, each in `timeout` s at most (ws.Socket.refuse)."""
        self.discard_input()
        if self.closed:
            return
        self.told = True
        try:
            await asyncio.wait_for(self.send_str(text), timeout)
        except (asyncio.TimeoutError, ConnectionError):
            log.info("a client took no error in %g s", timeout)
        await self.close(code=code)

    async def stop(self) -> None:
        """The reader, ended (a connection's last step)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


async def _quietly(coro) -> None:
    with contextlib.suppress(Exception):
        await coro
