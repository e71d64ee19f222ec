"""The command line: `codec-export` (export.py, needs the [export] extra), `codec-run` (run.py,
runtime only) and `codec-serve` (serve.py, the [serve] extra), with what they share in common.py.

Both iterate over the codec registry: `codec-export CODEC` is one command per registered codec,
and `codec-run` asks each folder which codec it holds. Results go to stdout, diagnostics to
stderr; every failure is one line (`error: ...`, exit 1; anything unexpected `internal error:
...`, exit 2) and no traceback unless -v asks for it. `--help` imports neither torch nor
onnxruntime.
"""

from .export import export_cli
from .run import run_cli
from .serve import serve_cli

__all__ = ["export_cli", "run_cli", "serve_cli"]
