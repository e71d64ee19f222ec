"""aiohttp's WebSocket as `codec-serve`'s local connections use it (sockets.Socket): what aiohttp
does on its own that a stream's client must still be told of, what RFC 6455 asks of a server that
aiohttp does not do, and aiohttp's messages in the transport-neutral form (sockets.Message)."""

from __future__ import annotations

import contextlib
import inspect
import logging

from aiohttp import WSCloseCode, WSMsgType, web

from .protocol import error_message
from .sockets import CLOSED, Kind, Message

log = logging.getLogger(__name__)
# A frame header aiohttp's reader refuses (FIN, a reserved bit set, binary, masked, empty): what
# `FrameGuard` hands it for an unmasked frame, so that it fails the connection (1002) as it does
# a broken frame of its own finding. Its reader has no other way in: it takes what it is fed.
REFUSED = b"\xa2\x80\x00\x00\x00\x00"


class FrameGuard:
    """What a server's WebSocket reads passes through here before aiohttp's reader (`inner`),
    each frame's header read as it comes (RFC 6455 section 5.2):

    - A client's frame must be masked (section 5.1: the server must close the connection on one
      that is not). aiohttp's reader unmasks a masked frame and takes an unmasked one as it is,
      with no option to refuse it: here an unmasked frame and all after it go no further, and the
      reader is handed a header it refuses, so the connection fails with 1002.
    - Once `discard` is set, the client's data frames are dropped unread (its control frames go
      on: its close answers the server's), so a client that keeps sending while the server closes
      is never held up by a reader that no one reads.
    """

    def __init__(self, inner):
        self.inner = inner
        self.discard = False
        self.unmasked = False  # a frame was not masked: the connection is failing
        self._head = bytearray()  # the next frame's header, until it is whole
        self._left = 0  # bytes of the current frame's payload still to come
        self._drop = False  # the current frame goes no further

    def _need(self) -> int:
        """Bytes of the header being read: 2, then as its length and mask bits say."""
        if len(self._head) < 2:
            return 2
        n = self._head[1] & 0x7F
        return 2 + (2 if n == 126 else 8 if n == 127 else 0) + (4 if self._head[1] & 0x80 else 0)

    def feed_data(self, data) -> tuple[bool, bytes]:
        if self.unmasked:
            return True, b""
        data = bytes(data) if type(data) is not bytes else data
        spans: list = []  # (start, stop) of `data`, or held header bytes, passed on in order

        def keep(a: int, b: int) -> None:
            if spans and isinstance(spans[-1], tuple) and spans[-1][1] == a:
                spans[-1] = (spans[-1][0], b)
            elif a < b:
                spans.append((a, b))

        i, n = 0, len(data)
        while i < n:
            if self._left:
                k = min(self._left, n - i)
                if not self._drop:
                    keep(i, i + k)
                self._left -= k
                i += k
                continue
            start, held = i, len(self._head)
            while i < n and len(self._head) < self._need():  # a header is 2 to 14 bytes
                self._head.append(data[i])
                i += 1
            if len(self._head) < self._need():
                break  # the rest of it comes with the next read
            head, self._head = bytes(self._head), bytearray()
            if not head[1] & 0x80:
                self.unmasked = True
                break
            n7 = head[1] & 0x7F
            self._left = n7 if n7 < 126 else int.from_bytes(head[2:4] if n7 == 126 else head[2:10], "big")
            self._drop = self.discard and head[0] & 0x0F < 8  # data frames; control frames are 8 on
            if not self._drop:
                if held:
                    spans.append(head)
                else:
                    keep(start, i)
        out = data if spans == [(0, n)] else b"".join(
            s if isinstance(s, bytes) else data[s[0]:s[1]] for s in spans)
        eof, tail = self.inner.feed_data(out) if out else (False, b"")
        if self.unmasked:
            self.inner.feed_data(REFUSED)
            return True, b""
        return eof, tail

    def feed_eof(self) -> None:
        self.inner.feed_eof()


_CLOSE_DRAINS = "drain" in inspect.signature(web.WebSocketResponse.close).parameters


