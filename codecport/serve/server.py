"""`codec-serve`: live streams of one codec folder over WebSocket, on aiohttp's asyncio server.

Routes: `/stream`, the WebSocket endpoint (one connection, one stream: protocol.py and
docs/serve.md); `/health` (JSON: ok, slots total and active); `/metrics` (Prometheus text).
The numbers come from the engine (engine.py over runtime/slots.py); this module holds the app:
who may connect (a request must name this server as its Host, a browser's WebSocket come from
an allowed page: access.py), a `Connection` per stream (connection.py), the executor that makes
large messages into input off the event loop, and the drain on SIGTERM (stop accepting, let the
streams in flight finish for `grace` seconds, fail the rest, exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..errors import CodecportError
from .access import host_allowed, hosts, origin_allowed
from .config import ServeConfig
from .connection import Connection, converted
from .engine import Scheduler
from .protocol import ProtocolError, error_message
from .ws import Socket

log = logging.getLogger(__name__)
__all__ = ["ServeConfig", "Server", "run", "serve"]


class _ClientMistakes(logging.Filter):
    """aiohttp logs a client's malformed request (two Host headers, a broken request line) as an
    ERROR with its traceback, after answering it 400: a client's mistake is not the server's
    error, so it is told at INFO, in one line, and the ERROR dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) and 400 <= (error.code or 0) < 500:
            log.info("refused a malformed request: %s", " ".join(str(error.message).split()))
            return False
        return True


_MISTAKES = _ClientMistakes()


