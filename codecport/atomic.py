"""Atomic file writes: a failed step never leaves a half-written output behind."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import OutputError


def unwritable(path: Path, e: OSError) -> OutputError:
    return OutputError(f"cannot write {path} ({e.strerror or e}); pass another output path")


def _no_file_above(path: Path) -> None:
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            raise OutputError(f"cannot write {path}: {parent} is a file, not a folder; "
                              "pass another output path")


def ready_parent(path: Path) -> None:
    """Make `path`'s folder; `OutputError` if `path` could not be written as a file there (a
    folder in its place, a file in a parent's place, no permission)."""
    if path.is_dir():
        raise OutputError(f"{path} is a folder; pass a file name as the output")
    _no_file_above(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise unwritable(path, e) from e


def check_apart(out: Path, reads: list[Path]) -> None:
    """`OutputError` when writing `out` would replace what the command reads: one of its input
    files (the user's audio under a codes suffix), or a file inside a folder it reads (an
    export's rvq.npz)."""
    target = out.resolve()
    for src in reads:
        if src.is_dir() and target.is_relative_to(src.resolve()):
            raise OutputError(f"{out} is inside {src}, which this command reads; pass an -o outside it")
        if target == src.resolve() or (out.exists() and src.exists() and os.path.samefile(out, src)):
            raise OutputError(f"{out} is the input {src}; writing it would destroy it: pass another -o")


def check_dir_writable(path: Path) -> None:
    """`OutputError` unless `atomic_dir(path)` could write: no file in a parent's place, and its
    staging folder can be made beside `path` (tried now, before a long job, and removed; nothing
    is created for a `path` whose parents are missing)."""
    _no_file_above(path)
    base = path.absolute().parent
    while not base.exists():
        base = base.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".codecport-probe.", dir=base))
    except OSError as e:
        raise unwritable(path, e) from e


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; it replaces `path` only if the block succeeds. An
    output that cannot be written there is an `OutputError`, said before the block runs where
    it can be known then (a folder in its place, a file in its parents' place)."""
    ready_parent(path)
    try:
        tmp = _new_file_beside(path)
    except OSError as e:
        raise unwritable(path, e) from e
    try:
        yield tmp
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise unwritable(path, e) from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _new_file_beside(path: Path) -> Path:
    """A new empty file `.{name}.XXXXXXXX.part` beside `path`, with the mode a plain open() would
    give `path` (0666 less the umask, which the system applies as it creates the file). Not
    mkstemp's private 0600 widened afterwards: that needs the umask, and reading it means
    setting it, process-wide, under the feet of every other thread creating a file."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.part"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no unused temporary name beside {path}")


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """For a folder (e.g. a `.mlpackage`): yield a scratch folder beside `path`; what the block
    writes as `scratch/<path.name>` replaces `path` only if the block succeeds. Rename cannot
    replace a non-empty directory, so an existing one is first moved into the scratch folder:
    `path` is briefly absent, but never half-written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent))
    except OSError as e:
        raise unwritable(path, e) from e
    try:
        yield scratch
        previous = scratch / "previous"
        if path.exists() or path.is_symlink():
            os.replace(path, previous)
        try:
            os.replace(scratch / path.name, path)
        except OSError:
            if previous.exists() or previous.is_symlink():
                os.replace(previous, path)
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
