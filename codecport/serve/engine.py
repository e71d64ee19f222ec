"""The scheduler under `codec-serve`: slot pools of the runtime (runtime/slots.py) stepped by one
asyncio task, and each connection's stream (`Live`) as that task sees it.

One `SlotPool` per side the codec streams, `--slots` slots each; a connection holds a slot of
each side its op needs. The scheduler wakes when a stream gets input (an `asyncio.Event`), and
runs one `pool.step(ready slots)` per pool in a one-thread executor (ONNX Runtime releases the
GIL) for the slots that have something to do, as soon as any has: it never waits to fill a batch,
and a slot with nothing to do costs the others nothing. Each output piece goes to its stream's
outgoing queue; a sender task per connection (server.py) writes it to the socket.

Slots are touched only by this task and never while a step is in flight: input waits in its
stream (`Live.pending`) until the slot has finished the last, and a slot opens and closes
between steps (a connection that leaves frees its slot at once, or after the step in flight).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import CodecportError
from ..runtime.slots import SlotPool
from .metrics import Metrics
from .protocol import TAG_AUDIO, TAG_CODES, CodeLayout, ProtocolError, Request, group_frames, pcm_to_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Close:
    """The sender's last item: close the WebSocket with `code` (1000 after done)."""

    code: int = 1000


class Outbox:
    """A connection's messages not yet sent, in order; a warning may go to the front."""

    def __init__(self):
        self.items: deque = deque()
        self._ready = asyncio.Event()

    def put(self, item, front: bool = False) -> None:
        (self.items.appendleft if front else self.items.append)(item)
        self._ready.set()

    def clear(self) -> None:
        self.items.clear()

    async def get(self):
        while not self.items:
            self._ready.clear()
            await self._ready.wait()
        return self.items.popleft()


