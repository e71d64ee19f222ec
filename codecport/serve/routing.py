"""How Serve's proxies pick a replica for a new stream (`--engine ray`): the one holding fewest,
among all of them, as they say at that moment.

Serve's default router asks two replicas picked at random and takes the less loaded; a replica
counts as full only at `max_ongoing_requests`, which codec-serve sets above what a replica
answers itself (its queue and `busy` replies are its own: onray.deployment_options). With three
replicas or more, a stream could then land on one whose slots are all taken, told `busy` or
queued, while another had room. This router asks every replica its count of ongoing requests
(streams held or queued, and plain requests in flight) and sends each new one to the lowest. Two
streams routed at once by one proxy never see the same free replica: a choice is counted against
its replica (`_reserved`) from the moment it is made until a count asked after the replica took
it includes it. Proxies of other nodes do not see each other's choices made within the same few
milliseconds; the replica still answers what it cannot take (`queued`, `busy`).

It runs in each proxy (Serve loads it by its import path: `ROUTER`), and reads only Serve's
public request-router interface (`ray.serve.request_router`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

log = logging.getLogger(__name__)
ROUTER = "codecport.serve.routing:SlotRouter"
ASK = 1.0  # seconds a replica has to say its count; one that does not is left out of this choice
KEEP = 30.0  # seconds a choice stays counted when its request never reached the replica (cancelled)


class SlotRouter(RequestRouter):
    """Each request to the replica with the fewest ongoing requests (ties at random)."""

    def initialize_state(self, **kwargs) -> None:
        # replica -> request id -> (when chosen, when the replica took it or None)
        self._reserved: dict[object, dict[str, list]] = {}

    def _count(self, replica, asked: float, now: float) -> int:
        """Choices of `replica` that a count asked at `asked` may not include yet."""
        choices = self._reserved.get(replica, {})
        for rid in [rid for rid, (chosen, took) in choices.items()
                    if (took is not None and took < asked - 1.0) or now - chosen > KEEP]:
            del choices[rid]
        return sum(1 for chosen, took in choices.values() if took is None or took >= asked)

    def _release(self, rid: str | None) -> None:
        for choices in self._reserved.values():
            choices.pop(rid, None)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        rid = pending_request.metadata.internal_request_id if pending_request is not None else None
        self._release(rid)  # a retry: its earlier choice did not take
        asked = time.time()
        counts = await asyncio.gather(*(asyncio.wait_for(r.get_queue_len(deadline_s=ASK), ASK)
                                        for r in candidate_replicas), return_exceptions=True)
        # From here to the return nothing awaits: the choice and its reservation are one step,
        # so a request routed concurrently sees it.
        now, best, low = time.time(), None, None
        for replica, n in zip(candidate_replicas, counts):
            if isinstance(n, BaseException):
                continue
            self.replica_queue_len_cache.update(replica.replica_id, n)  # Serve checks its cap on it
            load = (n + self._count(replica.replica_id, asked, now), random.random())
            if low is None or load < low:
                best, low = replica, load
        if best is None:  # none answered in time: Serve's own probing and backoff take over
            return [candidate_replicas]
        if rid is not None:
            self._reserved.setdefault(best.replica_id, {})[rid] = [now, None]
        return [[best]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        choice = self._reserved.get(replica_id, {}).get(pending_request.metadata.internal_request_id)
        if choice is not None:
            choice[1] = time.time()

    def on_request_completed(self, replica_id, internal_request_id: str) -> None:
        self._reserved.get(replica_id, {}).pop(internal_request_id, None)
