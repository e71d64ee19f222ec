"""`codec-serve --engine ray`'s replica: one Ray Serve replica holding what one local `codec-serve`
holds (a Scheduler with its slot pools, the codec's sessions), reached through Serve's proxy.

The stream's code is the local server's (connection.py over asgi.AsgiSocket, bounded end to end
by codecport's gate in the proxy: gate.py); what differs is only what a replica cannot see alone.
Each replica writes its health and metrics on the `Board` (a small detached Ray actor on the head
node) twice a second, and `/health` and `/metrics`, which Serve routes to any one replica, read
the whole deployment there: a replica that died stops writing and drops off within `FRESH`
seconds. Every call to the board has a time limit. Ray Serve facts: shared/reference/ray-serve.md.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request,
# WebSocket) as types, and would take a string for a query parameter.
import asyncio
import contextlib
import ipaddress
import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ray
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from ray import serve

from .. import registry
from ..cluster import head_node
from . import controller, gate
from .access import host_allowed, hosts, origin_allowed
from .asgi import AsgiSocket
from .config import ServeConfig
from .connection import Connection, converted
from .engine import Scheduler
from .metrics import merge
from .protocol import ProtocolError, error_message

log = logging.getLogger(__name__)
NAMESPACE = "codecport"
APP = DEPLOYMENT = "codec-serve"  # Serve's application and its one deployment, one per cluster
BOARD = f"{APP}-board"
# Seconds between a replica's writes on the board, and between the board's polls of Serve: an
# idle deployment of two replicas cost half a core at twice a second (the controller's answer,
# checked by its schema each time), a quarter at this pace with the schema checked once.
PUSH = 1.0
FRESH = 3.0  # a replica not heard from for this long is gone from /health and /metrics
ASK = 2.0  # seconds the board waits for Serve's controller to say which replicas it stops
CALL = 2.0  # seconds any call to the board may take (a board restarting holds nothing up)
GONE_POLLS = 3  # the board leaves once this many polls in a row find the application gone
SEND_WINDOW = 4 << 20  # output unacknowledged behind a gate with --send-buffer 0 (autotuning's most)

app = FastAPI()


class Board:
    """What the replicas of the deployment share (a detached Ray actor, one per cluster, on the
    head node): each live replica's last health and metrics, which of them Serve is stopping,
    and which driver owns the deployment (the last one that ran it: a redeploy takes it over).
    It asks Serve's controller twice a second once a replica has written, and leaves once the
    application is gone (deleted with no driver to remove it: a RayService's)."""

    def __init__(self):
        self.entries: dict[str, tuple[float, dict]] = {}
        self.stopping: frozenset[str] = frozenset()
        self.running: frozenset[str] = frozenset()  # the replicas Serve routes to (as of the last poll)
        self.deleting = False  # Serve is deleting the application (as of the last poll)
        self.stop_asked = False  # the owner is deleting it (told before Serve's first poll shows it)
        self.owner: str | None = None
        self.blind: str | None = None  # why the polls cannot see Serve's stops, while they cannot
        self._poller: asyncio.Task | None = None
        self._controller = None

    def claim(self, driver: str) -> None:
        self.owner, self.stop_asked = driver, False

    def owned_by(self) -> str | None:
        return self.owner

    def stop_all(self, driver: str) -> bool:
        """The deployment's owner `driver` is deleting it: every replica winds down. False (and
        nothing done) if another driver owns it now."""
        if self.owner not in (driver, None):
            return False
        self.stop_asked = True
        return True

    async def put(self, key: str, entry: dict) -> bool:
        """`entry` for replica `key`; True once Serve is stopping it (a scale-down, a redeploy,
        the driver's drain), which then winds down within its grace."""
        self.entries[key] = (time.monotonic(), entry)
        if self._poller is None:
            self._poller = asyncio.ensure_future(self._poll())
        return self.stop_asked or self.deleting or key in self.stopping

    async def _poll(self) -> None:
        """Which replicas Serve is stopping, asked of its controller every push period: Serve
        tells a replica's own code only once its requests have ended (`__del__`), and a stream is
        a request that would hold it until Serve's force-kill. Asked in a task of its own, so that
        a controller slow to answer (a node just lost) holds up no replica's push."""
        seen, absent, failures, checked = False, 0, 0, False
        while True:
            try:
                if self._controller is None:
                    self._controller = await asyncio.to_thread(controller.handle)
                raw = await asyncio.wait_for(controller.ask(self._controller), ASK)
                stops = controller.stops(raw if checked else controller.parse(raw), APP, DEPLOYMENT)
                checked = True
            except controller.ShapeError as e:
                if self.blind is None:
                    log.error("replicas being stopped will not be told to wind down: %s", e)
                self.blind = str(e)
            except Exception as e:  # noqa: BLE001 (a controller restarting, or slow: asked again)
                failures += 1
                self._controller = None if failures % 4 == 0 else self._controller
                (log.warning if failures % 20 == 0 else log.debug)(
                    "Serve's controller did not answer (%d times in a row): %s", failures, e)
            else:
                failures, self.blind = 0, None
                self.deleting, self.stopping, self.running = stops.deleting, stops.replicas, stops.running
                seen, absent = seen or stops.present, 0 if stops.present else absent + 1
                if seen and absent >= GONE_POLLS:
                    log.info("the application %s is gone: the board leaves", APP)
                    # Killed for good: an exit from this task would end the task only, and a crash
                    # would be restarted (max_restarts=-1).
                    me = ray.get_runtime_context().current_actor
                    await asyncio.to_thread(ray.kill, me, no_restart=True)
                    return
            await asyncio.sleep(PUSH)

    def drop(self, key: str) -> None:
        self.entries.pop(key, None)

    def fresh(self) -> dict:
        """The live replicas' entries, each saying whether Serve routes to it yet (`serving`), and
        why the board cannot see Serve's stops (`blind`), while it cannot."""
        now = time.monotonic()
        return {"replicas": [{**entry, "serving": key in self.running}
                             for key, (t, entry) in self.entries.items() if now - t < FRESH],
                "blind": self.blind}


def open_board(head: str | None = None):
    """The deployment's board, started here if none runs: detached, so that it outlives a driver
    whose deployment another took over (or runs with no driver at all, under a RayService), on
    the head node `head` (hard: a board lost with another node forgets which replicas must stop,
    and the head's loss ends the cluster anyway), and restarted there if it fails (empty then:
    the replicas' next pushes fill it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    placed = {} if head is None else {"scheduling_strategy": NodeAffinitySchedulingStrategy(head, soft=False)}
    return ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(Board).options(
        name=BOARD, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, **placed).remote()


def slots_policy(ctx) -> tuple[int, dict]:
    """Autoscaling on slots in use (`--autoscale`): the replicas whose slots are all taken, and one
    with room, so that a new stream finds a slot while another replica starts. Each replica
    reports its share of slots in use (`record_autoscaling_stats`); Serve bounds the result by
    MIN:MAX and applies the delays."""
    load = (ctx.aggregated_metrics or {}).get("load", {})
    return max(1, math.floor(sum(load.values()) + 1e-9) + 1), {}


def _loopback(request) -> bool:
    client = getattr(request, "client", None)
    try:
        return client is not None and ipaddress.ip_address(client.host).is_loopback
    except ValueError:
        return False


@serve.deployment(name=DEPLOYMENT)
@serve.ingress(app)
class Replica:
    """One share of the deployment: `folder` served on `config` (its `port` is the proxy's)."""

    async def __init__(self, folder: str, provider: str, fallback: str | None, options: dict,
                       config: ServeConfig):
        # Serve's controller must answer in the shape this codecport reads, or no replica would
        # ever be told it is being stopped: a replica of a Ray that changed it does not start.
        actor = await asyncio.to_thread(controller.handle)
        controller.parse(await asyncio.wait_for(controller.ask(actor), 30))
        path = Path(folder)
        spec = registry.codec_of_folder(path)
        self.codec = spec.runtime(path, provider, fallback, options)
        self.config = config
        self.scheduler = Scheduler(self.codec, config.slots, config.queue, config.max_backlog,
                                   input_bound=4 * config.max_message, batched=config.batched)
        self.scheduler.start()
        self.hosts = hosts(config.host, config.port)
        self.origins = frozenset(config.allow_origin)
        self._convert = ThreadPoolExecutor(2, thread_name_prefix="codec-serve-convert")
        context = serve.get_replica_context()
        self.id = context.replica_id.unique_id
        self.where = {"replica": self.id, "node": ray.get_runtime_context().get_node_id(),
                      "address": ray.util.get_node_ip_address(), "pid": os.getpid()}
        self.board = open_board(await asyncio.to_thread(head_node))
        self._winding: asyncio.Future | None = None
        self._ungated = False  # a stream came through a proxy without the gate (said once)
        self._stuck: str | None = None  # why this replica fails its health checks, once a step stuck
        self._pusher = asyncio.ensure_future(self._push())
        log.info("replica %s serving %s on pid %d", self.id, folder, os.getpid())

    async def _push(self) -> None:
        while True:
            try:
                entry = {**self.where, **self.scheduler.health(), "metrics": self.scheduler.metrics.render()}
                stopping = await asyncio.wait_for(self.board.put.remote(self.id, entry), CALL)
            except Exception as e:  # noqa: BLE001 (the board gone or restarting: pushed again)
                log.debug("the board took no entry: %s", e)
                stopping = False
            if stopping and self._winding is None:
                log.info("replica %s is being stopped: no new streams, those in flight get %g s", self.id,
                         self.config.grace)
                self._winding = asyncio.ensure_future(self.scheduler.wind_down(self.config.grace))
            await asyncio.sleep(PUSH)

    async def check_health(self) -> None:
        """Serve's health check: a step that never returns (a hung ONNX Runtime call) ends the
        streams with a word and fails the check from then on (a step that returns late is no
        proof the engine is sound), so that Serve replaces this replica."""
        stuck = self.scheduler.stuck()
        if stuck is not None and self._stuck is None:
            self._stuck = f"the codec's step had not returned for {stuck:.0f} s"
            log.error("replica %s: %s; failing its health checks", self.id, self._stuck)
            self.scheduler.fail_all(ProtocolError("internal", (
                f"the server's codec step has not returned for {stuck:.0f} s; this replica is being "
                "replaced: connect again and resend from the start")))
        if self._stuck is not None:
            raise RuntimeError(self._stuck)

    async def __del__(self):
        self._pusher.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.board.drop.remote(self.id), CALL)
        if self._stuck is None:  # a stuck step may never end: Serve's kill takes it
            await self.scheduler.stop()
        self._convert.shutdown(wait=False)

    def record_autoscaling_stats(self) -> dict:
        return {"load": self.scheduler.holding / self.scheduler.size}

    async def convert(self, fn, data: bytes):
        return await converted(self._convert, fn, data)

    def _refusal(self, headers, stream: bool) -> str | None:
        """Why a request is refused (access.py, as the local server), or None."""
        if not host_allowed(headers.get("host"), self.hosts, self.config.host):
            log.info("refused a request for host %r", headers.get("host"))
            return (f"this server answers to {self.config.host}:{self.config.port}, localhost and 127.0.0.1 "
                    "only; connect by one of them")
        if stream and not origin_allowed(headers.get("origin"), self.origins):
            log.info("refused a WebSocket from a page of %r", headers.get("origin"))
            return (f"a page of {headers.get('origin')} may not use this server; start it with "
                    "--allow-origin for the pages that should")
        return None

    @app.websocket("/stream")
    async def stream(self, ws: WebSocket) -> None:
        if self._refusal(ws.headers, stream=True) is not None:
            self.scheduler.metrics.errors["bad_request"] += 1
            await ws.close(code=1008)  # before the accept: the client gets HTTP 403
            return
        cfg = self.config
        # The raw ASGI callables under Starlette's WebSocket: the socket speaks to the gate in
        # messages of its own, which Starlette's checks would refuse.
        sock = AsgiSocket(ws.scope, ws._receive, ws._send, max_message=cfg.max_message,
                          input_bound=4 * cfg.max_message, window_out=cfg.send_buffer or SEND_WINDOW,
                          send_buffer=cfg.send_buffer)
        if not sock.gated and not self._ungated:
            self._ungated = True
            log.warning("a stream came through a Serve proxy without codecport's gate: its input and output "
                        "are not bounded there (set RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH="
                        "codecport.serve.gate:middlewares on every node: docs/serve.md)")
        if not await sock.start():
            return
        try:
            await Connection(sock, cfg, self.scheduler, self.codec, self.convert).serve()
        finally:
            await sock.stop()

    def _refused(self, request: Request) -> Response | None:
        """421 with the JSON error for a plain request that does not name this server."""
        why = self._refusal(request.headers, stream=False)
        if why is None:
            return None
        return Response(error_message("bad_request", why), status_code=421, media_type="application/json")

    async def _board(self) -> tuple[list[dict] | None, str | None]:
        """Every live replica's entry (None if the board did not answer in time), and why the
        board cannot see which replicas Serve stops, if it cannot."""
        try:
            board = await asyncio.wait_for(self.board.fresh.remote(), CALL)
        except Exception as e:  # noqa: BLE001 (restarting, or its node slow: this replica answers alone)
            log.info("the board did not answer: %s", e)
            return None, None
        return sorted(board["replicas"], key=lambda e: (e["node"], e["pid"])), board["blind"]

    @app.get("/health")
    async def health(self, request: Request):
        if (refused := self._refused(request)) is not None:
            return refused
        entries, blind = await self._board()
        alone = entries is None
        if alone:
            entries = [{**self.where, **self.scheduler.health()}]
        replicas = [{k: v for k, v in e.items() if k != "metrics"} for e in entries]
        ok = bool(replicas) and any(r["ok"] for r in replicas)
        body = {"ok": ok, "codec": self.codec.name, "preset": self.codec.preset, "engine": "ray",
                "slots": {"total": sum(r["slots"]["total"] for r in replicas),
                          "active": sum(r["slots"]["active"] for r in replicas)},
                "queued": sum(r["queued"] for r in replicas),
                "connections": sum(r["connections"] for r in replicas), "replicas": len(replicas),
                "serving": sum(bool(r.get("serving")) for r in replicas),
                "gate": gate.passed(request.scope)}
        if alone:
            body["partial"] = "the deployment's board did not answer: this replica alone"
        if blind:  # replicas that Serve stops would not be told: the operator must know
            body["warning"] = blind
        if _loopback(request):  # where each replica runs is the cluster's map: for the machine itself
            body["detail"] = replicas
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics(self, request: Request):
        if (refused := self._refused(request)) is not None:
            return refused
        entries, _ = await self._board()
        if entries is None:
            entries = [{"replica": self.id, "metrics": self.scheduler.metrics.render()}]
        text = merge({e["replica"]: e["metrics"] for e in entries})
        return PlainTextResponse(text, headers={"X-Content-Type-Options": "nosniff"})
