"""Servers on top of the runtime: `codec-serve` (server.py: live streams over WebSocket, on the
scheduler of engine.py, speaking protocol.py; client.py is its client) and `codec-run web`, the
browser demo (web.py).

The client's names are here, imported on first use (they need aiohttp, the [serve] extra):

    from codecport.serve import connect, encode, decode, duplex, stream
"""

from __future__ import annotations

CLIENT = ("Piece", "Result", "ServeError", "StreamClient", "connect", "decode", "duplex", "encode", "stream",
          "stream_url")
__all__ = list(CLIENT)


def __getattr__(name: str):
    if name in CLIENT:
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'codecport.serve' has no attribute {name!r}")
