"""What every front end (codec-export, codec-run, codec-serve, codec-bench, the demo) does with a
failure: one line, never a traceback. A `CodecportError` is `error: ...` and exit 1; a usage
error (a bad option, a missing argument, an invalid value) is `error: ...; see 'CMD --help'` and
exit 2, not click's four lines; SIGTERM unwinds as Ctrl-C does; anything unexpected is
`internal error: ...` and exit 2, its traceback under -v."""

from __future__ import annotations

import errno
import functools
import logging
import math
import os
import signal
import sys
import threading
import traceback

import click

from .errors import CodecportError

# The largest size or count an option takes: what C code downstream (numpy's dimensions, a
# socket's buffer, torch's sizes) reads as a 32-bit int; past it they fail with their own errors.
INT_MAX = 2**31 - 1
SEED_MAX = 2**32 - 1

_PATH_ERRNOS = {errno.ENAMETOOLONG, errno.ELOOP, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EROFS,
                errno.EDQUOT, errno.EISDIR, errno.ENOTDIR, errno.ENOENT}
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
        except OSError as e:
            if e.errno not in _PATH_ERRNOS or e.filename is None:
                internal_error(e)
            # A path the system refuses wherever it is met (a name past 255 bytes, a loop of links,
            # no permission, a full or read-only disk): the user's to change, not a bug.
            click.echo(f"error: {e.filename}: {e.strerror}; check the path (or free the disk)", err=True)
            sys.exit(1)
        except UnicodeEncodeError as e:
            if "surrogates not allowed" not in str(e):
                internal_error(e)
            # A file name that is not valid UTF-8 reached a library that encodes paths as UTF-8.
            click.echo("error: a path is not valid UTF-8 (its name holds undecodable bytes); rename it",
                       err=True)
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


class UsageLine(click.ClickException):
    """A usage error as one `error:` line that names the help; exit code 2, as click's."""

    exit_code = 2

    def __init__(self, error: click.UsageError):
        # click lists a choice's values one a line, and ends most messages with a full stop
        super().__init__(" ".join(error.format_message().split()).removesuffix("."))
        self.command = error.ctx.command_path if error.ctx is not None else None

    def show(self, file=None) -> None:
        hint = f"; see '{self.command} --help'" if self.command else ""
        click.echo(f"error: {self.message}{hint}", err=True)


class OneLineUsage:
    """Mixin for a click command or group: its usage errors (a bad option, a missing argument,
    an invalid value, also a subcommand's) are `UsageLine`s."""

    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as e:
            raise UsageLine(e) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            raise UsageLine(e) from None


class Group(OneLineUsage, click.Group):
    """`click.Group` with one-line usage errors (`@click.group(cls=Group)`)."""


class Command(OneLineUsage, click.Command):
    """`click.Command` with one-line usage errors (`@click.command(cls=Command)`)."""


class Finite(click.FloatRange):
    """click's `FloatRange`, also refusing NaN and infinity (which its bounds let through)."""

    name = "finite float range"

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv
