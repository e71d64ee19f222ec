"""What the commands of codec-export, codec-run and codec-serve share: the options every
`codec-run` command that runs a model takes, and diagnostics (the one-line errors, logging and
SIGTERM are frontend.py's, which codec-bench and the demo share). Choices come from the registry
and the runtime, never copied."""

from __future__ import annotations

from pathlib import Path

import click

from ..runtime.codes import MODES
from ..runtime.providers import PROVIDERS

MODE_CHOICES = ("auto", *MODES)


def codebooks_help(what: str) -> str:
    """`--codebooks`'s help, its defaults read from the registered codecs."""
    from .. import registry

    defaults = ", ".join(f"{s.label} {s.runtime.default_codebooks or 'all'}" for s in registry.codecs())
    return f"{what} [default: {defaults}]."
PROVIDER_CHOICES = (*PROVIDERS, "auto")
def note(message: str) -> None:
    """A diagnostic: stderr, so that stdout holds only results."""
    click.echo(message, err=True)


verbose_option = click.option("-v", "--verbose", is_flag=True, help="Log what happens; show tracebacks.")


def parse_options(ctx, param, values) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{v!r} is not KEY=VALUE", ctx=ctx, param=param)
        out[key] = value
    return out


def provider_options(fn):
    """--provider, --fallback and --provider-option."""
    for option in reversed([
        click.option("--provider", type=click.Choice(PROVIDER_CHOICES), default="cpu",
                     help="ONNX Runtime execution provider."),
        click.option("--fallback", type=click.Choice(["cpu"]), default=None,
                     help="Use this provider when the requested one is not installed."),
        click.option("--provider-option", "options", multiple=True, callback=parse_options,
                     metavar="KEY=VALUE",
                     help="ONNX Runtime provider option, overriding codecport's defaults "
                          "(e.g. MLComputeUnits=CPUAndNeuralEngine for CoreML); repeatable."),
    ]):
        fn = option(fn)
    return fn


def run_options(fn):
    """Options every `codec-run` command that runs a model takes."""
    fn = verbose_option(fn)
    fn = provider_options(fn)
    fn = click.option("--mode", type=click.Choice(MODE_CHOICES), default="auto",
                      # the codec's choice
                      callback=lambda ctx, param, value: None if value == "auto" else value,
                      help="Way through the graphs: fixed (one call of the fixed-length pair), "
                           "chunked (fixed windows decoded alone, as an official chunked compress), "
                           "step (the step graphs), "
                           "whole (windows overlapping by the receptive field: the official codes of "
                           "the whole clip), or auto (the codec's choice by length).")(fn)
    return click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path), required=True,
                        help="Folder written by codec-export.")(fn)
