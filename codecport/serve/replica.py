"""`codec-serve --engine ray`'s replica: one Ray Serve replica holding what one local `codec-serve`
holds (a Scheduler with its slot pools, the codec's sessions), reached through Serve's proxy.

The stream's code is the local server's (connection.py over asgi.AsgiSocket); what differs is
only what a replica cannot see alone. Each replica writes its health and metrics on the `Board`
(a Ray actor the driver starts) twice a second, and `/health` and `/metrics`, which Serve routes
to any one replica, read the whole deployment there: a replica that died stops writing and drops
off within `FRESH` seconds. Ray Serve facts used here: shared/reference/ray-serve.md.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request,
# WebSocket) as types, and would take a string for a query parameter.
import asyncio
import contextlib
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
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

from .. import registry
from .access import host_allowed, hosts, origin_allowed
from .asgi import AsgiSocket
from .config import ServeConfig
from .connection import Connection
from .engine import Scheduler
from .metrics import merge
from .protocol import error_message
from .server import converted

log = logging.getLogger(__name__)
NAMESPACE = "codecport"
APP = DEPLOYMENT = "codec-serve"  # Serve's application and its one deployment, one per cluster
PUSH = 0.5  # seconds between a replica's writes on the board
FRESH = 2.0  # a replica not heard from for this long is gone from /health and /metrics
ASK = 2.0  # seconds the board waits for Serve's controller to say which replicas it stops

app = FastAPI()


class Board:
    """What the replicas of the deployment share (a detached Ray actor, one per deployment): each
    live replica's last health and metrics, which of them Serve is stopping, and which driver
    owns the deployment (the last one that ran it: a redeploy takes it over)."""

    def __init__(self):
        self.entries: dict[str, tuple[float, dict]] = {}
        self.stopping: frozenset[str] = frozenset()
        self.deleting = False  # Serve is deleting the application (as of the last poll)
        self.stop_asked = False  # the owner is deleting it (told before Serve's first poll shows it)
        self.owner: str | None = None
        self._polled = 0.0
        self._polling: asyncio.Future | None = None

    def claim(self, driver: str) -> None:
        self.owner, self.stop_asked = driver, False

    def owned_by(self) -> str | None:
        return self.owner

    def stop_all(self) -> None:
        """The driver is deleting the deployment: every replica winds down."""
        self.stop_asked = True

    async def put(self, key: str, entry: dict) -> bool:
        """`entry` for replica `key`; True once Serve is stopping it (a scale-down, a redeploy,
        the driver's drain), which then winds down within its grace."""
        self.entries[key] = (time.monotonic(), entry)
        if self._polling is None and time.monotonic() - self._polled >= PUSH / 2:
            # Asked in the background: a controller slow to answer (a node just lost) must not
            # hold the replicas' pushes, nor a stop the owner asked for.
            self._polling = asyncio.ensure_future(self._poll())
        return self.stop_asked or self.deleting or key in self.stopping

    async def _poll(self) -> None:
        """Which replicas Serve is stopping, asked of its controller at most once a push period:
        Serve tells a replica's own code only once its requests have ended (`__del__`), and a
        stream is a request that would hold it until Serve's force-kill."""
        self._polled = time.monotonic()
        try:
            controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
            details = await asyncio.wait_for(controller.get_serve_instance_details.remote(), ASK)
        except Exception as e:  # a controller restarting, or slow: the next push asks again
            log.debug("Serve's controller did not answer: %s", e)
            return
        finally:
            self._polling = None
        app = details.get("applications", {}).get(APP, {})
        # An application being deleted lists no deployments any more (`serve delete` from a shell).
        self.deleting = app.get("status") == "DELETING"
        replicas = app.get("deployments", {}).get(DEPLOYMENT, {}).get("replicas", [])
        self.stopping = frozenset(r["replica_id"] for r in replicas if r.get("state") == "STOPPING")

    def drop(self, key: str) -> None:
        self.entries.pop(key, None)

    def fresh(self) -> list[dict]:
        now = time.monotonic()
        return [entry for t, entry in self.entries.values() if now - t < FRESH]


def open_board(name: str, **options):
    """The board called `name`, started here if none runs: detached, so that it outlives a driver
    whose deployment another took over (or runs with no driver at all, under a RayService), and
    restarted if its node goes (empty then: the replicas' next pushes fill it)."""
    return ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(Board).options(
        name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, **options).remote()


def slots_policy(ctx) -> tuple[int, dict]:
    """Autoscaling on slots in use (`--autoscale`): the replicas whose slots are all taken, and one
    with room, so that a new stream finds a slot while another replica starts. Each replica
    reports its share of slots in use (`record_autoscaling_stats`); Serve bounds the result by
    MIN:MAX and applies the delays."""
    load = (ctx.aggregated_metrics or {}).get("load", {})
    return max(1, math.floor(sum(load.values()) + 1e-9) + 1), {}


@serve.deployment(name=DEPLOYMENT)
@serve.ingress(app)
class Replica:
    """One share of the deployment: `folder` served on `config` (its `port` is the proxy's)."""

    async def __init__(self, folder: str, provider: str, fallback: str | None, options: dict,
                       config: ServeConfig, board_name: str):
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
        self.board = open_board(board_name)
        self._winding: asyncio.Future | None = None
        self._pusher = asyncio.ensure_future(self._push())
        log.info("replica %s serving %s on pid %d", self.id, folder, os.getpid())

    async def _push(self) -> None:
        while True:
            try:
                stopping = await self.board.put.remote(self.id, {**self.where, **self.scheduler.health(),
                                                                 "metrics": self.scheduler.metrics.render()})
            except Exception as e:  # the board gone (the driver ending): nothing to tell
                log.debug("the board took no entry: %s", e)
                stopping = False
            if stopping and self._winding is None:
                log.info("replica %s is being stopped: no new streams, those in flight get %g s", self.id,
                         self.config.grace)
                self._winding = asyncio.ensure_future(self.scheduler.wind_down(self.config.grace))
            await asyncio.sleep(PUSH)

    async def __del__(self):
        self._pusher.cancel()
        with contextlib.suppress(Exception):
            await self.board.drop.remote(self.id)
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
        sock = AsgiSocket(ws, max_message=self.config.max_message)
        await sock.start()
        try:
            await Connection(sock, self.config, self.scheduler, self.codec, self.convert).serve()
        finally:
            await sock.stop()

    def _refused(self, request: Request) -> Response | None:
        """421 with the JSON error for a plain request that does not name this server."""
        why = self._refusal(request.headers, stream=False)
        if why is None:
            return None
        return Response(error_message("bad_request", why), status_code=421, media_type="application/json")

    async def _board(self) -> list[dict]:
        return sorted(await self.board.fresh.remote(), key=lambda e: (e["node"], e["pid"]))

    @app.get("/health")
    async def health(self, request: Request):
        if (refused := self._refused(request)) is not None:
            return refused
        entries = await self._board()
        replicas = [{k: v for k, v in e.items() if k != "metrics"} for e in entries]
        ok = bool(replicas) and any(r["ok"] for r in replicas)
        body = {"ok": ok, "codec": self.codec.name, "preset": self.codec.preset, "engine": "ray",
                "slots": {"total": sum(r["slots"]["total"] for r in replicas),
                          "active": sum(r["slots"]["active"] for r in replicas)},
                "queued": sum(r["queued"] for r in replicas),
                "connections": sum(r["connections"] for r in replicas), "replicas": replicas}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics(self, request: Request):
        if (refused := self._refused(request)) is not None:
            return refused
        text = merge({e["replica"]: e["metrics"] for e in await self._board()})
        return PlainTextResponse(text, headers={"X-Content-Type-Options": "nosniff"})

