"""What every command shares: the error guard (one line, never a traceback), logging, and the
options every `codec-run` command that runs a model takes. Choices come from the registry and the
runtime, never copied."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

import click

from ..errors import CodecportError
from ..runtime.codes import MODES
from ..runtime.providers import PROVIDERS

MODE_CHOICES = ("auto", *MODES)


def codebooks_help(what: str) -> str:
    """`--codebooks`'s help, its defaults read from the registered codecs."""
    from .. import registry

    defaults = ", ".join(f"{s.label} {s.runtime.default_codebooks or 'all'}" for s in registry.codecs())
    return f"{what} [default: {defaults}]."
PROVIDER_CHOICES = (*PROVIDERS, "auto")
_state = {"verbose": False}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread runs so that cleanup runs (see `unwinds_on_sigterm`)."""


def unwinds_on_sigterm(fn):
    """While `fn` runs, SIGTERM unwinds it as Ctrl-C does (`Terminated`), so its `finally` blocks
    remove its staging folders and temporary files: the default action killed codec-export at
    once, leaving a hidden `.OUT.*.part` beside `-o` and gigabytes in /tmp."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():  # (only it may set handlers)
            return fn(*args, **kwargs)

        def terminate(*_):
            raise Terminated

        previous = signal.signal(signal.SIGTERM, terminate)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return wrapper


def guard(fn):
    """One line instead of a traceback: a `CodecportError` exits 1, anything unexpected exits 2
    (with the traceback under -v)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except CodecportError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except Terminated:
            click.echo("error: terminated (SIGTERM)", err=True)
            sys.exit(128 + signal.SIGTERM)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        except MemoryError as e:
            out_of_memory(e)
        except RuntimeError as e:
            if "can't allocate memory" in str(e):  # torch's allocator says it so
                out_of_memory(e)
            internal_error(e)
        except BrokenPipeError:  # stdout closed early (`| head`): nothing left to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except Exception as e:  # noqa: BLE001 (the last line of defence: a bug, never a traceback)
            internal_error(e)

    return wrapper


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


def out_of_memory(e: BaseException) -> None:
    """A job too large for the machine's memory (a --len of hours, a huge batch): what to change."""
    if _state["verbose"]:
        traceback.print_exc()
    click.echo(f"error: out of memory ({_first_line(e)[:200]}); this job is too large for this "
               "machine's memory: make it smaller (a shorter --len or --step-frames, a smaller "
               "--batch, fewer files at once)", err=True)
    sys.exit(1)


def internal_error(e: BaseException) -> None:
    if _state["verbose"]:
        traceback.print_exc()
    click.echo(f"internal error: {type(e).__name__}: {_first_line(e)}; rerun with -v for the "
               "traceback, and please report it", err=True)
    sys.exit(2)


def setup_logging(verbose: bool) -> None:
    _state["verbose"] = verbose
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


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
                      callback=lambda ctx, param, value: None if value == "auto" else value,  # the codec's choice
                      help="Way through the graphs: fixed (one call of the fixed-length pair), "
                           "chunked (fixed windows decoded alone, as an official chunked compress), step (the step graphs), "
                           "whole (windows overlapping by the receptive field: the official codes of "
                           "the whole clip), or auto (the codec's choice by length).")(fn)
    return click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path), required=True,
                        help="Folder written by codec-export.")(fn)