class Server:
    """The app of one codec on `config`: `await start()` (returns the URL), `await drain()`,
    `await close()`. `serve()` runs the three around the signals."""

    def __init__(self, codec, config: ServeConfig):
        self.codec, self.config = codec, config
        logging.getLogger("aiohttp.server").addFilter(_MISTAKES)  # once: a filter is kept once
        self.scheduler = Scheduler(codec, config.slots, config.queue, config.max_backlog,
                                   input_bound=4 * config.max_message, batched=config.batched)
        self.app = web.Application(middlewares=[self._access])
        self.app.add_routes([web.get("/stream", self._stream), web.get("/health", self._health),
                             web.get("/metrics", self._metrics)])
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None
        self.url = ""
        self.hosts: frozenset[str] = frozenset()  # Host headers it answers to, once listening
        self.origins = frozenset(config.allow_origin)
        self._connections: set[Connection] = set()
        self._handlers: set[asyncio.Task] = set()  # the connections' tasks
        self._tasks: set[asyncio.Task] = set()
        self._convert = ThreadPoolExecutor(2, thread_name_prefix="codec-serve-convert")

    # ---- life ----------------------------------------------------------------------------------
    async def start(self) -> str:
        cfg = self.config
        self.scheduler.start()
        # A connection that never completes its HTTP request is closed after the handshake's
        # time too (aiohttp's default keeps it an hour: a file descriptor each).
        self.runner = web.AppRunner(self.app, handle_signals=False, access_log=None,
                                    shutdown_timeout=cfg.close_timeout,
                                    keepalive_timeout=cfg.handshake_timeout)
        await self.runner.setup()
        self.site = web.TCPSite(self.runner, cfg.host, cfg.port)
        try:
            await self.site.start()
        except OSError as e:
            await self.close()
            raise CodecportError(f"cannot listen on {cfg.host}:{cfg.port} ({e.strerror}); pass another "
                                 "--port (0 picks a free one) or --host") from None
        host, port = self.runner.addresses[0][:2]
        self.hosts = hosts(cfg.host, port)
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self.url

    async def drain(self) -> None:
        """Stop accepting, let the streams in flight finish for `grace` s, then fail the rest."""
        cfg, sched = self.config, self.scheduler
        sched.drain()
        if self.site is not None:
            await self.site.stop()
        for conn in [c for c in self._connections if c.greeting]:
            self._spawn(conn.refuse(ProtocolError("shutting_down", "the server is stopping; connect to "
                                                                   "another")))
        await sched.wind_down(cfg.grace)
        pending = self._tasks | self._handlers
        if pending:
            await asyncio.wait(pending, timeout=3 * cfg.close_timeout + 1)

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        await self.scheduler.stop()
        # A conversion a cancelled reader left runs to its end off the loop (up to 1 MiB resampled).
        await asyncio.get_running_loop().run_in_executor(None, self._convert.shutdown)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def convert(self, fn: Callable, data: bytes):
        return await converted(self._convert, fn, data)

    # ---- who may connect ----------------------------------------------------------------------
    @web.middleware
    async def _access(self, request: web.Request, handler) -> web.StreamResponse:
        """A request must name this server (Host: DNS rebinding), and a browser's WebSocket come
        from a page allowed by --allow-origin (a client without an Origin is not a browser's)."""
        if not host_allowed(request.headers.get("Host"), self.hosts, self.config.host):
            log.info("refused a request for host %r", request.headers.get("Host"))
            anywhere = " or any IP address of this machine" if self.config.host in ("0.0.0.0", "::") else ""
            return self._refused(421, f"this server answers to {self.url[len('http://'):]}, localhost and "
                                      f"127.0.0.1{anywhere} only; connect by one of them")
        if request.path == "/stream" and not origin_allowed(request.headers.get("Origin"), self.origins):
            log.info("refused a WebSocket from a page of %r", request.headers.get("Origin"))
            return self._refused(403, f"a page of {request.headers.get('Origin')} may not use this server; "
                                      "start it with --allow-origin for the pages that should")
        return await handler(request)

    def _refused(self, status: int, message: str) -> web.Response:
        self.scheduler.metrics.errors["bad_request"] += 1
        return web.Response(text=error_message("bad_request", message), status=status,
                            content_type="application/json")

    # ---- plain routes -------------------------------------------------------------------------
    def health(self) -> dict:
        return self.scheduler.health()

    async def _health(self, request: web.Request) -> web.Response:
        health = self.health()
        return web.json_response(health, status=200 if health["ok"] else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.scheduler.metrics.render(), content_type="text/plain",
                            headers={"X-Content-Type-Options": "nosniff"}, charset="utf-8")

    # ---- the stream ---------------------------------------------------------------------------
    async def _stream(self, request: web.Request) -> web.StreamResponse:
        cfg = self.config
        ws = Socket(max_message=cfg.max_message, compress=False, heartbeat=cfg.heartbeat,
                    timeout=cfg.close_timeout)
        if not ws.can_prepare(request).ok:
            return web.json_response({"op": "error", "code": "bad_request", "message":
                                      "/stream is a WebSocket endpoint; connect with a WebSocket client"},
                                     status=400)
        await ws.prepare(request)
        sock = request.transport.get_extra_info("socket") if request.transport is not None else None
        if cfg.send_buffer and sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, cfg.send_buffer)
        conn = Connection(ws, cfg, self.scheduler, self.codec, self.convert)
        task = asyncio.current_task()
        self._connections.add(conn)
        self._handlers.add(task)
        try:
            await conn.serve()
        finally:
            self._connections.discard(conn)
            self._handlers.discard(task)
        return ws


async def serve(codec, config: ServeConfig, announce: Callable[[str], None] | None = None,
                stop: asyncio.Event | None = None, signals: bool = True) -> None:
    """Serve `codec` until `stop` is set (or SIGTERM/SIGINT arrive, with `signals`), then drain
    and return. `announce(url)` is called once listening."""
    server = Server(codec, config)
    await server.start()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if signals:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
    try:
        if announce is not None:
            announce(server.url)
        await stop.wait()
        log.info("draining: no new streams, %d in flight get %g s", len(server.scheduler.lives), config.grace)
        await server.drain()
    finally:
        await server.close()


def run(codec, config: ServeConfig, announce: Callable[[str], None] | None = None) -> None:
    """`serve` on a new event loop, until SIGTERM or SIGINT."""
    asyncio.run(serve(codec, config, announce))
