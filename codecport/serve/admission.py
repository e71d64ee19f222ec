"""Who gets slots next, for `codec-serve`'s scheduler (engine.py): the count of slots granted
per side, the queue, and each waiting stream's grant. The scheduler opens the slots of what
this grants (`granted`), between its jobs, and tells back (`opened`, `refuse`, `release`).

The queue is kept in order by sides: a stream waits only for those before it that need a side
it needs (an encode stream is not held up by one waiting for a full decoder pool), and never
takes a slot of a side one before it waits for (so none waits forever).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Collection

from .protocol import ProtocolError

STOPPING = "the server is stopping; connect to another"


class Admission:
    """Slots of `size` a side for the sides of `pools`, and a queue of `queue` streams at most."""

    def __init__(self, pools: Collection[str], size: int, queue: int):
        self.size, self.queue_limit = size, queue
        self.held = dict.fromkeys(pools, 0)  # slots granted (opening or open), per side
        self.waiting: deque = deque()  # streams queued for slots
        self.opening: list = []  # granted, their slots to open between jobs
        self.grants: dict = {}  # stream -> the future its `wait` awaits
        self.draining = False
        self.metrics = None  # the scheduler's, for `busy`

    def _fits(self, live, blocked: Collection = ()) -> bool:
        """Whether `live` has a free slot of each side it needs, none of them a side in `blocked`."""
        return all(self.held[side] < self.size and side not in blocked for side in live.request.sides)

    def _reserve(self, live) -> None:
        for side in live.request.sides:
            self.held[side] += 1
        self.opening.append(live)

    def _busy(self, message: str) -> ProtocolError:
        self.metrics.busy += 1
        return ProtocolError("busy", message)

    def ask(self, live, timeout: float, on_queued: Callable[[dict], None] | None = None) -> asyncio.Future:
        """The grant `live` waits for: reserved at once when its sides have room, else queued
        (`on_queued` told its place); `ProtocolError` busy (no queue, or the queue full) or
        shutting_down."""
        if self.draining:
            raise ProtocolError("shutting_down", STOPPING)
        grant = self.grants[live] = asyncio.get_running_loop().create_future()
        if self._fits(live, {side for w in self.waiting for side in w.request.sides}):
            self._reserve(live)
        elif len(self.waiting) < self.queue_limit:
            self.waiting.append(live)
            if on_queued is not None:
                on_queued({"op": "queued", "position": len(self.waiting), "timeout": timeout})
        else:
            del self.grants[live]
            raise self._busy(f"all {self.size} slots are taken and "
                             + (f"the queue of {self.queue_limit} is full" if self.queue_limit
                                else "there is no queue (--queue)") + "; try again later")
        return grant

    async def wait(self, live, grant: asyncio.Future, timeout: float, leave: Callable) -> None:
        """Until `live`'s slots are open (`timeout` s at most in the queue: busy); `leave(live)`
        when the wait is cancelled."""
        queued = live in self.waiting
        try:
            await asyncio.wait_for(asyncio.shield(grant), timeout if queued else None)
        except asyncio.TimeoutError:
            if live in self.waiting:
                self.waiting.remove(live)
                self.grants.pop(live, None)
                raise self._busy(f"no slot came free in {timeout:g} s of waiting; try again later") from None
            await grant  # granted as the wait ran out: the slots open at the next settle
        except asyncio.CancelledError:
            leave(live)
            raise
        if grant.exception() is not None:
            raise grant.exception()

    def granted(self) -> list:
        """The streams whose slots open now: the queue granted in its order, by sides, then every
        one granted (the scheduler answers each with `opened` or `refuse`)."""
        blocked: set = set()
        for live in list(self.waiting):
            if self._fits(live, blocked):
                self.waiting.remove(live)
                self._reserve(live)
            else:
                blocked.update(live.request.sides)
        out, self.opening = self.opening, []
        return out

    def opened(self, live) -> None:
        grant = self.grants.pop(live, None)
        if grant is not None and not grant.done():
            grant.set_result(None)

    def refuse(self, live, error: ProtocolError) -> None:
        """`live`'s slots could not open: its sides go back, its wait raises `error`."""
        for side in live.request.sides:
            self.held[side] -= 1
        grant = self.grants.pop(live, None)
        if grant is not None and not grant.done():
            grant.set_exception(error)

    def release(self, side: str) -> None:
        """A slot of `side` closed."""
        self.held[side] -= 1

    def forget(self, live) -> None:
        """`live` is gone: out of the queue, its reserved sides back, its wait cancelled."""
        if live in self.waiting:
            self.waiting.remove(live)
        if live in self.opening:
            self.opening.remove(live)
            for side in live.request.sides:
                self.held[side] -= 1
        grant = self.grants.pop(live, None)
        if grant is not None and not grant.done():
            grant.cancel()

    def forget_opening(self) -> None:
        for live in list(self.opening):
            self.forget(live)

    def drain(self) -> None:
        """Refuse the queued streams, and any asking from now on."""
        self.draining = True
        while self.waiting:
            grant = self.grants.pop(self.waiting.popleft(), None)
            if grant is not None and not grant.done():
                grant.set_exception(ProtocolError("shutting_down", STOPPING))
