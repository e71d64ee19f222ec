"""Atomic file writes: a failed step never leaves a half-written output behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; it replaces `path` only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        # mkstemp makes the file private (0600); give it the mode a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """For a folder (e.g. a `.mlpackage`): yield a scratch folder beside `path`; what the block
    writes as `scratch/<path.name>` replaces `path` only if the block succeeds. Rename cannot
    replace a non-empty directory, so an existing one is first moved into the scratch folder:
    `path` is briefly absent, but never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent))
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
