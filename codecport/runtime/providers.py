"""ONNX Runtime execution providers: which one runs, with which options and session settings."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

from ..errors import ProviderError

if TYPE_CHECKING:
    import onnxruntime as ort

log = logging.getLogger(__name__)

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "dml": "DmlExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
}
# What to install for each provider (the error message says it).
INSTALL = {
    "cuda": ("pip install 'codecport[gpu]' (onnxruntime-gpu with the CUDA 13 and cuDNN 9 libraries "
             "as pip packages)"),
    "dml": "pip install onnxruntime-directml (Windows)",
    "coreml": "the standard onnxruntime wheel on macOS",
}
AUTO_ORDER = ("cuda", "dml", "coreml", "cpu")
# Provider options set by default (overridable, see `provider_options`):
# - CoreML: ML Program (our graphs are one ML Program partition; NeuralNetwork lacks Sin/Erf...),
#   static input shapes only (ours are static), every compute unit;
# - CUDA: exhaustive cuDNN conv algorithm search (fixed shapes: searched once per session).
DEFAULT_OPTIONS = {
    "CoreMLExecutionProvider": {"ModelFormat": "MLProgram", "RequireStaticInputShapes": "1",
                                "MLComputeUnits": "ALL"},
    "CUDAExecutionProvider": {"cudnn_conv_algo_search": "EXHAUSTIVE"},
}
# Keys of the same KEY=VALUE set that codecport reads itself and never hands to ORT, with their
# defaults (every provider):
# - io_binding: 1 runs streaming step graphs through IO binding, their state kept between steps as
#   OrtValues on the provider's device (`Graph.device`: CUDA memory for the CUDA EP), so only the
#   step's input and output cross to the host; 0 runs them through plain `run` with numpy state.
#   Bit-identical results either way; 0 is there to rule the binding out when a provider misbehaves.
# - parallel: how many windows of a long signal run at once through the graphs a folder slides
#   over it (DAC's chunked pair, SNAC's window graph; their windows are independent). `auto` is 2
#   on the CPU EP with 2 or more cores, each run on half of them, and 1 elsewhere. Two runs keep
#   both cores busy through the kernels ORT runs on one thread: `Sin` (DAC's Snake) is 15 % of a
#   DAC-44k decoder's time and does not use the thread pool. Same results either way.
# - threads: CPU threads of each graph's kernels (ORT's intra-op pool). `auto` is ORT's default
#   (one per core), shared out between the parallel windows above; a number fixes it, as each worker of
#   `codec-run tokenize` does with its share of the cores.
CODECPORT_OPTIONS = {"io_binding": "1", "parallel": "auto", "threads": "auto"}
# The environment variable that turns ONNX Runtime's spinning off (see `session_options`).
SPIN_ENV = "CODECPORT_ORT_SPIN"
# Older names of those keys, still taken (codecport 0.2 called `parallel` `windows`).
OLD_OPTIONS = {"windows": "parallel"}


def provider_options(provider: str, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Options for ORT provider `provider`: our defaults, then the caller's overrides, less the
    `CODECPORT_OPTIONS` keys (ORT refuses keys it does not know for some providers)."""
    merged = {**DEFAULT_OPTIONS.get(provider, {}), **(overrides or {})}
    return {k: v for k, v in merged.items() if k not in CODECPORT_OPTIONS and k not in OLD_OPTIONS}


def _own(key: str, overrides: dict[str, str] | None) -> str:
    """codecport's own option `key` from `overrides` (under its old name too), else its default."""
    overrides = overrides or {}
    old = next((o for o, new in OLD_OPTIONS.items() if new == key and o in overrides), None)
    return str(overrides.get(key, overrides.get(old, CODECPORT_OPTIONS[key]))).strip().lower()


def codecport_option(key: str, overrides: dict[str, str] | None = None) -> bool:
    """A 0/1 `CODECPORT_OPTIONS` value: its default unless `overrides` set it."""
    value = _own(key, overrides)
    if value not in ("0", "1", "false", "true"):
        raise ProviderError(f"option {key} must be 0 or 1, got {value!r}")
    return value in ("1", "true")


def cpu_cores() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def parallel_windows(provider: str, overrides: dict[str, str] | None = None) -> int:
    """The `parallel` option (see `CODECPORT_OPTIONS`) as a number of windows run at once."""
    value = _own("parallel", overrides)
    if value == "auto":
        return 2 if provider == "CPUExecutionProvider" and cpu_cores() >= 2 else 1
    if not value.isdigit() or int(value) < 1:
        raise ProviderError(f"option parallel must be auto or a whole number of at least 1, got {value!r}")
    return int(value)


def intra_op_threads(overrides: dict[str, str] | None = None) -> int | None:
    """The `threads` option (see `CODECPORT_OPTIONS`): None for ORT's default."""
    value = _own("threads", overrides)
    if value == "auto":
        return None
    if not value.isdigit() or not 1 <= int(value) <= 1024:
        raise ProviderError(f"option threads must be auto or a whole number from 1 to 1024, got {value!r}")
    return int(value)


