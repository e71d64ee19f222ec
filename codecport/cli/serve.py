"""`codec-serve`: live streams of one exported folder over WebSocket (codecport/serve/server.py,
the protocol in docs/serve.md). Runtime only, plus aiohttp (the [serve] extra)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .. import registry
from ..errors import CodecportError
from ..frontend import Command, guard, setup_logging
from ..serve.flags import serve_options, settings
from ..version import __version__
from .common import provider_options, verbose_option


@click.command(cls=Command, context_settings={"show_default": True})
@click.version_option(__version__, prog_name="codec-serve")
@click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="Folder written by codec-export with step graphs (codec-export mimi, codec-export snac).")
@serve_options
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
    ctx = click.get_current_context()
    config, plan = settings(ctx.params, ctx.get_parameter_source("replicas") not in (
        None, click.core.ParameterSource.DEFAULT))
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
        from ..serve.onray import run_on_ray

        def tell(line: str) -> None:
            click.echo(line)
            sys.stdout.flush()

        run_on_ray(str(Path(model_dir).resolve()), provider, fallback, dict(options or {}), config, plan,
                   announce, tell=tell)
    else:
        run(codec, config, announce)
    click.echo("stopped")
