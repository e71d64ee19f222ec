"""The scheduler under `codec-serve`: slot pools of the runtime (runtime/slots.py) stepped by one
asyncio task for the connections' streams (live.py), and the admission of new ones.

One pool per side the codec streams (runtime/slots.py: a `SlotPool` stepping step graphs, or a
`WindowPool` whose streams run whole windows), `--slots` slots each; a connection holds a slot of
each side its op needs. The scheduler wakes when a stream gets input (an `asyncio.Event`), and
runs one `pool.step(ready slots)` per pool, the encoder's first, in a one-thread executor (ONNX
Runtime releases the GIL) for the slots that have something to do, as soon as any has (a duplex
stream's codes are fed to its decoder between the two): it never waits to fill a batch,
and a slot with nothing to do costs the others nothing. Each output piece goes to its stream's
outgoing queue; a sender task per connection (server.py) writes it to the socket.

Slots are touched only by this task and never while a step is in flight: input waits in its
stream (`Live.pending`) until the slot has finished the last, and a slot opens and closes
between steps (a connection that leaves frees its slot at once, or after the step in flight).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import CodecportError
from ..runtime.slots import open_pool
from .live import Live
from .metrics import Metrics
from .protocol import ProtocolError

log = logging.getLogger(__name__)


def _step(pools: dict, work: dict[str, list]) -> list:
    """One step of each pool's ready slots (in the executor's thread): (side, slots, outputs,
    the slots that failed alone, seconds, the exception that failed the whole step)."""
    out = []
    for side, slots in work.items():
        t0 = time.perf_counter()
        try:
            pieces, failed = pools[side].step(slots)
            out.append((side, slots, pieces, failed, time.perf_counter() - t0, None))
        except Exception as e:  # noqa: BLE001 (given to the streams of this step, never lost)
            out.append((side, slots, {}, {}, time.perf_counter() - t0, e))
    return out


def _first_line(e: Exception) -> str:
    """What a client is told of an exception: its first line, or its type when it has none."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class Scheduler:
    """The pools of `codec`, `size` slots a side (through the folder's batched step graphs where
    it has them, unless `batched=False`), the admission queue (`queue` waiting at most), and the
    task that steps them (`run`)."""

    def __init__(self, codec, size: int, queue: int = 0, max_backlog: int = 4 << 20,
                 input_bound: int = 4 << 20, batched: bool = True):
        self.codec, self.size, self.queue_limit = codec, size, queue
        self.max_backlog, self.input_bound = max_backlog, input_bound
        self.pools = {side: open_pool(codec, side, size, batched) for side in codec.streams}
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

    @property
    def holding(self) -> int:
        """Streams holding slots: those running, and those gone whose slots go back after the
        step in flight (until then a newcomer would be told busy, so they still count)."""
        return len(set(self.lives) | {self.owner[s] for s in self.closing if s in self.owner})

    def gauges(self) -> dict:
        sides = list(self.pools)
        return {"slots": [(f'side="{s}"', self.size) for s in sides],
                "active_slots": [(f'side="{s}"', self.held[s]) for s in sides],
                "connections": [("", self.connections)], "queued": [("", len(self.waiting))],
                "draining": [("", int(self.draining))]}

    # ---- admission ---------------------------------------------------------------------------
    def _fits(self, live: Live, blocked: Collection = ()) -> bool:
        """Whether `live` has a free slot of each side it needs, none of them a side in `blocked`."""
        return all(self.held[side] < self.size and side not in blocked for side in live.request.sides)

    def _grant_waiting(self) -> None:
        """Grant the queue in its order, by sides: a stream waits only for those before it that
        need a side it needs (an encode stream is not held up by one waiting for a full decoder
        pool), and never takes a slot of a side one before it waits for (so none waits forever)."""
        blocked: set = set()
        for live in list(self.waiting):
            if self._fits(live, blocked):
                self.waiting.remove(live)
                self._reserve(live)
            else:
                blocked.update(live.request.sides)

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
        if self._fits(live, {side for w in self.waiting for side in w.request.sides}):
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
        self._grant_waiting()
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
                live.granted.set_exception(e if isinstance(e, ProtocolError)
                                           else ProtocolError("internal", str(e)))
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
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                if not await self._round() and self._stopping:
                    return
            except Exception as e:  # a bug: the streams are in an unknown state, the server goes on
                log.exception("a scheduling round failed; ending the streams it held")
                self._stepping = False
                for live in list(self.lives) + list(self.opening):
                    live.fail(ProtocolError("internal", f"the server failed a step ({type(e).__name__})"))
                self.opening = []
                self._settle()

    async def _round(self) -> bool:
        """Feed what waits, step every slot that is ready, deliver, a side at a time (the
        encoder's first: a duplex stream's codes reach its decoder in the same round, so its
        frame waits for one round rather than two); False when nothing was stepped."""
        stepped = False
        for side in sorted(self.pools, key=lambda s: s != "encoder"):
            self._settle()
            self._feed()
            work = [slot for live in list(self.lives) for s, slot in live.slots.items()
                    if s == side and slot.ready()]
            if not work:
                continue
            stepped = True
            # Until the outputs are delivered no slot changes hands: a stream that leaves meanwhile
            # is closed by the _settle after, so no piece can reach the stream that gets its slot.
            self._stepping = True
            try:
                results = await asyncio.get_running_loop().run_in_executor(
                    self._executor, _step, self.pools, {side: work})
                self._deliver(results)
            finally:
                self._stepping = False
        self._settle()
        if stepped:
            self.wake()  # look again: a slot may still have input or a flush to give
        return stepped

    def _feed(self) -> None:
        """Move each stream's pending input into its slot (all of it, as one piece), once the
        slot has taken the last; then end the slots whose input is over."""
        for live in list(self.lives):
            for side, slot in live.slots.items():
                if live.pending[side] and not slot.ready():
                    pending = live.take(side)
                    if side == "encoder":
                        x = pending[0] if len(pending) == 1 else np.concatenate(pending)
                    else:
                        x = [np.concatenate(lv, axis=1) for lv in zip(*pending)]
                        self.metrics.frames[side] += live.layout.frames(x)
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
            if sum(live.pending_bytes.values()) <= self.input_bound:
                live.room.set()
            self._check(live)  # ended with nothing left to step (its output all out already)

    def _check(self, live: Live) -> None:
        """Note the sides of `live` that have finished; once all have, it is done and leaves."""
        for side, slot in live.slots.items():
            if live.ended[side] and side not in live.finished and not live.closed and slot.finished:
                live.side_finished(side)
                self.wake()  # a duplex stream's decoder ends next
        if live.complete and live in self.lives:
            self.leave(live)

    def _deliver(self, results: list) -> None:
        for side, slots, outputs, failed, seconds, error in results:
            self.metrics.step(side, seconds, len(slots))
            for slot, e in failed.items():  # its own piece failed: that stream alone ends
                log.error("slot %d of the %s step failed: %s", slot.index, side, e, exc_info=e)
                live = self.owner.get(slot)
                if live is not None:
                    live.fail(ProtocolError("internal", _first_line(e)))
            if error is not None:
                # A step failed: every stream in it may have lost a piece, so each is ended.
                log.error("a %s step of %d slots failed: %s", side, len(slots), error, exc_info=error)
                for slot in slots:
                    live = self.owner.get(slot)
                    if live is not None:
                        code = ("bad_input" if isinstance(error, CodecportError) and len(slots) == 1
                                else "internal")
                        live.fail(ProtocolError(code, _first_line(error)))
                continue
            for slot, piece in outputs.items():
                live = self.owner.get(slot)
                if live is None or live.closed:
                    continue
                live.emit(side, piece)
                self._check(live)
