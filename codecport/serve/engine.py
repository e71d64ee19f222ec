"""The scheduler under `codec-serve`: slot pools of the runtime (runtime/slots.py) stepped by one
asyncio task for the connections' streams (live.py), and the admission of new ones (admission.py).

One pool per side the codec streams (runtime/slots.py: a `SlotPool` stepping step graphs, or a
`WindowPool` whose streams run whole windows), `--slots` slots each; a stream holds a slot of
each side its op needs. The scheduler wakes when a stream gets input, and runs a job per pool,
the encoder's first, in a one-thread executor (ONNX Runtime releases the GIL): each slot that
has finished its last input is given what its stream has waiting (joined there, off the event
loop), then one `pool.step` of the slots that have something to do, as soon as any has (a
duplex stream's codes are handed to its decoder between the two): it never waits to fill a
batch, and a slot with nothing to do costs the others nothing. Each output piece is packed into
its message there too, and handed to its stream (`Live.emit`), whose connection sends it.

The scheduler is the one owner of the slots: which stream holds which, when they open and
close. A slot is touched only by a job, and between jobs by this task: input waits in its stream
until the slot has finished the last, and a slot opens and closes between jobs (a stream that
leaves or fails gives its slots back at once, or after the job in flight).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..errors import CodecportError
from ..runtime.slots import open_pool
from .admission import Admission
from .config import ServeConfig
from .live import Limits, Live, Wire
from .metrics import Metrics
from .protocol import ProtocolError, Request

log = logging.getLogger(__name__)
# A job in flight this long, and this many times the slowest one before it, is stuck: a step is
# milliseconds, a window codec's window seconds at most, so an ONNX Runtime call that has not
# returned by then (a hung driver, a wedged device) never will, and the server says so.
STUCK_S, STUCK_X = 10.0, 50


def _first_line(e: Exception) -> str:
    """What a client is told of an exception: its first line, or its type when it has none."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


@dataclass
class Job:
    """One job of a pool (run in the executor's thread): each slot's input fed, the input of
    some ended, then one step of the slots that have something to do, their outputs packed. It
    touches only its slots and what it was given."""

    pool: object
    side: str
    feeds: dict = field(default_factory=dict)  # slot -> input pieces, joined here
    ends: list = field(default_factory=list)  # slots whose input ends after their feed
    slots: list = field(default_factory=list)  # the slots that may step
    wires: dict = field(default_factory=dict)  # slot -> its stream's Wire
    # The results:
    fed: int = 0  # samples (encoder) or code frames (decoder) fed
    refused: dict = field(default_factory=dict)  # slot -> why its input was refused
    stepped: list = field(default_factory=list)
    seconds: float = 0.0
    out: dict = field(default_factory=dict)  # slot -> (message, frames or samples, codes or None)
    failed: dict = field(default_factory=dict)  # slot -> why its own part of the step failed
    error: Exception | None = None  # why the whole step failed

    def _join(self, pieces: list):
        if self.side == "encoder":
            return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        return [np.concatenate(lv, axis=1) for lv in zip(*pieces)]

    def run(self) -> Job:
        for slot, pieces in self.feeds.items():
            try:
                x = self._join(pieces)
                slot.feed(x)
                self.fed += len(x) if self.side == "encoder" else self.wires[slot].layout.frames(x)
            except Exception as e:  # noqa: BLE001 (that stream alone is refused)
                self.refused[slot] = e
        for slot in self.ends:
            if slot not in self.refused:
                try:
                    slot.end()
                except Exception as e:  # noqa: BLE001
                    self.refused[slot] = e
        self.stepped = [s for s in self.slots if s not in self.refused and s.ready()]
        if not self.stepped:
            return self
        t0 = time.perf_counter()
        try:
            pieces, self.failed = self.pool.step(self.stepped)
        except Exception as e:  # noqa: BLE001 (given to the streams of this step, never lost)
            self.error, self.seconds = e, time.perf_counter() - t0
            return self
        self.seconds = time.perf_counter() - t0
        for slot, piece in pieces.items():
            try:
                self.out[slot] = self._pack(self.wires[slot], piece)
            except Exception as e:  # noqa: BLE001
                self.failed[slot] = e
        return self

    def _pack(self, wire: Wire, piece: np.ndarray):
        if self.side == "encoder":
            n = piece.shape[1]
            return (wire.codes(piece) if n else b""), n, (piece if wire.duplex else None)
        return (wire.audio(piece) if len(piece) else b""), len(piece), None


