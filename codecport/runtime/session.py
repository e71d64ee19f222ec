"""ONNX Runtime sessions: provider choice, and the facts each graph carries in its metadata."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..errors import ModelFileError, ProviderError

log = logging.getLogger(__name__)

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "dml": "DmlExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
}
# What to install for each provider (the error message says it).
INSTALL = {
    "cuda": "pip install 'codecport[gpu]' (onnxruntime-gpu, with CUDA 12 and cuDNN 9)",
    "dml": "pip install onnxruntime-directml (Windows)",
    "coreml": "the standard onnxruntime wheel on macOS",
}
AUTO_ORDER = ("cuda", "dml", "coreml", "cpu")


def resolve_provider(provider: str, fallback: str | None = None) -> str:
    """ORT provider name for `cpu|cuda|dml|coreml|auto`, or `ProviderError` saying what to install."""
    available = ort.get_available_providers()
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
    raise ProviderError(f"{PROVIDERS[provider]} is not available in this onnxruntime (it has "
                        f"{', '.join(available)}); install it with {INSTALL[provider]}, "
                        "or pass --fallback cpu")


@dataclass
class Graph:
    """One loaded graph: its session, metadata and the provider that actually runs it."""

    path: Path
    session: ort.InferenceSession
    meta: dict[str, str]

    @property
    def provider(self) -> str:
        return self.session.get_providers()[0]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        inp = self.session.get_inputs()[0]
        return self.session.run(None, {inp.name: x})[0]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """All outputs, in the graph's output order."""
        return self.session.run(None, feeds)

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.session.get_outputs()]

    def int(self, key: str) -> int:
        return int(self.meta[key])


def read_metadata(path: Path) -> dict[str, str]:
    """metadata_props of an ONNX file, without building a full session for execution."""
    return open_graph(path, "CPUExecutionProvider").meta


def open_graph(path: Path, provider: str) -> Graph:
    """Session for `path` on `provider`; a missing or corrupt file is a `ModelFileError`."""
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file; run codec-export first")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # Spinning worker threads of one session starve the next one (Mimi runs encoder and decoder
    # steps back to back): on the 2-core dev machine a Mimi encode step took 47 ms spinning,
    # 32 ms not.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        sess = ort.InferenceSession(str(path), opts, providers=[provider])
    except Exception as e:  # ORT raises its own untyped Fail/InvalidProtobuf errors
        raise ModelFileError(f"{path}: not a loadable ONNX model ({str(e).splitlines()[0]}); "
                             "re-run codec-export") from e
    meta = dict(sess.get_modelmeta().custom_metadata_map)
    if "codec" not in meta:
        raise ModelFileError(f"{path}: has no codecport metadata; export it with codec-export")
    if provider not in sess.get_providers():
        # ORT silently drops a provider whose libraries fail to load.
        raise ProviderError(f"{provider} failed to initialise for {path.name} (running on "
                            f"{sess.get_providers()[0]}); check the CUDA/cuDNN install or pass "
                            "--fallback cpu")
    return Graph(path, sess, meta)
