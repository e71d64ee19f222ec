"""The command line, for the tests: in this process (click's runner) where only the CLI's contract
is checked (its exit code, one `error:` line, stdout and stderr, nothing written), which does not
depend on the process; as a real process (`process`) where the process matters: signals, kills,
a clean environment, the installed console scripts, one end-to-end run per command."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


class _Stderr(logging.StreamHandler):
    """Log records to whatever `sys.stderr` is when they are written (the runner swaps it), as a
    command's own process writes them."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _group(tool: str):
    if tool == "codec-run":
        from codecport.cli import run_cli

        return run_cli
    if tool == "codec-export":
        from codecport.cli import export_cli

        return export_cli
    if tool == "codec-bench":
        from codecport.bench.cli import main

        return main
    if tool == "codec-serve":
        from codecport.cli import serve_cli

        return serve_cli
    if tool == "codec-demo":
        from codecport.demo import main

        return main
    raise ValueError(tool)


def invoke(tool: str, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`tool ARGS` in this process: (exit code, stdout, stderr) as the process would give them,
    library warnings (INFO with -v) on stderr as the command's logging prints them."""
    from click.testing import CliRunner

    argv = [str(a) for a in args]
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO if "-v" in argv or "--verbose" in argv else logging.WARNING)
    root, level = logging.getLogger(), logging.getLogger().level
    root.addHandler(handler)
    root.setLevel(min(level or logging.WARNING, handler.level))
    try:
        r = CliRunner().invoke(_group(tool), argv, env=env, prog_name=tool)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return subprocess.CompletedProcess([tool, *argv], r.exit_code, r.stdout, r.stderr)


def process(tool: str, *args, env: dict | None = None, timeout: float = 300,
            **kw) -> subprocess.CompletedProcess:
    """`tool ARGS` as a user runs it: the installed console script, a process of its own."""
    return subprocess.run([str(BIN / tool), *map(str, args)], capture_output=True, text=True, check=False,
                          timeout=timeout, env=None if env is None else {**os.environ, **env}, **kw)