class Live:
    """One connection's stream: its slots, the input not yet fed to them, and the messages not
    yet sent (`outbox`, `backlog` bytes). The server puts input in (`put_pcm`, `put_codes`,
    `end`), the scheduler feeds and steps it and `emit`s its output."""

    def __init__(self, scheduler: Scheduler, request: Request):
        self.scheduler, self.request, codec = scheduler, request, scheduler.codec
        self.layout = CodeLayout.of(codec, request.codebooks)
        self.slots: dict = {}  # side -> Slot, once granted
        self.granted: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending: dict[str, list] = {side: [] for side in request.sides}
        self.pending_bytes = 0
        self.room = asyncio.Event()  # set while the pending input is under the bound
        self.room.set()
        self.end_asked = dict.fromkeys(request.sides, False)
        self.ended = dict.fromkeys(request.sides, False)
        self.finished: set[str] = set()
        self.outbox = Outbox()
        self.backlog, self.warned = 0, False
        self.error: ProtocolError | None = None  # why it failed
        self.complete = False  # done was queued
        self.on_fail = None  # the server's: stop the sender, send the error, close
        self.frames = dict.fromkeys(request.sides, 0)
        self.samples = dict.fromkeys(request.sides, 0)
        self.coarse_in = 0  # coarse frames of codes received (decode)
        self.resampler = None
        if "encoder" in request.sides and request.sample_rate != codec.sample_rate:
            import soxr

            # VHQ, streamed: the samples of one `soxr.resample` of the whole input, as codec-run's.
            self.resampler = soxr.ResampleStream(request.sample_rate, codec.sample_rate, 1, dtype="float32",
                                                 quality="VHQ")

    def settings(self, side: str) -> dict:
        """The stream settings of this stream's `side` slot."""
        if side == "encoder":
            return {"n_codebooks": self.request.codebooks}
        return {} if self.request.noise is None else {"noise": self.request.noise}

    @property
    def closed(self) -> bool:
        return self.complete or self.error is not None

    # ---- input, from the connection ---------------------------------------------------------
    def _queue(self, side: str, x, nbytes: int) -> None:
        self.pending[side].append(x)
        self.pending_bytes += nbytes
        if self.pending_bytes > self.scheduler.input_bound:
            self.room.clear()
        self.scheduler.wake()

    def put_pcm(self, x: np.ndarray) -> None:
        """float32 samples at the input's rate (encode, duplex)."""
        if any(self.end_asked.values()):
            raise ProtocolError("bad_request", "input after {\"op\": \"end\"}; open another stream")
        if self.resampler is not None:
            x = self.resampler.resample_chunk(x)
        if len(x):
            self._queue("encoder", x, x.nbytes)

    def put_codes(self, levels: list[np.ndarray]) -> None:
        """Code frames, one `[rows, frames_l]` array per level (decode)."""
        if self.end_asked["decoder"]:
            raise ProtocolError("bad_request", "input after {\"op\": \"end\"}; open another stream")
        frames = self.layout.frames(levels)
        if frames:
            self.coarse_in += frames
            self._queue("decoder", levels, sum(a.nbytes for a in levels))

    def end(self) -> None:
        """The input is over: flush and finish (the decoder of a duplex stream ends after its encoder)."""
        side = self.request.sides[0]
        if self.end_asked[side]:
            raise ProtocolError("bad_request", "a second {\"op\": \"end\"}")
        group = group_frames(self.scheduler.codec)
        if side == "decoder" and self.coarse_in % group:
            raise ProtocolError("bad_input", f"the stream ended after {self.coarse_in} coarse frames; "
                                             f"{self.scheduler.codec.label} decodes whole groups of {group}")
        if self.resampler is not None:
            tail = self.resampler.resample_chunk(np.zeros(0, np.float32), last=True)
            if len(tail):
                self._queue("encoder", tail, tail.nbytes)
        self.end_asked[side] = True
        self.scheduler.wake()

    # ---- output, from the scheduler ---------------------------------------------------------
    def emit(self, side: str, piece: np.ndarray) -> None:
        metrics = self.scheduler.metrics
        duplex = self.request.op == "duplex"
        if side == "encoder":
            codes = piece
            n = codes.shape[1]
            if n:
                self.frames[side] += n
                metrics.frames[side] += n
                self._send((TAG_CODES if duplex else b"") + self.layout.pack([codes]))
                if duplex:
                    self.pending["decoder"].append([codes])
                    self.coarse_in += n
        elif len(piece):
            self.samples[side] += len(piece)
            metrics.samples[side] += len(piece)
            self._send((TAG_AUDIO if duplex else b"") + pcm_to_bytes(piece, self.request.pcm))

    def side_finished(self, side: str) -> None:
        self.finished.add(side)
        if side == "encoder" and "decoder" in self.request.sides:
            self.end_asked["decoder"] = True
        if self.finished == set(self.request.sides) and not self.closed:
            self.complete = True
            self.scheduler.metrics.done[self.request.op] += 1
            self.outbox.put(json.dumps({"op": "done", "frames": self.frames, "samples": self.samples}))
            self.outbox.put(Close(1000))

    def _send(self, data: bytes) -> None:
        if self.closed:
            return
        self.backlog += len(data)
        self.outbox.put(data)
        bound, metrics = self.scheduler.max_backlog, self.scheduler.metrics
        if self.backlog > bound:
            metrics.drops += 1
            log.info("dropping a slow reader: %d bytes not sent", self.backlog)
            self.fail(ProtocolError("behind", f"dropped: {self.backlog} bytes of output were waiting for "
                                              f"this client (bound {bound}); read faster, or open fewer streams"))
        elif self.backlog > bound // 2 and not self.warned:
            self.warned = True
            metrics.warnings += 1
            # At the front: the next message the client gets, ahead of the backlog it warns of.
            self.outbox.put(json.dumps({
                "op": "warning", "code": "behind", "backlog": self.backlog, "bound": bound,
                "message": f"{self.backlog} bytes of output wait for this client; past {bound} it is dropped"}),
                front=True)

    def sent(self, nbytes: int) -> None:
        """The sender wrote `nbytes` of output."""
        self.backlog -= nbytes
        if self.backlog < self.scheduler.max_backlog // 4:
            self.warned = False

    def fail(self, error: ProtocolError) -> None:
        """End the stream with `error`: its slots go back at once, its queued output is dropped,
        and the server sends the error and closes."""
        if self.closed:
            return
        self.error = error
        self.scheduler.metrics.errors[error.code] += 1
        self.outbox.clear()
        self.backlog = 0
        self.room.set()
        self.scheduler.leave(self)
        if self.on_fail is not None:
            self.on_fail()


