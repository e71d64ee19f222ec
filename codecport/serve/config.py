"""What `codec-serve`'s flags set, and their defaults: the one place they are written (the CLI
reads them from here). No aiohttp here: `codec-serve --help` imports it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeConfig:
    """What `codec-serve`'s flags set."""

    slots: int = 8  # slots of each pool (--slots): streams at once
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port (the URL says which)
    queue: int = 0  # connections that may wait for a slot (--queue); 0: refuse at once
    queue_timeout: float = 10.0  # seconds one waits before it is refused
    grace: float = 10.0  # seconds SIGTERM lets the streams in flight finish
    max_message: int = 1 << 20  # bytes of one message from a client (a larger one is refused)
    max_backlog: int = 4 << 20  # bytes of output waiting for a client: warned at half, dropped past it
    # The kernel's send buffer of each connection (SO_SNDBUF; 0: the system's autotuning, which
    # grows to net.ipv4.tcp_wmem's max, 4 MiB on Linux): what it holds is out of the server's
    # sight, so a small one makes a slow reader show in `backlog` soon, with stale audio bounded.
    send_buffer: int = 1 << 18
    batched: bool = True  # step the slots through the folder's batched step graphs, where it has them
    handshake_timeout: float = 10.0  # seconds a new connection has to send its request
    idle_timeout: float = 30.0  # seconds a stream may send nothing before its input ends (its slots go back)
    close_timeout: float = 2.0  # seconds a closing handshake (or a refusal) may take
    heartbeat: float | None = 30.0  # seconds between pings (a vanished client is noticed)
    # Pages whose WebSockets may connect (--allow-origin; exact origins, access.normal_origin's
    # form); a browser's WebSocket from any other page is refused, a client without an Origin
    # (not a browser) is not.
    allow_origin: tuple[str, ...] = ()
