"""codecport's gate in Ray Serve's proxy: an ASGI middleware between uvicorn and the proxy, on
`/stream` WebSockets only, that gives a stream behind Serve what the local server gets from TCP.

Serve's proxy reads a WebSocket's client as fast as it sends, into a queue that its replica pulls
whole into another, and hands the replica's output to uvicorn through a stream that a slow client
does not hold back (ray/serve/_private/proxy.py, http_util.py): nothing bounds either. The gate:

- Input, by credit. It passes the client's messages on while the replica's stream has taken all
  but a window of them (the replica gives credit as its connection reads, `CREDIT`); past that it
  stops asking uvicorn for more, and uvicorn stops reading the socket (it pauses after each
  message until asked), so TCP slows the client as the local server's unread socket does. A
  message past the stream's `--max-message` is refused here, with the protocol's `too_large`
  error and 1009, and never copied on to the replica.
- Output, by acknowledgement. It tells the replica (`SENT`, among the client's messages) the
  bytes of output uvicorn has taken for the client, so that the replica's connection sees a slow
  reader as the local server sees a full send buffer: its backlog grows, and `behind` drops it.
  It gives the client's socket the kernel send buffer `--send-buffer` says, as the local server
  does (autotuned, it would hide megabytes of a slow reader's output from everyone).

The replica learns that its stream passes a gate from the request header `HEADER` (set here, and
stripped from what a client sends), and tells the gate its bounds in its accept (`BOUNDS`); a
replica that does not (another app's `/stream`) sees a gate that passes everything. Serve runs
it in each proxy when every node's environment has
`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=codecport.serve.gate:middlewares` (a Ray that
`codec-serve` starts or whose Serve it starts gets it from the driver: onray.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket

from .protocol import error_message

log = logging.getLogger(__name__)
PATH = "/stream"
HEADER = b"x-codecport-gate"
BOUNDS = "codecport.bounds"  # the accept's key: {"max_message", "window", "window_out", "send_buffer"}
CREDIT = "codecport.credit"  # replica -> gate: {"bytes": cost of input its stream took}
SENT = "codecport.sent"  # gate -> replica: {"bytes": output uvicorn took for the client}
# What one message costs beyond its data, counted with it on both sides: Serve's queues hold each
# as a dict (with its pickled copy on the way), so a flood of empty messages meets the window as
# one of large ones does.
OVERHEAD = 512


def cost(data: bytes | str | None) -> int:
    """What a message of `data` counts against a window."""
    return len(data or b"") + OVERHEAD


def passed(scope: dict) -> bool:
    """Whether the request of ASGI `scope` came through a gate (its header, set there)."""
    return any(k.lower() == HEADER for k, _ in scope.get("headers", []))


def middlewares() -> list:
    """Serve's proxy callback (RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH): the gate."""
    from starlette.middleware import Middleware

    return [Middleware(Gate)]


class Gate:
    """The ASGI middleware: a `Flow` for each `/stream` WebSocket, everything else passed on."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        # Every request says it came through the gate (/health tells the driver so).
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != HEADER]
        scope = {**scope, "headers": [*headers, (HEADER, b"1")]}
        if scope["type"] != "websocket" or scope.get("path") != PATH:
            return await self.app(scope, receive, send)
        flow = Flow(receive, send, scope)
        try:
            await self.app(scope, flow.receive, flow.send)
        finally:
            flow.stop()


def _data(message: dict):
    data = message.get("bytes")
    return message.get("text") if data is None else data


class Flow:
    """One stream's input and output through the gate (see the module's docstring)."""

    def __init__(self, receive, send, scope: dict | None = None):
        self._receive, self._send, self.scope = receive, send, scope or {}
        self.bounds: dict | None = None  # the replica's, from its accept: until then, all passes
        self.inflight = 0  # cost of input passed on and not yet credited
        self.acks = 0  # bytes of output uvicorn took, not yet told to the replica
        self.closed = False  # the gate closed the client's socket (too_large)
        self._held: dict | None = None  # a message of the client's waiting for credit
        self._next: asyncio.Future | None = None  # uvicorn's receive in flight (never cancelled)
        self._changed = asyncio.Event()  # credit came, or acks are due

    def stop(self) -> None:
        if self._next is not None and not self._next.done():
            self._next.cancel()

    def _fits(self, message: dict) -> bool:
        return self.inflight == 0 or self.inflight + cost(_data(message)) <= self.bounds["window"]

    def _acks_due(self) -> bool:
        return self.bounds is not None and self.acks >= max(1, self.bounds["window_out"] // 4)

    async def receive(self) -> dict:
        """The proxy's next message of the client's: one that fits the window, or an ack."""
        while True:
            self._changed.clear()
            if self._acks_due():
                n, self.acks = self.acks, 0
                return {"type": SENT, "bytes": n}
            if self._held is not None:
                if self._fits(self._held):
                    message, self._held = self._held, None
                    self.inflight += cost(_data(message))
                    return message
            elif self._next is None:
                self._next = asyncio.ensure_future(self._receive())
            elif self._next.done():
                message, self._next = self._next.result(), None
                if message.get("type") != "websocket.receive" or self.bounds is None:
                    return message
                if len(_data(message) or b"") > self.bounds["max_message"]:
                    return await self._too_large()
                self._held = message
                continue
            waits = [asyncio.ensure_future(self._changed.wait())]
            if self._next is not None and self._held is None:
                waits.append(self._next)
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waits[0].cancel()

    async def _too_large(self) -> dict:
        """Refuse the client's message past the bound here: the error, the close, and for the
        replica the disconnect that ends its stream."""
        most = self.bounds["max_message"]
        log.info("refused a message past %d bytes at the gate", most)
        self.closed = True
        with contextlib.suppress(Exception):
            await self._send({"type": "websocket.send", "text": error_message(
                "too_large", f"a message holds at most {most} bytes (--max-message); send smaller pieces")})
            await self._send({"type": "websocket.close", "code": 1009})
        return {"type": "websocket.disconnect", "code": 1009}

    async def send(self, message: dict) -> None:
        """The replica's message: a credit taken here, the rest on to the client."""
        kind = message.get("type")
        if kind == CREDIT:
            self.inflight = max(0, self.inflight - int(message.get("bytes", 0)))
            self._changed.set()
            return
        if kind == "websocket.accept" and BOUNDS in message:
            self.bounds = message[BOUNDS]
            message = {k: v for k, v in message.items() if k != BOUNDS}
            if self.bounds.get("send_buffer"):
                send_buffer(self.scope.get("client"), self.scope.get("server"), self.bounds["send_buffer"])
        if self.closed:
            return  # the gate closed the client's socket: the replica's last words go nowhere
        await self._send(message)
        if kind == "websocket.send" and self.bounds is not None:
            self.acks += len(_data(message) or b"")
            if self._acks_due():
                self._changed.set()


def send_buffer(client, server, size: int) -> bool:
    """Set SO_SNDBUF of this process's TCP socket from `server` to `client` ((host, port) each, as
    an ASGI scope gives them; uvicorn hands the middleware no transport): found among the
    process's file descriptors (Linux /proc), set through a duplicate of it. False where it
    cannot be found."""
    if not client or not server or not os.path.isdir("/proc/self/fd"):
        return False
    want = (str(client[0]), int(client[1])), (str(server[0]), int(server[1]))
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            dup = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        with dup:
            try:
                if dup.type == socket.SOCK_STREAM and (dup.getpeername()[:2], dup.getsockname()[:2]) == want:
                    dup.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
                    return True
            except OSError:
                continue
    log.info("the client socket of %s was not found: its send buffer is the system's", client)
    return False