def _step(pools: dict[str, SlotPool], work: dict[str, list]) -> list:
    """One step of each pool's ready slots (in the executor's thread): (side, slots, outputs,
    seconds, exception)."""
    out = []
    for side, slots in work.items():
        t0 = time.perf_counter()
        try:
            out.append((side, slots, pools[side].step(slots), time.perf_counter() - t0, None))
        except Exception as e:  # noqa: BLE001 (given to the streams of this step, never lost)
            out.append((side, slots, {}, time.perf_counter() - t0, e))
    return out


class Scheduler:
    """The pools of `codec`, `size` slots a side, the admission queue (`queue` waiting at most),
    and the task that steps them (`run`)."""

    def __init__(self, codec, size: int, queue: int = 0, max_backlog: int = 4 << 20,
                 input_bound: int = 4 << 20):
        self.codec, self.size, self.queue_limit = codec, size, queue
        self.max_backlog, self.input_bound = max_backlog, input_bound
        self.pools = {side: SlotPool(codec, side, size) for side in codec.streams}
        self.held = dict.fromkeys(self.pools, 0)  # slots granted or being granted, per side
        self.lives: dict[Live, None] = {}  # streams holding slots, in the order they came
        self.owner: dict = {}  # slot -> Live
        self.waiting: deque[Live] = deque()  # queued for slots
        self.opening: list[Live] = []  # granted, slots to open between steps
        self.closing: list = []  # slots to close between steps
        self.metrics = Metrics(tuple(self.pools), self.gauges)
        self.connections = 0
        self.draining = False
        self._wake = asyncio.Event()
        self._stepping = self._stopping = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="codec-serve-step")
        self._task: asyncio.Task | None = None

    # ---- facts -------------------------------------------------------------------------------
    def active(self, side: str) -> int:
        return self.held[side]

    def gauges(self) -> dict:
        sides = list(self.pools)
        return {"slots": [(f'side="{s}"', self.size) for s in sides],
                "active_slots": [(f'side="{s}"', self.held[s]) for s in sides],
                "connections": [("", self.connections)], "queued": [("", len(self.waiting))],
                "draining": [("", int(self.draining))]}

    # ---- admission ---------------------------------------------------------------------------
    def _fits(self, live: Live) -> bool:
        return all(self.held[side] < self.size for side in live.request.sides)

    def _reserve(self, live: Live) -> None:
        for side in live.request.sides:
            self.held[side] += 1
        self.opening.append(live)

    async def acquire(self, live: Live, timeout: float, on_queued=None) -> None:
        """Slots for `live` (opened between steps), waiting in the queue up to `timeout` s when
        there is one (`on_queued(message)` is told its place); `ProtocolError("busy")` when there
        are none (or "shutting_down")."""
        if self.draining:
            raise ProtocolError("shutting_down", "the server is stopping; connect to another")
        queued = False
        if not self.waiting and self._fits(live):
            self._reserve(live)
            self._settle()
        elif len(self.waiting) < self.queue_limit:
            self.waiting.append(live)
            queued = True
            if on_queued is not None:
                on_queued({"op": "queued", "position": len(self.waiting), "timeout": timeout})
        else:
            self.metrics.busy += 1
            raise ProtocolError("busy", f"all {self.size} slots are taken and "
                                        + (f"the queue of {self.queue_limit} is full" if self.queue_limit
                                           else "there is no queue (--queue)") + "; try again later")
        try:
            await asyncio.wait_for(asyncio.shield(live.granted), timeout if queued else None)
        except asyncio.TimeoutError:
            if live in self.waiting:
                self.waiting.remove(live)
                self.metrics.busy += 1
                raise ProtocolError("busy", f"no slot came free in {timeout:g} s of waiting; try again "
                                            "later") from None
            await live.granted  # granted as the wait ran out: the slots open at the next settle
        except asyncio.CancelledError:
            self.leave(live)
            raise
        if live.granted.exception() is not None:
            raise live.granted.exception()

    def drain(self) -> None:
        """Refuse new streams and the queued ones; the streaming ones go on."""
        self.draining = True
        while self.waiting:
            live = self.waiting.popleft()
            if not live.granted.done():
                live.granted.set_exception(ProtocolError("shutting_down", "the server is stopping; connect "
                                                                          "to another"))

    def leave(self, live: Live) -> None:
        """`live` is gone (or done, or failed): its slots go back now, or after the step in flight."""
        if live in self.waiting:
            self.waiting.remove(live)
        if live in self.opening:
            self.opening.remove(live)
            for side in live.request.sides:
                self.held[side] -= 1
        if live in self.lives:
            del self.lives[live]
            self.closing.extend(live.slots.values())
        if not live.granted.done():
            live.granted.cancel()
        self._settle()
        self.wake()

    def _settle(self) -> None:
        """Between steps: close what left, grant what waits, open what was granted."""
        if self._stepping:
            return
        for slot in self.closing:
            slot.close()
            self.owner.pop(slot, None)
            self.held[slot.pool.side] -= 1
        self.closing = []
        while self.waiting and self._fits(self.waiting[0]):
            self._reserve(self.waiting.popleft())
        for live in self.opening:
            try:
                for side in live.request.sides:
                    slot = self.pools[side].open(**live.settings(side))
                    if slot is None:  # cannot happen while `held` counts every open slot
                        raise ProtocolError("internal", f"the {side} pool had no free slot")
                    live.slots[side] = slot
                    self.owner[slot] = live
            except CodecportError as e:
                for slot in live.slots.values():
                    slot.close()
                    self.owner.pop(slot, None)
                for side in live.request.sides:
                    self.held[side] -= 1
                live.slots = {}
                live.granted.set_exception(e if isinstance(e, ProtocolError) else ProtocolError("internal", str(e)))
                continue
            self.lives[live] = None
            self.metrics.streams[live.request.op] += 1
            if not live.granted.done():
                live.granted.set_result(None)
        self.opening = []

    # ---- stepping ----------------------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="codec-serve-scheduler")

    async def stop(self) -> None:
        """Let the step in flight end, then stop (the streams have been ended or failed)."""
        self._stopping = True
        self.wake()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._settle()
            self._feed()
            work: dict[str, list] = {}
            for live in list(self.lives):
                for side, slot in live.slots.items():
                    if slot.ready():
                        work.setdefault(side, []).append(slot)
            if not work:
                if self._stopping:
                    return
                continue
            self._stepping = True
            try:
                results = await loop.run_in_executor(self._executor, _step, self.pools, work)
            finally:
                self._stepping = False
            self._deliver(results)
            self._settle()
            self.wake()  # look again: a slot may still have input or a flush to give

    def _feed(self) -> None:
        """Move each stream's pending input into its slot (all of it, as one piece), once the
        slot has taken the last; then end the slots whose input is over."""
        for live in list(self.lives):
            for side, slot in live.slots.items():
                pending = live.pending[side]
                if pending and not slot.ready():
                    if side == "encoder":
                        x = pending[0] if len(pending) == 1 else np.concatenate(pending)
                    else:
                        x = [np.concatenate(lv, axis=1) for lv in zip(*pending)]
                        self.metrics.frames[side] += live.layout.frames(x)
                    live.pending[side] = []
                    try:
                        slot.feed(x)
                    except CodecportError as e:
                        live.fail(ProtocolError("bad_input", str(e)))
                        break
                    if side == "encoder":
                        self.metrics.samples[side] += len(x)
                if live.end_asked[side] and not live.pending[side] and not live.ended[side]:
                    try:
                        slot.end()
                    except CodecportError as e:
                        live.fail(ProtocolError("bad_input", str(e)))
                        break
                    live.ended[side] = True
            live.pending_bytes = sum(a.nbytes for p in live.pending.values() for x in p
                                     for a in (x if isinstance(x, list) else [x]))
            if live.pending_bytes <= self.input_bound:
                live.room.set()

    def _deliver(self, results: list) -> None:
        for side, slots, outputs, seconds, error in results:
            self.metrics.step(side, seconds, len(slots))
            if error is not None:
                # A step failed: every stream in it may have lost a piece, so each is ended.
                log.error("a %s step of %d slots failed: %s", side, len(slots), error, exc_info=error)
                for slot in slots:
                    live = self.owner.get(slot)
                    if live is not None:
                        code = "bad_input" if isinstance(error, CodecportError) and len(slots) == 1 else "internal"
                        live.fail(ProtocolError(code, str(error).splitlines()[0] if str(error) else
                                                type(error).__name__))
                continue
            for slot, piece in outputs.items():
                live = self.owner.get(slot)
                if live is None or live.closed:
                    continue
                live.emit(side, piece)
                if live.ended[side] and slot.finished and not live.closed:
                    live.side_finished(side)
                    if live.complete:
                        self.leave(live)
