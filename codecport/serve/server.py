"""`codec-serve`: live streams of one codec folder over WebSocket, on aiohttp's asyncio server.

Routes: `/stream`, the WebSocket endpoint (one connection, one stream: protocol.py and
docs/serve.md); `/health` (JSON: ok, slots total and active); `/metrics` (Prometheus text).
The numbers come from the engine (engine.py over runtime/slots.py); this module does the I/O:
the handshake, the admission queue, a receive loop and a sender task per connection, refusals
as a JSON error then a close, and the drain on SIGTERM (stop accepting, let the streams in
flight finish for `grace` seconds, fail the rest, exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import WSCloseCode, WSMsgType, web

from ..errors import CodecportError
from .engine import Scheduler
from .live import Close, Live
from .protocol import (
    CLOSE_CODES,
    ProtocolError,
    bad,
    parse_json,
    parse_request,
    pcm_from_bytes,
    ready_message,
)
from .ws import Socket, receive_by

log = logging.getLogger(__name__)
GONE = (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR)


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


class Server:
    """The app of one codec on `config`: `await start()` (returns the URL), `await drain()`,
    `await close()`. `serve()` runs the three around the signals."""

    def __init__(self, codec, config: ServeConfig):
        self.codec, self.config = codec, config
        self.scheduler = Scheduler(codec, config.slots, config.queue, config.max_backlog,
                                   input_bound=4 * config.max_message, batched=config.batched)
        self.app = web.Application()
        self.app.add_routes([web.get("/stream", self._stream), web.get("/health", self._health),
                             web.get("/metrics", self._metrics)])
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None
        self.url = ""
        self._greeting: set[web.WebSocketResponse] = set()  # connections before their request
        self._tasks: set[asyncio.Task] = set()

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
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self.url

    async def drain(self) -> None:
        """Stop accepting, let the streams in flight finish for `grace` s, then fail the rest."""
        cfg, sched = self.config, self.scheduler
        sched.drain()
        if self.site is not None:
            await self.site.stop()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.grace
        for ws in list(self._greeting):
            self._spawn(self._refuse(ws, ProtocolError("shutting_down", "the server is stopping; connect "
                                                                        "to another")))
        while sched.lives and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for live in list(sched.lives):
            live.fail(ProtocolError("shutting_down", f"the server stopped; its grace time ({cfg.grace:g} s) "
                                                     "for the streams in flight is over"))
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=cfg.close_timeout + 1)

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        await self.scheduler.stop()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- plain routes -------------------------------------------------------------------------
    def health(self) -> dict:
        sched = self.scheduler
        return {"ok": not sched.draining, "codec": self.codec.name, "preset": self.codec.preset,
                "slots": {"total": sched.size, "active": sched.holding},
                "pools": {side: {"total": sched.size, "active": sched.active(side),
                                 "batch": min(pool.batch, sched.size)}
                          for side, pool in sched.pools.items()},
                "queued": len(sched.waiting), "connections": sched.connections, "draining": sched.draining}

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(self.health(), status=503 if self.scheduler.draining else 200)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.scheduler.metrics.render(), content_type="text/plain",
                            headers={"X-Content-Type-Options": "nosniff"}, charset="utf-8")

    # ---- the stream ---------------------------------------------------------------------------
    async def _stream(self, request: web.Request) -> web.StreamResponse:
        cfg, sched = self.config, self.scheduler
        ws = Socket(max_msg_size=cfg.max_message, compress=False, heartbeat=cfg.heartbeat,
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
        sched.connections += 1
        live = None
        try:
            live = await self._open(ws)
            if live is not None:
                await self._run(request, ws, live)
        except ProtocolError as e:
            await self._refuse(ws, e)
        except (ConnectionError, asyncio.TimeoutError) as e:
            log.info("a client went away: %s", e)
        except Exception as e:  # one connection's bug ends that connection, never the server
            log.exception("internal error on a stream")
            await self._refuse(ws, ProtocolError("internal", f"{type(e).__name__}: {e}".splitlines()[0]))
        finally:
            sched.connections -= 1
            self._greeting.discard(ws)
            if live is not None:
                sched.leave(live)
        return ws

    async def _refuse(self, ws: web.WebSocketResponse, error: ProtocolError) -> None:
        """The JSON error, then the close, in `close_timeout` at most."""
        self.scheduler.metrics.errors[error.code] += 1
        log.info("refused a stream: %s: %s", error.code, error)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._error_close(ws, error), self.config.close_timeout)

    @staticmethod
    async def _error_close(ws: web.WebSocketResponse, error: ProtocolError) -> None:
        if not ws.closed:
            ws.told = True
            await ws.send_str(error.to_json())
            await ws.close(code=CLOSE_CODES.get(error.code, 1008))

    def _note(self, msg) -> None:
        """A connection that ended on an error (a message too large: the client was told)."""
        if msg.type is WSMsgType.ERROR:
            code = getattr(msg.data, "code", None)
            self.scheduler.metrics.errors["too_large" if code == WSCloseCode.MESSAGE_TOO_BIG
                                          else "bad_request"] += 1
            log.info("a stream ended on %s", msg.data)

    async def _open(self, ws: web.WebSocketResponse) -> Live | None:
        """The handshake: the request, a slot (maybe after the queue), the ready reply. None if
        the client left first."""
        cfg = self.config
        self._greeting.add(ws)
        try:
            msg = await receive_by(ws, asyncio.get_running_loop().time() + cfg.handshake_timeout)
        except asyncio.TimeoutError:
            raise ProtocolError("timeout", f"no request in {cfg.handshake_timeout:g} s; the first message is "
                                           "the JSON request (docs/serve.md)") from None
        finally:
            self._greeting.discard(ws)  # from here a drain reaches it through the scheduler
        if msg.type is WSMsgType.BINARY:
            raise bad("binary data before the handshake; the first message is the JSON request "
                      "(docs/serve.md)")
        if msg.type is not WSMsgType.TEXT:
            self._note(msg)
            return None
        if self.scheduler.draining:
            raise ProtocolError("shutting_down", "the server is stopping; connect to another")
        live = Live(self.scheduler, parse_request(msg.data, self.codec))
        try:
            if not await self._admit(ws, live):
                self.scheduler.leave(live)
                return None
            await ws.send_str(json.dumps(ready_message(self.codec, live.request, live.slots)))
        except BaseException:
            self.scheduler.leave(live)
            raise
        return live

    async def _admit(self, ws: web.WebSocketResponse, live: Live) -> bool:
        """Slots for `live`, while watching the socket: a client that leaves the queue leaves it
        at once. False if it left."""
        async def tell(text: str) -> None:
            with contextlib.suppress(ConnectionError, RuntimeError):  # gone: the watch below sees it
                await ws.send_str(text)

        def queued(message: dict) -> None:
            self._spawn(tell(json.dumps(message)))

        acquire = asyncio.ensure_future(self.scheduler.acquire(live, self.config.queue_timeout, queued))
        watch = asyncio.ensure_future(ws.receive())
        try:
            done, _ = await asyncio.wait({acquire, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watch, acquire):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        if watch in done and watch.exception() is None:
            msg = watch.result()
            if msg.type in GONE:
                self._note(msg)
                return False
            raise bad("a message before the ready reply; wait for it before sending")
        acquire.result()  # raises the refusal (busy, shutting_down)
        return True

    async def _run(self, request: web.Request, ws: web.WebSocketResponse, live: Live) -> None:
        """The receive loop of a stream with slots; its sender runs beside it."""
        sender = asyncio.ensure_future(self._send(ws, live))
        closing: list[asyncio.Task] = []
        live.on_fail = lambda: closing.append(self._spawn(self._close_failed(request, ws, live, sender)))
        if live.error is not None:  # failed between its ready reply and now (a drain)
            live.on_fail()
        loop = asyncio.get_running_loop()
        try:
            heard = loop.time()  # the client's last message (pings and pongs are not input)
            while not live.closed:
                if sender.done() or request.transport is None or request.transport.is_closing():
                    break  # gone: what aiohttp had read before is input nobody waits for now
                if not live.room.is_set():  # the engine is behind this client's input: stop reading
                    if await self._gone_while_paused(request, live, sender):
                        break
                    heard = loop.time()  # the pause was the server's: its idle time starts now
                    continue
                idle = None if any(live.end_asked.values()) else self.config.idle_timeout
                try:
                    msg = await receive_by(ws, None if idle is None else heard + idle)
                    if msg.type is not WSMsgType.BINARY or msg.data:  # an empty message is no input
                        heard = loop.time()
                except asyncio.TimeoutError:
                    raise ProtocolError("timeout", f"no input for {idle:g} s; a stream that sends nothing "
                                                   "gives its slots back "
                                                   "(send {\"op\": \"end\"} when done)") from None
                if msg.type is WSMsgType.BINARY:
                    if live.request.op == "decode":
                        live.put_codes(live.layout.unpack(msg.data))
                    else:
                        live.put_pcm(pcm_from_bytes(msg.data, live.request.pcm))
                elif msg.type is WSMsgType.TEXT:
                    op = parse_json(msg.data)["op"]
                    if op != "end":
                        raise bad('after the handshake the only text message is {"op": "end"}, '
                                  f'got op {op!r}')
                    live.end()
                else:
                    self._note(msg)
                    break
        except ProtocolError as e:
            live.fail(e)
        finally:
            if not live.closed:  # left mid-stream: its slots go back now
                self.scheduler.leave(live)
                sender.cancel()
            tasks = [sender, *closing]
            await asyncio.wait(tasks, timeout=2 * self.config.close_timeout + 1)
            if not all(t.done() for t in tasks):
                for t in tasks:
                    t.cancel()
                if request.transport is not None:
                    request.transport.abort()

    @staticmethod
    async def _gone_while_paused(request: web.Request, live: Live, sender: asyncio.Task) -> bool:
        """Wait for room for more input; True if the client went away meanwhile. Its socket is
        not read while paused, so its leaving shows as a closing transport or a sender that
        failed to write, checked every half second."""
        while not live.room.is_set():
            if sender.done() or request.transport is None or request.transport.is_closing():
                return True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(live.room.wait(), 0.5)
        return False

    async def _send(self, ws: web.WebSocketResponse, live: Live) -> None:
        """The stream's output, in order, then the close after done."""
        try:
            while True:
                item = await live.outbox.get()
                if isinstance(item, Close):
                    await asyncio.wait_for(ws.close(code=item.code), self.config.close_timeout)
                    return
                if isinstance(item, str):
                    await ws.send_str(item)
                else:
                    await ws.send_bytes(item)
                    live.sent(len(item))
        except (ConnectionError, RuntimeError, asyncio.TimeoutError) as e:
            log.info("a client went away while being sent to: %s", e)

    async def _close_failed(self, request: web.Request, ws: web.WebSocketResponse, live: Live,
                            sender: asyncio.Task) -> None:
        """A failed stream: stop its sender (its backlog was dropped), send the error, close; a
        client that reads nothing is cut off after `close_timeout`."""
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender
        log.info("ended a stream: %s: %s", live.error.code, live.error)
        try:
            await asyncio.wait_for(self._error_close(ws, live.error), self.config.close_timeout)
        except (asyncio.TimeoutError, ConnectionError, RuntimeError):
            if request.transport is not None:
                request.transport.abort()


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
