"""One `codec-serve` connection: its WebSocket (ws.py), from the handshake to the close.

The connection owns the socket and the tasks around it: the handshake (the request, a slot from
the scheduler, maybe after the queue, the ready reply), a reader that puts the client's input
into its stream (live.py) and a sender that writes the stream's output, and the refusal that
ends a failed stream. It asks the scheduler (engine.py) for slots and gives them back
(`acquire`, `leave`); it learns that its stream failed from the stream (`Live.failed`), never
by a callback, and sends the error itself, as the socket's only reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from .config import ServeConfig
from .engine import Scheduler
from .live import Close, Live
from .protocol import CLOSE_CODES, ProtocolError, bad, parse_json, parse_request, ready_message
from .sockets import Kind, Message, Socket, receive_by, refuse

log = logging.getLogger(__name__)
# A message past this many bytes is made into input on the conversion threads (PCM checked and
# resampled, codes split by level), not on the event loop: up to --max-message there (1 MiB, a
# second of soxr's VHQ work at 48 kHz in), which would hold every other connection meanwhile.
# Smaller ones stay on the loop, where a hand-off would cost more than the work.
OFFLOAD_BYTES = 64 << 10


async def converted(executor, fn: Callable, data: bytes):
    """`fn(data)`: on `executor` (a conversion thread) for a message past `OFFLOAD_BYTES`, else
    here. The one rule of both transports (the local server's and the Ray replica's)."""
    if len(data) <= OFFLOAD_BYTES:
        return fn(data)
    return await asyncio.get_running_loop().run_in_executor(executor, fn, data)


async def _cancelled(*tasks: asyncio.Future) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)


class Connection:
    """A stream's WebSocket `ws` (ws.Socket on aiohttp, asgi.AsgiSocket on Ray Serve: what this
    class asks of a socket, each gives); `serve()` runs it to its end. `convert(fn, data)`
    runs `fn(data)` (a message's bytes made into input) where the server says (off the event
    loop, for a large one)."""

    def __init__(self, ws: Socket, config: ServeConfig, scheduler: Scheduler, codec,
                 convert: Callable[[Callable, bytes], Awaitable]):
        self.ws, self.config, self.scheduler, self.codec = ws, config, scheduler, codec
        self.convert = convert
        self.greeting = False  # waiting for the client's request (a drain refuses it itself)
        self._notices: set[asyncio.Task] = set()

    async def serve(self) -> None:
        sched = self.scheduler
        sched.connections += 1
        live = None
        try:
            live = await self._open()
            if live is not None:
                await self._run(live)
        except ProtocolError as e:
            await self.refuse(e)
        except (ConnectionError, asyncio.TimeoutError) as e:
            log.info("a client went away: %s", e)
        except Exception as e:  # one connection's bug ends that connection, never the server
            log.exception("internal error on a stream")
            await self.refuse(ProtocolError("internal", f"{type(e).__name__}: {e}".splitlines()[0]))
        finally:
            sched.connections -= 1
            self.greeting = False
            if live is not None:
                sched.leave(live)
            if self.ws.failure is not None:  # the socket refused the client itself (and said why)
                sched.metrics.errors[self.ws.failure] += 1

    async def refuse(self, error: ProtocolError, counted: bool = False) -> None:
        """The JSON error, then the close (sockets.refuse). `counted`: the stream counted it."""
        if not counted:
            self.scheduler.metrics.errors[error.code] += 1
        log.info("%s a stream: %s: %s", "ended" if counted else "refused", error.code, error)
        await refuse(self.ws, error.to_json(), CLOSE_CODES.get(error.code, 1008), self.config.close_timeout)

    @staticmethod
    def _note(msg: Message) -> None:
        """A connection that ended on an error of the socket's (a message too large: the client
        was told, and the socket's `failure` is counted at the end)."""
        if msg.kind is Kind.ERROR:
            log.info("a stream ended on %s", msg.why)

    # ---- the handshake ------------------------------------------------------------------------
    async def _open(self) -> Live | None:
        """The request, a slot (maybe after the queue), the ready reply. None if the client left
        first."""
        cfg, sched, ws = self.config, self.scheduler, self.ws
        self.greeting = True
        try:
            msg = await receive_by(ws, asyncio.get_running_loop().time() + cfg.handshake_timeout)
        except asyncio.TimeoutError:
            raise ProtocolError("timeout", f"no request in {cfg.handshake_timeout:g} s; the first message is "
                                           "the JSON request (docs/serve.md)") from None
        finally:
            self.greeting = False  # from here a drain reaches it through the scheduler
        if msg.kind is Kind.BINARY:
            raise bad("binary data before the handshake; the first message is the JSON request "
                      "(docs/serve.md)")
        if msg.kind is not Kind.TEXT:
            self._note(msg)
            return None
        if sched.draining:
            raise ProtocolError("shutting_down", "the server is stopping; connect to another")
        live = sched.stream(parse_request(msg.data, self.codec))
        try:
            if not await self._admit(live):
                sched.leave(live)
                return None
            await ws.send_str(json.dumps(ready_message(self.codec, live.request, sched.slots_of(live))))
        except BaseException:
            sched.leave(live)
            raise
        return live

    async def _admit(self, live: Live) -> bool:
        """Slots for `live`, while watching the socket: a client that leaves the queue leaves it
        at once. False if it left."""
        ws = self.ws

        async def tell(text: str) -> None:
            with contextlib.suppress(ConnectionError, RuntimeError):  # gone: the watch below sees it
                await ws.send_str(text)

        def queued(message: dict) -> None:
            task = asyncio.ensure_future(tell(json.dumps(message)))
            self._notices.add(task)
            task.add_done_callback(self._notices.discard)

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
            if msg.kind in (Kind.CLOSED, Kind.ERROR):
                self._note(msg)
                return False
            raise bad("a message before the ready reply; wait for it before sending")
        acquire.result()  # raises the refusal (busy, shutting_down)
        return True

    # ---- the stream ---------------------------------------------------------------------------
    async def _run(self, live: Live) -> None:
        """The reader and the sender of a stream with slots, until it is done, fails or its
        client leaves."""
        cfg = self.config
        sender = asyncio.ensure_future(self._send(live))
        reader = asyncio.ensure_future(self._read(live, sender))
        failed = asyncio.ensure_future(live.failed.wait())
        try:
            await asyncio.wait({reader, failed}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done() and not reader.cancelled() and reader.exception() is not None:
                if not isinstance(reader.exception(), ProtocolError):
                    raise reader.exception()
                live.fail(reader.exception())
            if live.error is not None:
                # Its slots go back now; the reader stops putting input in (the socket's input is
                # dropped from here: Socket.refuse), the sender's backlog is dropped.
                self.scheduler.leave(live)
                await _cancelled(reader, sender)
                await self.refuse(live.error, counted=True)
                return
            if not live.closed:  # left mid-stream: its slots go back now
                self.scheduler.leave(live)
                sender.cancel()
            await asyncio.wait({sender}, timeout=2 * cfg.close_timeout + 1)
            if not sender.done():
                sender.cancel()
                self.ws.abort()
        finally:
            for task in (reader, sender, failed):
                task.cancel()

    def _gone(self, sender: asyncio.Task) -> bool:
        return sender.done() or self.ws.gone()

    async def _read(self, live: Live, sender: asyncio.Task) -> None:
        """The client's messages into its stream, until it leaves or the socket closes after
        done; `ProtocolError` for what is refused."""
        loop, ws = asyncio.get_running_loop(), self.ws
        heard = loop.time()  # the client's last message (pings and pongs are not input)
        while True:
            if self._gone(sender):
                return  # gone: what aiohttp had read before is input nobody waits for now
            if not live.room.is_set():  # the engine is behind this client's input: stop reading
                if await self._gone_while_paused(live, sender):
                    return
                heard = loop.time()  # the pause was the server's: its idle time starts now
                continue
            idle = None if live.input_ended else self.config.idle_timeout
            try:
                msg = await receive_by(ws, None if idle is None else heard + idle)
            except asyncio.TimeoutError:
                raise ProtocolError("timeout", f"no input for {idle:g} s; a stream that sends nothing "
                                               "gives its slots back "
                                               "(send {\"op\": \"end\"} when done)") from None
            if msg.kind is Kind.BINARY:
                if msg.data:  # an empty message is no input
                    heard = loop.time()
                if live.request.op == "decode":
                    live.put_codes(await self.convert(live.intake.codes, msg.data))
                else:
                    live.intake.check(len(msg.data))
                    live.put_pcm(await self.convert(live.intake.pcm, msg.data))
            elif msg.kind is Kind.TEXT:
                heard = loop.time()
                op = parse_json(msg.data)["op"]
                if op != "end":
                    raise bad(f'after the handshake the only text message is {{"op": "end"}}, got op {op!r}')
                live.end()
            else:
                self._note(msg)
                return

    async def _gone_while_paused(self, live: Live, sender: asyncio.Task) -> bool:
        """Wait for room for more input; True if the client went away meanwhile. Its socket is
        not read while paused, so its leaving shows as a closing transport or a sender that
        failed to write, checked every half second."""
        while not live.room.is_set():
            if self._gone(sender):
                return True
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(live.room.wait(), 0.5)
        return False

    async def _send(self, live: Live) -> None:
        """The stream's output, in order, then the close after done."""
        ws = self.ws
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