def onnxruntime():
    """ONNX Runtime, imported when a graph is first opened: `import codecport`, the registry and
    the CLI's `--help` stay light (half a second less, and no native library loaded)."""
    import onnxruntime

    return onnxruntime


_cuda_lock = threading.Lock()
_cuda_loaded = False


def load_cuda_libraries() -> None:
    """Load the CUDA and cuDNN libraries before the first CUDA session, once per process.

    onnxruntime-gpu does not bundle them. It finds them where a torch of the same CUDA imported
    first loaded them, or on the system's library path, but not in the `nvidia-*` pip packages
    that `codecport[gpu]` installs beside it: only `onnxruntime.preload_dlls()` loads those, and
    without it ORT drops the CUDA EP for the CPU (which `open_graph` refuses). It prints what it
    cannot load; that goes to the log, and `open_graph` says what failed.
    """
    global _cuda_loaded
    with _cuda_lock:
        if _cuda_loaded:
            return
        _cuda_loaded = True
        ort = onnxruntime()
        # ORT's documented order: a torch imported first has loaded its own copies already.
        if "torch" in sys.modules or not hasattr(ort, "preload_dlls"):
            return
        said = io.StringIO()
        try:
            with contextlib.redirect_stdout(said):
                ort.preload_dlls()
        except (OSError, RuntimeError) as e:
            log.warning("onnxruntime.preload_dlls() failed: %s", e)
        if said.getvalue().strip():
            log.info("onnxruntime.preload_dlls(): %s", " ".join(said.getvalue().split()))


def session_options() -> ort.SessionOptions:
    """Session options for every graph; DirectML needs its own (see `open_graph`)."""
    opts = onnxruntime().SessionOptions()
    opts.log_severity_level = 3
    # Worker threads spin between the kernels of a run (waking a sleeping thread for each of a
    # step graph's ~600 small kernels cost an int8 Mimi step a fifth of its time), and stop
    # spinning when the run returns: left spinning, they starve the next session (Mimi runs
    # encoder and decoder steps back to back; an encode step took 47 ms, not 32, on 2 cores).
    # A process whose cores are shared with other busy processes spins in their time instead:
    # `CODECPORT_ORT_SPIN=0` is for it (three pytest processes on two cores ran 1.5x faster).
    opts.add_session_config_entry("session.intra_op.allow_spinning", spin_setting())
    opts.add_session_config_entry("session.force_spinning_stop", "1")
    return opts


def spin_setting() -> str:
    """`CODECPORT_ORT_SPIN` (1, the default, or 0) as ORT's `allow_spinning` value."""
    value = os.environ.get(SPIN_ENV, "1").strip()
    if value not in ("0", "1"):
        raise ProviderError(f"{SPIN_ENV} must be 0 or 1, got {value!r}; unset it for the default (1)")
    return value


def resolve_provider(provider: str, fallback: str | None = None) -> str:
    """ORT provider name for `cpu|cuda|dml|coreml|auto`, or `ProviderError` saying what to install."""
    available = onnxruntime().get_available_providers()
    if provider == "auto":
        return next(PROVIDERS[p] for p in AUTO_ORDER if PROVIDERS[p] in available)
    if provider not in PROVIDERS:
        raise ProviderError(f"unknown provider {provider!r}; choose one of "
                            f"{', '.join([*PROVIDERS, 'auto'])}")
    if PROVIDERS[provider] in available:
        return PROVIDERS[provider]
    if fallback is not None:
        log.warning("%s is not available here; falling back to %s", PROVIDERS[provider], fallback)
        return resolve_provider(fallback)
    gpu = _gpu_build_shadowed() if provider == "cuda" else None
    if gpu:
        raise ProviderError(f"{PROVIDERS[provider]} is not available: onnxruntime and onnxruntime-gpu are "
                            "both installed and share one folder, where the CPU build's files were "
                            "written last; run pip install --force-reinstall --no-deps "
                            f"onnxruntime-gpu=={gpu}, or pass --fallback cpu")
    raise ProviderError(f"{PROVIDERS[provider]} is not available in this onnxruntime (it has "
                        f"{', '.join(available)}); install it with {INSTALL[provider]}, "
                        "or pass --fallback cpu")


def _gpu_build_shadowed() -> str | None:
    """onnxruntime-gpu's version when the CPU-only onnxruntime is installed too. codecport needs
    onnxruntime, so `codecport[gpu]` brings both; they write the same `onnxruntime` package, and
    whichever pip installed last is the one that runs (an upgrade of the CPU one undoes the GPU
    one)."""
    from importlib import metadata

    try:
        metadata.version("onnxruntime")
        return metadata.version("onnxruntime-gpu")
    except metadata.PackageNotFoundError:
        return None
