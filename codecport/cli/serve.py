"""`codec-serve`: live streams of one exported folder over WebSocket (codecport/serve/server.py,
the protocol in docs/serve.md). Runtime only, plus aiohttp (the [serve] extra)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .. import registry
from ..errors import CodecportError
from ..frontend import INT_MAX, Command, Finite, guard, setup_logging
from ..serve.access import normal_origin
from ..serve.config import ServeConfig
from ..version import __version__
from .common import provider_options, verbose_option

DEFAULTS = ServeConfig()  # the flags' defaults: ServeConfig's, written once


def _origins(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    try:
        return tuple(dict.fromkeys(normal_origin(v) for v in values))
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _bounds(ctx, param, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    lo, sep, hi = value.partition(":")
    if not (sep and lo.isdigit() and hi.isdigit()) or not 1 <= int(lo) <= int(hi) <= 1024:
        raise click.BadParameter(f"{value!r} is not MIN:MAX replicas (1 <= MIN <= MAX <= 1024), as 1:4")
    return int(lo), int(hi)


@click.command(cls=Command, context_settings={"show_default": True})
@click.version_option(__version__, prog_name="codec-serve")
@click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="Folder written by codec-export with step graphs (codec-export mimi, codec-export snac).")
@click.option("--slots", type=click.IntRange(1, 4096), default=DEFAULTS.slots,
              help="Streams at once: slots of each side's pool (a duplex stream holds one of each).")
@click.option("--host", default=DEFAULTS.host, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULTS.port,
              help="Port to listen on (0: any free one; the printed URL says which).")
@click.option("--queue", type=click.IntRange(0, INT_MAX), default=DEFAULTS.queue,
              help="Connections that may wait for a slot when all are taken (0: refuse them at once, busy).")
@click.option("--queue-timeout", type=Finite(min=0, max=86400), default=DEFAULTS.queue_timeout,
              help="Seconds a queued connection waits before it is refused (busy).")
@click.option("--idle-timeout", type=Finite(min=0.1, max=86400), default=DEFAULTS.idle_timeout,
              help="Seconds a stream may send nothing (before its end) until it is ended (timeout) and its "
                   "slots go back.")
@click.option("--handshake-timeout", type=Finite(min=0.1, max=86400), default=DEFAULTS.handshake_timeout,
              help="Seconds a new connection has to send its HTTP request, then its stream's JSON request.")
@click.option("--grace", type=Finite(min=0, max=86400), default=DEFAULTS.grace,
              help="Seconds SIGTERM lets the streams in flight finish before it ends them.")
@click.option("--max-message", type=click.IntRange(1024, INT_MAX), default=DEFAULTS.max_message,
              help="Bytes of one message from a client; a larger one is refused (too_large).")
@click.option("--max-backlog", type=click.IntRange(1024, INT_MAX), default=DEFAULTS.max_backlog,
              help="Bytes of output waiting for a slow client: warned at half of this, dropped past it.")
@click.option("--send-buffer", type=click.IntRange(0, INT_MAX), default=DEFAULTS.send_buffer,
              help="Bytes of each connection's kernel send buffer (SO_SNDBUF; 0: the system's autotuning, "
                   "up to megabytes a connection, which hide a slow reader longer).")
@click.option("--batch/--no-batch", "batched", default=DEFAULTS.batched,
              help="Step the slots through the folder's batched step graphs (<side>_slots.onnx, written by "
                   "codec-export --slots B), B slots a call, where it has them; --no-batch steps one slot "
                   "a call.")
@click.option("--allow-origin", "allow_origin", multiple=True, callback=_origins, metavar="ORIGIN",
              help="A page whose WebSockets may connect (repeat for more), as http://localhost:5173; a "
                   "browser's WebSocket from any other page is refused, a client that sends no Origin "
                   "(not a browser) is not.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local",
              help="local: one process; ray: replicas on a Ray cluster behind Ray Serve's proxy, each "
                   "with --slots slots a side (docs/serve.md, Ray).")
@click.option("--address", default=None,
              help="--engine ray: the cluster to join (host:port of its head; default RAY_ADDRESS, else a "
                   "private local Ray).")
@click.option("--replicas", type=click.IntRange(1, 1024), default=1,
              help="--engine ray: replicas, each holding --slots slots a side.")
@click.option("--autoscale", callback=_bounds, metavar="MIN:MAX", default=None,
              help="--engine ray: from MIN to MAX replicas, on the slots in use (instead of --replicas).")
@click.option("--replica-cpus", type=Finite(min=0.01, max=4096), default=None,
              help="--engine ray: cores a replica holds (Ray's num_cpus; its ORT threads follow) [default: "
                   "the cores over the replicas on a Ray started here, 1 on a cluster].")
@click.option("--proxies", type=click.Choice(["every", "head"]), default="every",
              help="--engine ray: Serve's proxy on every node (behind a balancer) or on the head only.")
@provider_options
@verbose_option
@guard
def serve_cli(model_dir, slots, host, port, queue, queue_timeout, idle_timeout, handshake_timeout, grace,
              max_message, max_backlog, send_buffer, batched, allow_origin, engine, address, replicas,
              autoscale, replica_cpus, proxies, provider, fallback, options, verbose) -> None:
    """Serve live streams of an exported codec over WebSocket: PCM in and codes out (encode),
    codes in and PCM out (decode), or both (duplex), one stream per connection at
    ws://HOST:PORT/stream, with /health and /metrics. SIGTERM drains and exits."""
    setup_logging(verbose)
    if autoscale is not None and click.get_current_context().get_parameter_source("replicas") not in (
            None, click.core.ParameterSource.DEFAULT):
        raise click.UsageError("--replicas and --autoscale exclude each other: choose a fixed number of "
                               "replicas or a MIN:MAX range")
    if engine == "local" and (address or autoscale or replicas != 1 or replica_cpus or proxies != "every"):
        raise CodecportError("--address, --replicas, --autoscale, --replica-cpus and --proxies are for "
                             "--engine ray")
    try:
        from ..serve.server import run
    except ImportError as e:
        raise CodecportError(f"codec-serve needs aiohttp ({e}); pip install 'codecport[serve]'") from None
    spec = registry.codec_of_folder(model_dir)
    # Every graph of the folder read and checked now, without a session, as `codec-run info` checks
    # them: a damaged one is refused here, not in each stream after "listening" (a stream opens
    # its step graph only as it starts, where the pool runs the slot graphs).
    codec = spec.runtime(model_dir, sessions=False)
    codec.read_graphs(list(codec.files.values()))
    if engine == "ray":
        # The replicas open their own sessions: the driver holds none (with --provider cuda, a
        # CUDA context for nothing); it resolves the provider and checks the options they take.
        from ..runtime.providers import intra_op_threads, parallel_windows, resolve_provider

        provider_name = resolve_provider(provider, fallback)
        parallel_windows(provider_name, options)
        intra_op_threads(options)
    else:
        codec = spec.runtime(model_dir, provider, fallback, options)
        provider_name = codec.provider
    if not codec.streams:
        raise CodecportError(f"{model_dir}: {codec.no_stream('encoder or decoder')}; codec-serve serves "
                             "streams: use codec-run for whole files")
    config = ServeConfig(slots=slots, host=host, port=port, queue=queue, queue_timeout=queue_timeout,
                         idle_timeout=idle_timeout, handshake_timeout=handshake_timeout, grace=grace,
                         max_message=max_message, max_backlog=max_backlog, send_buffer=send_buffer,
                         batched=batched, allow_origin=allow_origin)

    def announce(url: str) -> None:
        where = "" if engine == "local" else (
            f", on Ray: {replicas} replica{'s' if replicas > 1 else ''}" if autoscale is None
            else f", on Ray: {autoscale[0]} to {autoscale[1]} replicas")
        click.echo(f"serving {spec.label} {codec.preset} ({model_dir}) on {provider_name}: "
                   f"{slots} slot{'s' if slots > 1 else ''} a side{' a replica' if where else ''} "
                   f"({', '.join(codec.streams)})" + (f", a queue of {queue}" if queue else "") + where)
        ws = url.replace("http", "ws", 1)
        click.echo(f"listening on {url}  (streams: {ws}/stream, {url}/health, {url}/metrics; SIGTERM drains)")
        sys.stdout.flush()

    if engine == "ray":
        from ..serve.onray import RayPlan, run_on_ray

        plan = RayPlan(address=address, replicas=replicas, autoscale=autoscale, cpus=replica_cpus,
                       proxies=proxies)

        def tell(line: str) -> None:
            click.echo(line)
            sys.stdout.flush()

        run_on_ray(str(Path(model_dir).resolve()), provider, fallback, dict(options or {}), config, plan,
                   announce, tell=tell)
    else:
        run(codec, config, announce)
    click.echo("stopped")