class Scheduler:
    """The pools of `codec`, `size` slots a side (through the folder's batched step graphs where
    it has them, unless `batched=False`), the admission queue (`queue` waiting at most), and the
    task that steps them (`run`)."""

    def __init__(self, codec, size: int, queue: int = ServeConfig.queue,
                 max_backlog: int = ServeConfig.max_backlog, input_bound: int = 4 * ServeConfig.max_message,
                 batched: bool = True):
        self.codec, self.size = codec, size
        self.limits = Limits(input_bound, max_backlog)
        self.pools = {side: open_pool(codec, side, size, batched) for side in codec.streams}
        self.admission = Admission(self.pools, size, queue)
        self.metrics = Metrics(tuple(self.pools), self.gauges)
        self.admission.metrics = self.metrics
        self.connections = 0
        self._holders: dict[Live, dict] = {}  # streams holding slots, in the order they came -> side -> slot
        self._owner: dict = {}  # slot -> Live
        self._closing: list = []  # slots to close between jobs
        self._wake = asyncio.Event()
        self._stepping = self._stopping = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="codec-serve-step")
        self._task: asyncio.Task | None = None
        self._job_since: float | None = None  # when the job in flight began (monotonic)
        self.slowest = 0.0  # seconds of the slowest job so far

    # ---- facts -------------------------------------------------------------------------------
    @property
    def lives(self) -> list[Live]:
        """The streams holding slots."""
        return list(self._holders)

    @property
    def draining(self) -> bool:
        return self.admission.draining

    @property
    def waiting(self):
        return self.admission.waiting

    def active(self, side: str) -> int:
        return self.admission.held[side]

    def slots_of(self, live: Live) -> dict:
        """side -> the slot `live` holds."""
        return dict(self._holders.get(live, {}))

    @property
    def holding(self) -> int:
        """Streams holding slots: those running, and those gone whose slots go back after the
        job in flight (until then a newcomer would be told busy, so they still count)."""
        return len(set(self._holders) | {self._owner[s] for s in self._closing if s in self._owner})

    def stuck(self) -> float | None:
        """Seconds the job in flight has run, once that is past what any job may take (`STUCK_S`,
        `STUCK_X`); None while the engine steps as it should."""
        if self._job_since is None:
            return None
        running = time.monotonic() - self._job_since
        return running if running > max(STUCK_S, STUCK_X * self.slowest) else None

    def health(self) -> dict:
        """What /health says of this scheduler (docs/serve.md)."""
        codec, stuck = self.codec, self.stuck()
        return {"ok": not self.draining and stuck is None, "codec": codec.name, "preset": codec.preset,
                "slots": {"total": self.size, "active": self.holding},
                "pools": {side: {"total": self.size, "active": self.active(side),
                                 "batch": min(pool.batch, self.size)}
                          for side, pool in self.pools.items()},
                "queued": len(self.waiting), "connections": self.connections, "draining": self.draining,
                **({} if stuck is None else {"stuck_s": round(stuck, 1)})}

    def gauges(self) -> dict:
        sides = list(self.pools)
        return {"slots": [(f'side="{s}"', self.size) for s in sides],
                "active_slots": [(f'side="{s}"', self.active(s)) for s in sides],
                "connections": [("", self.connections)], "queued": [("", len(self.waiting))],
                "draining": [("", int(self.draining))]}

    # ---- streams -----------------------------------------------------------------------------
    def stream(self, request: Request) -> Live:
        """A new stream of `request` (no slots yet: `acquire`)."""
        return Live(request, self.codec, self.limits, self.metrics, self.wake)

    async def acquire(self, live: Live, timeout: float, on_queued=None) -> None:
        """Slots for `live` (opened between jobs), waiting in the queue up to `timeout` s when
        there is one (`on_queued(message)` is told its place); `ProtocolError("busy")` when there
        are none (or "shutting_down")."""
        grant = self.admission.ask(live, timeout, on_queued)
        self._settle()
        await self.admission.wait(live, grant, timeout, self.leave)

    def drain(self) -> None:
        """Refuse new streams and the queued ones; the streaming ones go on."""
        self.admission.drain()

    async def wind_down(self, grace: float) -> None:
        """`drain`, let the streams in flight finish for `grace` s, then end the rest with
        shutting_down (their connections send it and close)."""
        self.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.lives and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for live in self.lives:
            live.fail(ProtocolError("shutting_down", f"the server stopped; its grace time ({grace:g} s) for "
                                                     "the streams in flight is over"))

    def fail_all(self, error: ProtocolError) -> None:
        """End every stream holding or opening slots with `error` (and take no new ones)."""
        self.drain()
        for live in self.lives + self.admission.opening:
            live.fail(error)

    def leave(self, live: Live) -> None:
        """`live` is gone (or done, or failed): its slots go back now, or after the job in flight."""
        self.admission.forget(live)
        slots = self._holders.pop(live, None)
        if slots:
            self._closing.extend(slots.values())
        self._settle()
        self.wake()

    def _settle(self) -> None:
        """Between jobs: close what left or ended, grant what waits, open what was granted."""
        if self._stepping:
            return
        for live in [live for live in self._holders if live.closed]:
            self._closing.extend(self._holders.pop(live).values())
        for slot in self._closing:
            slot.close()
            self._owner.pop(slot, None)
            self.admission.release(slot.pool.side)
        self._closing = []
        for live in self.admission.granted():
            slots = {}
            try:
                for side in live.request.sides:
                    slot = self.pools[side].open(**self._settings(live.request, side))
                    if slot is None:  # cannot happen while `held` counts every open slot
                        raise ProtocolError("internal", f"the {side} pool had no free slot")
                    slots[side] = slot
            except Exception as e:  # noqa: BLE001 (any failure: its sides go back, it is told why)
                for slot in slots.values():
                    slot.close()
                if not isinstance(e, CodecportError):  # a MemoryError, ONNX Runtime's: not the client's
                    log.error("opening a stream's slots failed: %s", e, exc_info=e)
                self.admission.refuse(live, e if isinstance(e, ProtocolError) else ProtocolError(
                    "internal", f"its slots could not be opened: {_first_line(e)}"))
                continue
            self._holders[live] = slots
            self._owner.update(dict.fromkeys(slots.values(), live))
            self.metrics.streams[live.request.op] += 1
            self.admission.opened(live)

    @staticmethod
    def _settings(request: Request, side: str) -> dict:
        """The stream settings of a slot of `side` for `request`."""
        if side == "encoder":
            return {"n_codebooks": request.codebooks}
        return {} if request.noise is None else {"noise": request.noise}

    # ---- stepping ----------------------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="codec-serve-scheduler")

    async def stop(self) -> None:
        """Let the job in flight end, then stop (the streams have been ended or failed)."""
        self._stopping = True
        self.wake()
        if self._task is not None:
            await self._task
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown)

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
                for live in self.lives + self.admission.opening:
                    live.fail(ProtocolError("internal", f"the server failed a step ({type(e).__name__})"))
                self.admission.forget_opening()
                self._settle()

    async def _round(self) -> bool:
        """A job of each pool that has something to do, the encoder's first (a duplex stream's
        codes reach its decoder in the same round, so its frame waits for one round rather than
        two); False when nothing was stepped."""
        stepped = False
        for side in sorted(self.pools, key=lambda s: s != "encoder"):
            self._settle()
            job = self._job(side)
            if job is None:
                continue
            # Until the outputs are delivered no slot changes hands: a stream that leaves meanwhile
            # is closed by the _settle after, so no piece can reach the stream that gets its slot.
            self._stepping, self._job_since = True, time.monotonic()
            try:
                await asyncio.get_running_loop().run_in_executor(self._executor, job.run)
                self.slowest = max(self.slowest, time.monotonic() - self._job_since)
                self._deliver(job)
            finally:
                self._stepping, self._job_since = False, None
            stepped = stepped or bool(job.stepped)
        self._settle()
        if stepped:
            self.wake()  # look again: a slot may still have input or a flush to give
        return stepped

    def _job(self, side: str) -> Job | None:
        """What the `side` pool has to do: each slot that has finished its last input is given
        what its stream has waiting, ended once its stream's input is over; None when nothing."""
        job = Job(self.pools[side], side)
        for live, slots in self._holders.items():
            slot = slots.get(side)
            if slot is None or live.closed:
                continue
            ready = slot.ready()
            fed = bool(live.pending[side]) and not ready
            if fed:
                job.feeds[slot] = live.take(side)
            ends = live.input_over(side) and not slot.ended
            if ends:
                job.ends.append(slot)
            if ready or fed or ends:
                job.slots.append(slot)
                job.wires[slot] = live.wire
        return job if job.slots else None

    def _deliver(self, job: Job) -> None:
        side, metrics = job.side, self.metrics
        (metrics.samples if side == "encoder" else metrics.frames)[side] += job.fed
        for slot, e in job.refused.items():
            if (live := self._owner.get(slot)) is not None:
                live.fail(ProtocolError("bad_input" if isinstance(e, CodecportError) else "internal",
                                        _first_line(e)))
                if not isinstance(e, CodecportError):
                    log.error("feeding slot %d of the %s pool failed: %s", slot.index, side, e, exc_info=e)
        if job.stepped:
            metrics.step(side, job.seconds, len(job.stepped))
        for slot, e in job.failed.items():  # its own piece failed: that stream alone ends
            log.error("slot %d of the %s step failed: %s", slot.index, side, e, exc_info=e)
            if (live := self._owner.get(slot)) is not None:
                live.fail(ProtocolError("internal", _first_line(e)))
        if job.error is not None:
            # A step failed: every stream in it may have lost a piece, so each is ended.
            error, n = job.error, len(job.stepped)
            log.error("a %s step of %d slots failed: %s", side, n, error, exc_info=error)
            code = "bad_input" if isinstance(error, CodecportError) and n == 1 else "internal"
            for slot in job.stepped:
                if (live := self._owner.get(slot)) is not None:
                    live.fail(ProtocolError(code, _first_line(error)))
        for slot, (message, n, codes) in job.out.items():
            live = self._owner.get(slot)
            if live is None or live.closed or not n:
                continue
            (metrics.frames if side == "encoder" else metrics.samples)[side] += n
            live.emit(side, message, n)
            if codes is not None:
                live.to_decoder(codes)
        for slot in job.slots:
            live = self._owner.get(slot)
            if live is not None and slot.finished and side not in live.finished and not live.closed:
                live.side_finished(side)
