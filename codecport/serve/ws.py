"""The WebSocket side of `codec-serve`'s connections: what aiohttp does on its own that a
stream's client must still be told of, and a receive whose deadline control frames do not move."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import WSCloseCode, web

from .protocol import error_message


class Socket(web.WebSocketResponse):
    """aiohttp refuses a message past `max_msg_size` (code 1009), or a broken one (1002, 1007), by
    closing before the handler hears of it: this says why, as every refusal does, in a JSON
    error first."""

    told = False  # an error message has gone out already (ours): nothing more to say

    async def close(self, *, code: int = WSCloseCode.OK, **kwargs) -> bool:
        if code in _FRAMING and not self.closed and not self.told:
            message = (f"a message holds at most {self._max_msg_size} bytes (--max-message); send smaller "
                       "pieces" if code == WSCloseCode.MESSAGE_TOO_BIG else
                       "not a valid WebSocket message (broken framing, or text that is not UTF-8); "
                       "use a WebSocket client library")
            with contextlib.suppress(Exception):
                await self.send_str(error_message("too_large" if code == WSCloseCode.MESSAGE_TOO_BIG
                                                  else "bad_request", message))
        return await super().close(code=code, **kwargs)


# The closes aiohttp makes on a client's broken message, before the handler hears of it.
_FRAMING = {WSCloseCode.MESSAGE_TOO_BIG, WSCloseCode.PROTOCOL_ERROR, WSCloseCode.INVALID_TEXT,
            WSCloseCode.UNSUPPORTED_DATA}


async def receive_by(ws: web.WebSocketResponse, deadline: float | None):
    """The next message, or TimeoutError at `deadline` (loop time; None: no deadline). aiohttp's
    own timeout starts again at each ping and pong it answers, so a client that only pinged would
    never time out."""
    if deadline is None:
        return await ws.receive()
    left = deadline - asyncio.get_running_loop().time()
    if left <= 0:
        raise asyncio.TimeoutError
    return await asyncio.wait_for(ws.receive(), left)
