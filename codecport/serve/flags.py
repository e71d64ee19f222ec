"""`codec-serve`'s flags, parsed one way for both ways in: the command line (cli/serve.py) and
the Ray Serve application builder of a RayService (onray.application, whose `args` are the same
flags by their names). Each flag's type, range and check is written once, here, as a click
option; what they make is a `ServeConfig` and, for `--engine ray`, a `RayPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

from ..errors import CodecportError
from ..frontend import INT_MAX, Finite
from .access import normal_origin
from .config import ServeConfig

DEFAULTS = ServeConfig()  # the flags' defaults: ServeConfig's, written once
RAY_ONLY = ("address", "replicas", "autoscale", "replica_cpus", "proxies")


@dataclass(frozen=True)
class RayPlan:
    """Where and how many: `address` (None: a private local Ray), `replicas` (fixed), or
    `autoscale` (MIN, MAX) with `downscale` seconds of less need before a replica goes, and
    `cpus` each."""

    address: str | None = None
    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    cpus: float | None = None  # a replica's share of the cores (None: as run_on_ray says)
    proxies: str = "every"  # Serve's proxy on every node ("every") or the head's only ("head")
    downscale: float = 30.0  # seconds of less need before autoscaling removes a replica


def _origins(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return tuple(dict.fromkeys(normal_origin(v) for v in values))
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _bounds(ctx, param, value: str | None) -> tuple[int, int, float] | None:
    if value is None:
        return None
    lo, _, rest = str(value).partition(":")
    hi, _, down = rest.partition(":")
    try:
        bounds = int(lo), int(hi), float(down) if down else RayPlan.downscale
    except ValueError:
        bounds = None
    if bounds is None or not 1 <= bounds[0] <= bounds[1] <= 1024 or not 0 <= bounds[2] <= 86400:
        raise click.BadParameter(f"{value!r} is not MIN:MAX replicas (1 <= MIN <= MAX <= 1024), as 1:4, "
                                 "or MIN:MAX:SECONDS with the seconds of less need before one goes, "
                                 "as 1:4:60")
    return bounds


_OPTIONS = [
    click.option("--slots", type=click.IntRange(1, 4096), default=DEFAULTS.slots,
                 help="Streams at once: slots of each side's pool (a duplex stream holds one of each)."),
    click.option("--host", default=DEFAULTS.host, help="Address to listen on (0.0.0.0: every interface)."),
    click.option("--port", type=click.IntRange(0, 65535), default=DEFAULTS.port,
                 help="Port to listen on (0: any free one; the printed URL says which)."),
    click.option("--queue", type=click.IntRange(0, INT_MAX), default=DEFAULTS.queue,
                 help="Connections that may wait for a slot when all are taken (0: refuse them at once, "
                      "busy)."),
    click.option("--queue-timeout", type=Finite(min=0, max=86400), default=DEFAULTS.queue_timeout,
                 help="Seconds a queued connection waits before it is refused (busy)."),
    click.option("--idle-timeout", type=Finite(min=0.1, max=86400), default=DEFAULTS.idle_timeout,
                 help="Seconds a stream may send nothing (before its end) until it is ended (timeout) and "
                      "its slots go back."),
    click.option("--handshake-timeout", type=Finite(min=0.1, max=86400), default=DEFAULTS.handshake_timeout,
                 help="Seconds a new connection has to send its HTTP request, then its stream's JSON "
                      "request."),
    click.option("--grace", type=Finite(min=0, max=86400), default=DEFAULTS.grace,
                 help="Seconds SIGTERM lets the streams in flight finish before it ends them."),
    click.option("--max-message", type=click.IntRange(1024, INT_MAX), default=DEFAULTS.max_message,
                 help="Bytes of one message from a client; a larger one is refused (too_large)."),
    click.option("--max-backlog", type=click.IntRange(1024, INT_MAX), default=DEFAULTS.max_backlog,
                 help="Bytes of output waiting for a slow client: warned at half of this, dropped past it."),
    click.option("--send-buffer", type=click.IntRange(0, INT_MAX), default=DEFAULTS.send_buffer,
                 help="Bytes of each connection's kernel send buffer (SO_SNDBUF; 0: the system's autotuning, "
                      "up to megabytes a connection, which hide a slow reader longer); on Ray, the output a "
                      "stream may have unacknowledged in Serve's proxy."),
    click.option("--batch/--no-batch", "batched", default=DEFAULTS.batched,
                 help="Step the slots through the folder's batched step graphs (<side>_slots.onnx, written "
                      "by codec-export --slots B), B slots a call, where it has them; --no-batch steps one "
                      "slot a call."),
    click.option("--allow-origin", "allow_origin", multiple=True, callback=_origins, metavar="ORIGIN",
                 help="A page whose WebSockets may connect (repeat for more), as http://localhost:5173; a "
                      "browser's WebSocket from any other page is refused, a client that sends no Origin "
                      "(not a browser) is not."),
    click.option("--engine", type=click.Choice(["local", "ray"]), default="local",
                 help="local: one process; ray: replicas on a Ray cluster behind Ray Serve's proxy, each "
                      "with --slots slots a side (docs/serve.md, Ray)."),
    click.option("--address", default=None,
                 help="--engine ray: the cluster to join (host:port of its head; default RAY_ADDRESS, else a "
                      "private local Ray)."),
    click.option("--replicas", type=click.IntRange(1, 1024), default=1,
                 help="--engine ray: replicas, each holding --slots slots a side."),
    click.option("--autoscale", callback=_bounds, metavar="MIN:MAX[:S]", default=None,
                 help="--engine ray: from MIN to MAX replicas, on the slots in use (instead of --replicas); "
                      "one goes after S seconds of less need (default 30)."),
    click.option("--replica-cpus", type=Finite(min=0.01, max=4096), default=None,
                 help="--engine ray: cores a replica holds (Ray's num_cpus; its ORT threads follow) "
                      "[default: the cores over the replicas on a Ray started here, 1 on a cluster]."),
    click.option("--proxies", type=click.Choice(["every", "head"]), default="every",
                 help="--engine ray: Serve's proxy on every node (behind a balancer) or on the head only."),
]


def serve_options(f):
    """The flags above, as click decorators of the command `f`."""
    for option in reversed(_OPTIONS):
        f = option(f)
    return f


def settings(params: dict, replicas_given: bool) -> tuple[ServeConfig, RayPlan | None]:
    """The config and (for --engine ray) the plan of parsed flags `params` (click's names);
    `replicas_given`: --replicas was passed, not defaulted. click.UsageError for flags that
    exclude each other."""
    ray = params["engine"] == "ray"
    if params["autoscale"] is not None and replicas_given:
        raise click.UsageError("--replicas and --autoscale exclude each other: choose a fixed number of "
                               "replicas or a MIN:MAX range")
    if not ray and (params["address"] or params["autoscale"] or params["replicas"] != 1
                    or params["replica_cpus"] or params["proxies"] != "every"):
        raise click.UsageError("--address, --replicas, --autoscale, --replica-cpus and --proxies are for "
                               "--engine ray")
    config = ServeConfig(**{k: params[k] for k in ServeConfig.__dataclass_fields__ if k in params})
    if not ray:
        return config, None
    auto = params["autoscale"]
    return config, RayPlan(address=params["address"], replicas=params["replicas"],
                           autoscale=None if auto is None else auto[:2], cpus=params["replica_cpus"],
                           proxies=params["proxies"],
                           downscale=RayPlan.downscale if auto is None else auto[2])


def parse_args(args: dict) -> tuple[ServeConfig, RayPlan]:
    """The config and plan of a RayService's `args` (the flags by their names, `allow_origin` a
    list or one origin, `batched` or `batch` a bool), parsed as the command line parses them."""
    command = click.Command("codec-serve", params=serve_options(lambda: None).__click_params__[::-1])
    by_name = {p.name: p for p in command.params}
    argv: list[str] = []
    for key, value in args.items():
        name = "batched" if key == "batch" else key
        param = by_name.get(name)
        if param is None or name in ("engine", "address", "proxies"):
            known = sorted(set(by_name) - {"engine", "address", "proxies"})
            raise CodecportError(f"unknown application arg {key!r}; known: model, provider, "
                                 f"{', '.join(known)} (the proxies' placement and the cluster's address "
                                 "are Serve's config, not the app's)")
        if value is None:
            continue
        if param.is_flag:
            on = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
            argv.append(param.opts[0] if on else param.secondary_opts[0])
            continue
        for one in (value if isinstance(value, (list, tuple)) and param.multiple else [value]):
            argv += [param.opts[0], str(one)]
    try:
        ctx = command.make_context("codec-serve", [*argv, "--engine", "ray"])
        given = ctx.get_parameter_source("replicas") is not click.core.ParameterSource.DEFAULT
        return settings(ctx.params, given)
    except click.ClickException as e:
        raise CodecportError(f"application args: {e.format_message()}") from None
