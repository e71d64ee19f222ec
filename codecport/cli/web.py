"""`codec-run web`: the browser demo's server (codecport/serve/web.py)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from ..frontend import guard, setup_logging
from .common import verbose_option


@click.command("web")
@click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="Folder written by codec-export ... --target web.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000,
              help="Port on 127.0.0.1 (0: any free one).")
@click.option("--ort-web", "ort_web", type=click.Path(path_type=Path), default=None,
              help="onnxruntime-web's dist folder [default: $CODECPORT_ORT_WEB, else "
                   "node_modules/onnxruntime-web here or beside codecport's source].")
@verbose_option
@guard
def web_cmd(model_dir, port, ort_web, verbose) -> None:
    """Serve the browser demo on 127.0.0.1: the page at /, codecport.mjs, the folder at /model/
    and onnxruntime-web at /ort/, cross-origin isolated for multi-threaded WASM."""
    from ..serve.web import WebServer

    setup_logging(verbose)
    server = WebServer(model_dir, ort_web, port)
    m = server.manifest
    click.echo(f"serving {m['codec']} {m.get('preset')} ({model_dir}) with onnxruntime-web from "
               f"{server.ort_dir}")
    click.echo(f"open {server.url}  (Ctrl-C stops)", nl=True)
    sys.stdout.flush()
    # Ctrl-C and a process manager's SIGTERM both stop it cleanly; installed here because a shell
    # starts background jobs with SIGINT ignored, which Python would otherwise keep.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo("stopped")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
