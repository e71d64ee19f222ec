"""What a stream's connection (connection.py) asks of its WebSocket, whichever server carries it:
aiohttp's (ws.Socket, the local server) or an ASGI server's behind Ray Serve's proxy
(asgi.AsgiSocket, a replica). The connection reads `Message`s and speaks only through this
surface, so the protocol's code imports neither server, and a Ray replica no aiohttp.

A socket that refuses a client by itself (a message past `--max-message`, broken framing, input
arriving faster than the stream takes it where nothing slows the client) says why in a JSON
error before it closes, as every refusal does, and keeps the error's code in `failure`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass
from typing import Protocol

log = logging.getLogger(__name__)


class Kind(enum.Enum):
    TEXT = "text"
    BINARY = "binary"
    CLOSED = "closed"  # the client closed, or the connection is gone
    ERROR = "error"  # the socket failed the connection (what the client sent, or the transport)


@dataclass(frozen=True)
class Message:
    """One message from the client: `data` (str for TEXT, bytes for BINARY); for CLOSED and ERROR
    the close `code` where one is known, and for ERROR what went wrong (`why`)."""

    kind: Kind
    data: str | bytes | None = None
    code: int | None = None
    why: str = ""


CLOSED = Message(Kind.CLOSED)


class Socket(Protocol):
    """A server's WebSocket, accepted, as a `Connection` uses it."""

    told: bool  # an error message has gone out already: nothing more to say
    failure: str | None  # the protocol's error code of a refusal the socket made by itself
    closed: bool

    async def receive(self) -> Message: ...

    async def send_str(self, text: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self, *, code: int = 1000, drain: bool = True) -> bool: ...

    def gone(self) -> bool:
        """The client has left, or the socket is closing (noticed while it is not read)."""

    def abort(self) -> None:
        """Cut the connection, without waiting for a closing handshake."""

    def discard_input(self) -> None:
        """Drop the client's data unread from now on (its close still answers ours)."""


async def receive_by(ws: Socket, deadline: float | None) -> Message:
    """The next message, or TimeoutError at `deadline` (loop time; None: no deadline). aiohttp's
    own timeout starts again at each ping and pong it answers, so a client that only pinged would
    never time out."""
    if deadline is None:
        return await ws.receive()
    left = deadline - asyncio.get_running_loop().time()
    if left <= 0:
        raise asyncio.TimeoutError
    return await asyncio.wait_for(ws.receive(), left)


async def refuse(ws: Socket, text: str, code: int, timeout: float) -> None:
    """Send the error `text`, then close with `code` and wait for the client's close, each in
    `timeout` s at most; past that the connection is cut. Meanwhile the client's data is dropped
    unread (a client that sends as it reads is never stuck while it is sent the error), and the
    socket goes only after the client has read the close or given up: closed with the client's
    input unread, the kernel would reset it, and the client lose the error. Call it from the task
    that reads the socket, or with none reading."""
    ws.discard_input()
    if ws.closed:
        return
    ws.told = True
    try:
        await asyncio.wait_for(ws.send_str(text), timeout)
        # No drain of the close frame: it goes out behind the error while close() reads the
        # client's frames until its close (bounded by the socket's own close timeout).
        await asyncio.wait_for(ws.close(code=code, drain=False), 2 * timeout)
    except (asyncio.TimeoutError, ConnectionError, RuntimeError):
        log.info("a client took no error in %g s; cut off", timeout)
        ws.abort()