class Socket(web.WebSocketResponse):
    """A server's WebSocket of at most `max_message` bytes a message from the client, read
    through a `FrameGuard`. aiohttp refuses a message past that bound (1009), or a broken one
    (1002, 1007), by closing before the handler hears of it: this says why, as every refusal does,
    in a JSON error first."""

    def __init__(self, *, max_message: int, **kwargs):
        super().__init__(max_msg_size=max_message, **kwargs)
        self.max_message = max_message
        self.told = False  # an error message has gone out already (ours): nothing more to say
        self.failure: str | None = None  # too_large or bad_request, when aiohttp failed the client
        self.guard: FrameGuard | None = None
        self.transport = None  # the connection's, once prepared
        self.hooked = False  # aiohttp called `_post_start`, where the guard goes in

    async def prepare(self, request):
        writer = await super().prepare(request)
        if not self.hooked:  # an aiohttp that no longer calls the private hook the guard uses
            log.warning("aiohttp %s started this WebSocket without _post_start: unmasked frames are not "
                        "refused", _aiohttp_version())
            self.hooked, self.transport = True, request.transport
        return writer

    def _post_start(self, request, protocol, writer) -> None:
        # aiohttp installs its reader as the connection's parser here; the guard goes in front of
        # it through RequestHandler's own attributes (aiohttp offers no public way). Bytes that
        # came with the upgrade request (a client may send nothing before the reply: RFC 6455
        # section 4.1) go through the guard too.
        proto, self.transport = request.protocol, request.transport
        self.hooked = True
        tail = getattr(proto, "_message_tail", b"")
        if tail:
            proto._message_tail = b""
        super()._post_start(request, protocol, writer)
        inner = getattr(proto, "_payload_parser", None)
        if inner is None:
            log.warning("aiohttp %s keeps its WebSocket reader elsewhere: unmasked frames are not refused",
                        _aiohttp_version())
        else:
            self.guard = proto._payload_parser = FrameGuard(inner)
        if tail:
            proto.data_received(tail)

    async def receive(self, timeout: float | None = None) -> Message:  # type: ignore[override]
        msg = await super().receive(timeout)
        if msg.type is WSMsgType.BINARY:
            return Message(Kind.BINARY, msg.data)
        if msg.type is WSMsgType.TEXT:
            return Message(Kind.TEXT, msg.data)
        if msg.type is WSMsgType.ERROR:
            code = getattr(msg.data, "code", None)
            too_big = code == WSCloseCode.MESSAGE_TOO_BIG
            self.failure = self.failure or ("too_large" if too_big else "bad_request")
            why = "an unmasked frame" if self.guard is not None and self.guard.unmasked else str(msg.data)
            return Message(Kind.ERROR, code=code, why=why)
        return CLOSED if msg.type is not WSMsgType.CLOSE else Message(Kind.CLOSED, code=msg.data)

    def gone(self) -> bool:
        """The connection is closing or closed (a client that left while its socket was not read)."""
        return self.transport is None or self.transport.is_closing()

    def abort(self) -> None:
        """Cut the connection, without a closing handshake."""
        if self.transport is not None:
            self.transport.abort()

    def discard_input(self) -> None:
        """Drop the client's data frames unread from now on (its close still answers ours)."""
        if self.guard is not None:
            self.guard.discard = True

    async def close(self, *, code: int = WSCloseCode.OK, drain: bool = True, **kwargs) -> bool:
        if code in _FRAMING and not self.closed and not self.told:
            if code == WSCloseCode.MESSAGE_TOO_BIG:
                message = (f"a message holds at most {self.max_message} bytes (--max-message); send "
                           "smaller pieces")
            elif self.guard is not None and self.guard.unmasked:
                message = ("a client's frames must be masked (RFC 6455 section 5.1); use a WebSocket "
                           "client library")
            else:
                message = ("not a valid WebSocket message (broken framing, or text that is not UTF-8); "
                           "use a WebSocket client library")
            self.told = True
            with contextlib.suppress(Exception):
                await self.send_str(error_message("too_large" if code == WSCloseCode.MESSAGE_TOO_BIG
                                                  else "bad_request", message))
        if _CLOSE_DRAINS:  # an aiohttp whose close() takes no `drain` drains it
            kwargs["drain"] = drain
        return await super().close(code=code, **kwargs)


def _aiohttp_version() -> str:
    import aiohttp

    return aiohttp.__version__


# The closes aiohttp makes on a client's broken message, before the handler hears of it.
_FRAMING = {WSCloseCode.MESSAGE_TOO_BIG, WSCloseCode.PROTOCOL_ERROR, WSCloseCode.INVALID_TEXT,
            WSCloseCode.UNSUPPORTED_DATA}
