"""An ASGI WebSocket (the raw `receive` and `send` Ray Serve hands a replica) as sockets.Socket,
so that the protocol's code (connection.py, live.py, protocol.py) runs unchanged behind Serve.

What aiohttp and the kernel do for the local server, this does with Serve's proxy between the
client and the replica:

- One reader task takes every message Serve delivers as it comes (an awaited ASGI receive that
  is cancelled may lose its message; the connection's waits on `receive` may be cancelled
  freely) into an inbox counted in bytes.
- Behind codecport's gate (gate.py, in Serve's proxy; the request carries its header) the input
  is bounded end to end: the socket gives the gate credit for what the connection has read, and
  the gate reads the client no further than a window ahead of it, so a client faster than the
  codec is slowed by TCP as on the local server. The output is bounded too: a send waits while
  more than a send buffer's worth (`--send-buffer`) has not been acknowledged by the gate as
  taken for the client, so a slow reader's output waits in the stream's backlog (`behind`).
- Without the gate nothing slows the client: input that piles up past the stream's input bound
  unread is refused (`too_fast`) rather than held, and output is sent as Serve takes it (a slow
  reader is not seen: docs/serve.md).
- A message past `max_message` is refused with the JSON error and 1009, as aiohttp refuses it
  (the gate refuses it first where it runs, so that the replica never holds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from . import gate
from .protocol import error_message
from .sockets import CLOSED, Kind, Message

log = logging.getLogger(__name__)


class AsgiSocket:
    """A WebSocket of an ASGI `scope`, `receive` and `send`, once `await start()` accepted it:
    at most `max_message` bytes a message from the client, `input_bound` bytes of them read and
    not taken (without a gate), `window_out` bytes of output unacknowledged (behind a gate)."""

    def __init__(self, scope, receive, send, *, max_message: int, input_bound: int, window_out: int,
                 send_buffer: int = 0):
        self._receive, self._send = receive, send
        self.send_buffer = send_buffer  # the client socket's SO_SNDBUF the gate sets (0: the system's)
        self.max_message, self.input_bound, self.window_out = max_message, input_bound, window_out
        self.gated = gate.passed(scope)
        self.window = 2 * (max_message + gate.OVERHEAD)  # what the gate lets be in flight
        self.told = False
        self.failure: str | None = None
        self.closed = False
        self.close_code: int | None = None
        self._discard = False
        self._left = False  # the client's disconnect has been read, or the transport failed
        self._inbox: deque[tuple[Message, int]] = deque()
        self._queued = 0  # cost of what waits in the inbox
        self._uncredited = 0  # cost the connection has taken that the gate has not been told of
        self._unacked = 0  # bytes of output sent that the gate has not acknowledged
        self._arrived = asyncio.Event()
        self._acked = asyncio.Event()
        self._reader: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> bool:
        """Accept the WebSocket (telling a gate the stream's bounds); False if the client left."""
        first = await self._receive()
        if first.get("type") != "websocket.connect":
            self._left = True
            return False
        accept: dict = {"type": "websocket.accept"}
        if self.gated:
            accept[gate.BOUNDS] = {"max_message": self.max_message, "window": self.window,
                                   "window_out": self.window_out, "send_buffer": self.send_buffer}
        await self._send(accept)
        self._reader = asyncio.ensure_future(self._read())
        return True

    # ---- input ---------------------------------------------------------------------------------
    def _push(self, message: Message, cost: int = 0) -> None:
        self._inbox.append((message, cost))
        self._queued += cost
        self._arrived.set()

    async def _read(self) -> None:
        try:
            while True:
                msg = await self._receive()
                kind = msg.get("type")
                if kind == gate.SENT:
                    self._unacked = max(0, self._unacked - int(msg.get("bytes", 0)))
                    self._acked.set()
                    continue
                if kind == "websocket.disconnect":
                    self._left, self.close_code = True, msg.get("code", 1005)
                    if self.gated and self.close_code == 1009:  # the gate refused a message too large
                        self.failure = self.failure or "too_large"
                    self._push(Message(Kind.CLOSED, code=self.close_code))
                    return
                if kind != "websocket.receive":
                    continue
                data = msg.get("bytes")
                message = Message(Kind.BINARY, data)
                if data is None:
                    data = msg.get("text") or ""
                    message = Message(Kind.TEXT, data)
                cost = gate.cost(data)
                if self._discard:
                    self._credit(cost)
                    continue
                if len(data) > self.max_message:
                    self._credit(cost)
                    await self._refuse_here("too_large", 1009, f"a message holds at most {self.max_message} "
                                                              "bytes (--max-message); send smaller pieces")
                    continue
                self._push(message, cost)
                if self._queued > max(self.input_bound, self.window):
                    await self._refuse_here("too_fast", 1008, (
                        f"input arrived faster than this server codes it ({self._queued} bytes waited "
                        f"unread past the bound of {self.input_bound}); send it no faster than it is "
                        "coded: pace it as the audio plays, or wait for output before sending more"))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # Serve's side of the socket failed: the connection is gone
            self._left = True
            self._push(Message(Kind.ERROR, why=f"{type(e).__name__}: {e}"))

    async def _refuse_here(self, code: str, close: int, text: str) -> None:
        """The socket's own refusal (the connection may not be reading): the error, the close,
        and an ERROR message for a connection that waits on `receive`."""
        self.failure = self.failure or code
        log.info("refused a stream: %s", code)
        self.discard_input()
        self.told = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._send({"type": "websocket.send",
                                               "text": error_message(code, text)}), 2)
        if not self.closed:
            self.closed = True
            with contextlib.suppress(Exception):
                await self._send({"type": "websocket.close", "code": close})
        self._push(Message(Kind.ERROR, code=close, why=code))

    def _credit(self, cost: int) -> None:
        """`cost` of input taken: told to the gate once half its window has gathered (it waits
        for credit only past a whole window, so it never waits for what is held back here)."""
        if not self.gated:
            return
        self._uncredited += cost
        if self._uncredited >= self.window // 2:
            n, self._uncredited = self._uncredited, 0
            self._spawn(self._send({"type": gate.CREDIT, "bytes": n}))

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(_quietly(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def receive(self) -> Message:
        while not self._inbox:
            if self.closed or self._left:
                return CLOSED
            self._arrived.clear()
            await self._arrived.wait()
        message, cost = self._inbox.popleft()
        self._queued -= cost
        self._credit(cost)
        return message

    def discard_input(self) -> None:
        self._discard = True
        while self._inbox:
            message, cost = self._inbox.popleft()
            self._queued -= cost
            self._credit(cost)
            if message.kind in (Kind.CLOSED, Kind.ERROR):  # kept: the connection's end
                self._inbox.appendleft((message, 0))
                break

    # ---- output --------------------------------------------------------------------------------
    async def send_str(self, text: str) -> None:
        await self._out({"type": "websocket.send", "text": text}, len(text))

    async def send_bytes(self, data: bytes) -> None:
        await self._out({"type": "websocket.send", "bytes": data}, len(data))

    async def _out(self, message: dict, n: int) -> None:
        if self.gated and not self.told:
            # Behind a gate: no more than a send buffer's worth unacknowledged, as the kernel's
            # send buffer holds the local server's writes. A refusal's error does not wait: it is
            # small and the last, and the client it drops for being slow gets it once it reads.
            while self._unacked > self.window_out and not self.gone():
                self._acked.clear()
                await self._acked.wait()
        if self.gone():
            raise ConnectionResetError("the client has left")
        try:
            self._unacked += n
            await self._send(message)
        except Exception as e:  # Serve's failures of a send: the client is gone
            self._left = True
            raise ConnectionResetError(f"cannot send: {type(e).__name__}: {e}") from None

    async def close(self, *, code: int = 1000, drain: bool = True) -> bool:
        if self.closed:
            return False
        self.closed = True
        self._acked.set()  # a send waiting for room ends (gone)
        with contextlib.suppress(Exception):
            await self._send({"type": "websocket.close", "code": code})
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
        self._acked.set()
        if not self.closed:
            self.closed = True
            self._spawn(self._send({"type": "websocket.close", "code": 1011}))

    async def stop(self) -> None:
        """The reader, ended (a connection's last step)."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader


async def _quietly(coro) -> None:
    with contextlib.suppress(Exception):
        await coro
