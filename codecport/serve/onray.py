"""`codec-serve --engine ray`: the driver that puts replicas (replica.py) on a Ray cluster behind
Ray Serve's proxy, announces the URL, and on SIGTERM or SIGINT drains what it started.

The proxy is Serve's default (Python) one, not its HAProxy mode: HAProxy mode costs about a tenth
per frame, but in Ray 2.60 it binds its stats and Prometheus ports and each replica's port on
every interface whatever `--host` says (and holds a shutdown at least 30 s), where codec-serve
listens only where the user says. docs/serve.md gives the proxy's measured cost per frame.
Ray Serve facts: shared/reference/ray-serve.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

from ..cluster import check_reachable, head_node, import_ray, without_core_notes
from ..errors import CodecportError
from ..runtime.providers import cpu_cores
from .config import ServeConfig
from .flags import RayPlan, parse_args

log = logging.getLogger(__name__)
# codecport's gate in Serve's proxies (gate.py): set in the environment of Serve's controller,
# whose proxies inherit it, where this driver starts Serve; a cluster whose Serve runs already
# needs it in every node's environment (docs/serve.md). Without it a stream's input and output
# are not bounded in the proxy, and the driver says so.
GATE = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "codecport.serve.gate:middlewares"}


@contextlib.contextmanager
def held_port(host: str, port: int) -> Iterator[int]:
    """`port` on `host`, or a free one for 0, held bound (SO_REUSEPORT, not listening) until the
    block ends: Serve's proxies take a fixed port and bind it the same way, so the port picked
    here is still free when they bind it, whoever else looks for one meanwhile."""
    if port:
        yield port
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, 0))
        yield s.getsockname()[1]


def replica_options(options: dict, cpus: float) -> dict:
    """A replica's provider options: its ONNX Runtime threads follow its share of the cores
    unless `threads` is given."""
    return {**options, "threads": options.get("threads", str(max(1, int(cpus))))}


def deployment_options(config: ServeConfig, plan: RayPlan, cpus: float) -> dict:
    """Serve's options for the replicas of `config` on `plan`, each with `cpus` cores.

    `max_ongoing_requests` is every connection a replica's own scheduler answers (a stream on each
    side, the queue, and a /health or two), so that Serve never holds an upgrade without a reply:
    its own overflow waits with no time limit. The replica says `busy` or `queued` itself; which
    replica a stream goes to is the router's (routing.py: the one holding fewest, of all)."""
    from ray.serve.config import RequestRouterConfig

    from .routing import ROUTER

    # Serve kills a stopping replica after its graceful_shutdown_timeout_s; the replica ends its
    # own streams at --grace (replica.py), and needs a second to learn it is stopping and its
    # streams' errors their close time to be sent before then.
    stop_after = config.grace + 1.0 + config.close_timeout + 1.0
    opts = {"max_ongoing_requests": 2 * config.slots + config.queue + 2,
            "graceful_shutdown_timeout_s": stop_after, "graceful_shutdown_wait_loop_s": 0.5,
            "health_check_period_s": 2, "health_check_timeout_s": 10,
            # A redeploy starts the new replicas before it stops the old ones (Serve's default
            # stops first: a new stream would wait for the successor).
            "max_surge_percent": 100,
            "request_router_config": RequestRouterConfig(request_router_class=ROUTER),
            "ray_actor_options": {"num_cpus": cpus}}
    if plan.autoscale is None:
        opts["num_replicas"] = plan.replicas
    else:
        # The slots in use reach the policy every second (Serve's default is every 10 s); a
        # fixed deployment pushes nothing it needs, at Serve's own pace.
        opts["ray_actor_options"]["runtime_env"] = {"env_vars": {
            "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "1"}}
        lo, hi = plan.autoscale
        # The policy sees each replica's most in use over the last 2 s (Serve's default is the
        # mean over 30 s: a stream's arrival would take 30 s to ask for a replica).
        opts["autoscaling_config"] = {"min_replicas": lo, "max_replicas": hi, "initial_replicas": lo,
                                      "upscale_delay_s": 1, "downscale_delay_s": plan.downscale,
                                      "metrics_interval_s": 1, "look_back_period_s": 2,
                                      "aggregation_function": "max",
                                      "policy": {"policy_function": "codecport.serve.replica:slots_policy"}}
    return opts


def run_on_ray(folder: str, provider: str, fallback: str | None, options: dict, config: ServeConfig,
               plan: RayPlan, announce: Callable[[str], None] | None = None,
               stop: threading.Event | None = None, tell: Callable[[str], None] | None = None) -> None:
    """Serve `folder` on Ray until `stop` is set or SIGTERM/SIGINT arrive (main thread), then
    delete the app (its replicas drain for `config.grace` s) and stop what was started here.
    A deployment already on the cluster is replaced (Serve's rolling update: its replicas drain),
    and its driver, seeing it replaced, leaves without deleting it. `announce(url)` once the
    replicas run; `tell(line)` what the driver does next (draining, or replaced)."""
    ray = import_ray(log, "codec-serve --engine ray needs Ray Serve", "ray")
    try:
        from ray import serve

        from . import replica  # noqa: F401  (FastAPI and the rest of Ray Serve's stack)
    except ImportError as e:
        raise CodecportError(f"codec-serve --engine ray needs Ray Serve ({e}); "
                             "pip install 'codecport[ray]'") from None
    address = plan.address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_reachable(address)
    level = logging.INFO if log.isEnabledFor(logging.INFO) else logging.ERROR
    # Serve's driver-side notes (started, ready, deleting) are for -v; the CLI says what happened.
    logging.getLogger("ray.serve").setLevel(min(level, logging.WARNING))
    with without_core_notes(level > logging.INFO):
        _run(ray, serve, folder, provider, fallback, options, config, plan, address, level, announce,
             stop or threading.Event(), tell or log.info)


def _run(ray, serve, folder, provider, fallback, options, config, plan, address, level, announce, stop,
         tell) -> None:
    from . import controller
    from .replica import APP, NAMESPACE, Replica, open_board

    started = address is None
    if started:  # a Ray started here passes them on to its proxies
        for key, value in GATE.items():
            os.environ.setdefault(key, value)
    try:
        if started:
            ray.init(address="local", num_cpus=cpu_cores(), include_dashboard=False, logging_level=level,
                     log_to_driver=False, namespace=NAMESPACE)
        else:
            ray.init(address=address, logging_level=level, log_to_driver=False, namespace=NAMESPACE)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise CodecportError(f"cannot start or reach the Ray cluster {address or '(local)'}: "
                             f"{str(e).splitlines()[0]}; check --address / RAY_ADDRESS") from e
    saved = {}
    if threading.current_thread() is threading.main_thread():  # after ray.init, which sets its own
        for sig in (signal.SIGTERM, signal.SIGINT):
            saved[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        most = plan.replicas if plan.autoscale is None else plan.autoscale[1]
        # A replica's share of the cores: --replica-cpus, else the machine's cores over the most
        # replicas on a Ray started here, one core on a cluster. Its ORT threads follow.
        cpus = plan.cpus or (ray.cluster_resources().get("CPU", 1) / most if started else 1.0)
        options = replica_options(options, cpus)
        with held_port(config.host, config.port) as port:
            serve.start(http_options={"host": config.host, "port": port},
                        proxy_location="HeadOnly" if plan.proxies == "head" else "EveryNode",
                        controller_options={"runtime_env": {"env_vars": GATE}})
            config = replace(config, port=_listening(ray, controller, config))
        me = f"{socket.gethostname()}:{os.getpid()}"
        # On the head node (whose loss ends the cluster anyway), so that losing another leaves it.
        board = open_board(head_node())
        ray.get(board.claim.remote(me), timeout=30)
        app = Replica.options(**deployment_options(config, plan, cpus)).bind(
            str(folder), provider, fallback, options, config)
        try:
            serve.run(app, name=APP, route_prefix="/")
        except Exception as e:
            raise CodecportError(f"the replicas did not start: {str(e).strip().splitlines()[-1]}") from e
        host = config.host
        url = f"http://{f'[{host}]' if ':' in host else host}:{config.port}"
        if announce is not None:
            announce(url)
        if not _gated(url):
            setting = " ".join(f"{k}={v}" for k, v in GATE.items())
            tell("warning: Serve's proxy here runs without codecport's gate, so a client's input and output "
                 f"are not bounded in the proxy: set {setting} in every node's environment before Ray "
                 "starts (docs/serve.md)")
        if not _serve_until_stopped(ray, board, me, stop, tell):
            return
        try:  # the deployment is deleted only by its owner: a redeploy may have taken it over
            mine = ray.get(board.stop_all.remote(me), timeout=5)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            mine = True  # a board restarting: Serve's DELETING tells the replicas instead
        if not mine:
            tell("replaced: the deployment is now another codec-serve's; this driver leaves it serving")
            return
        tell(f"draining: no new streams; those in flight get {config.grace:g} s")
        serve.delete(APP)  # returns once the replicas have drained (or their grace ran out)
        with contextlib.suppress(Exception):
            ray.kill(board)
        if started:
            serve.shutdown()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        ray.shutdown()


def _owner(ray, board) -> str | None:
    """Who owns the deployment now; None if the board did not say in time (restarting)."""
    try:
        return ray.get(board.owned_by.remote(), timeout=2)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
        return None


def _serve_until_stopped(ray, board, me: str, stop: threading.Event, tell) -> bool:
    """Until `stop` (True) or another driver takes the deployment over (False, said)."""
    while not stop.wait(1.0):  # a timed wait: the signal handler runs between waits
        owner = _owner(ray, board)
        if owner is None:  # the board restarting, or restarted empty
            with contextlib.suppress(ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                ray.get(board.claim.remote(me), timeout=2)
        elif owner != me:
            tell(f"replaced: the deployment is now codec-serve {owner}'s; this driver leaves it serving")
            return False
    return True


def _gated(url: str) -> bool:
    """Whether a request through Serve's proxy at `url` passed codecport's gate (/health says)."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:  # noqa: S310 (our own URL)
            return bool(json.loads(r.read()).get("gate"))
    except Exception as e:  # noqa: BLE001 (503 while a replica starts: its body says too)
        body = getattr(e, "read", lambda: b"{}")()
        with contextlib.suppress(ValueError):
            return bool(json.loads(body or b"{}").get("gate"))
        return False


def _listening(ray, controller, config: ServeConfig) -> int:
    """The port of Serve's proxies: the one asked for, or, where Serve was running already (a
    redeploy), the one it runs on, which must be where --host and --port say."""
    details = controller.parse(ray.get(controller.ask(), timeout=30))
    host, running = controller.listening(details)
    if host != config.host or config.port not in (0, running):
        raise CodecportError(f"Ray Serve on this cluster listens on {host}:{running}; pass "
                             f"--host {host} --port {running} (or 0), or stop it first")
    return running


def application(args: dict):
    """Serve's application builder, for a deployment with no codec-serve driver: a RayService on
    KubeRay (`import_path: codecport.serve.onray:application`, docs/serve.md) or `serve run
    codecport.serve.onray:application model=DIR`. `args`: `model` (the export folder, present on
    every node), `provider`, and codec-serve's flags by their names (`slots`, `queue`, `grace`,
    `replicas` or `autoscale`, `replica_cpus`, `allow_origin` as a list...; `host` and `port` as
    Serve's http_options say: the Host requests must name), parsed as the command line parses
    them (flags.py)."""
    from .replica import Replica

    args = dict(args)
    try:
        folder = str(args.pop("model"))
    except KeyError:
        raise CodecportError("the application needs args.model: the export folder") from None
    provider = str(args.pop("provider", "cpu"))
    config, plan = parse_args(args)
    cpus = plan.cpus or 1.0
    return Replica.options(**deployment_options(config, plan, cpus)).bind(
        folder, provider, None, replica_options({}, cpus), config)
