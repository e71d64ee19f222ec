"""ONNX Runtime sessions: provider choice, and the facts each graph carries in its metadata."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..errors import CodesError, ModelFileError, ProviderError
from .rvq import check_code_values

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
# Provider options set by default (overridable, see `provider_options`):
# - CoreML: ML Program (our graphs are one ML Program partition; NeuralNetwork lacks Sin/Erf...),
#   static input shapes only (ours are static), every compute unit;
# - CUDA: exhaustive cuDNN conv algorithm search (fixed shapes: searched once per session).
DEFAULT_OPTIONS = {
    "CoreMLExecutionProvider": {"ModelFormat": "MLProgram", "RequireStaticInputShapes": "1",
                                "MLComputeUnits": "ALL"},
    "CUDAExecutionProvider": {"cudnn_conv_algo_search": "EXHAUSTIVE"},
}


def provider_options(provider: str, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Options for ORT provider `provider`: our defaults, then the caller's overrides."""
    return {**DEFAULT_OPTIONS.get(provider, {}), **(overrides or {})}


def session_options() -> ort.SessionOptions:
    """Session options for every graph; DirectML needs its own (see `open_graph`)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # Spinning worker threads of one session starve the next one (Mimi runs encoder and decoder
    # steps back to back): on the 2-core dev machine a Mimi encode step took 47 ms spinning,
    # 32 ms not.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


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


def open_graph(path: Path, provider: str, options: dict[str, str] | None = None) -> Graph:
    """Session for `path` on `provider` (with `provider_options` overridden by `options`);
    a missing or corrupt file is a `ModelFileError`."""
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file; run codec-export first")
    opts = session_options()
    if provider == "DmlExecutionProvider":
        # DirectML's documented requirements: no memory pattern, sequential execution.
        opts.enable_mem_pattern = False
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    try:
        sess = ort.InferenceSession(str(path), opts, providers=[provider],
                                    provider_options=[provider_options(provider, options)])
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


def _manifest_export_id(path: Path) -> str | None:
    """The export id in manifest.json; None when there is no readable one (graphs copied alone)."""
    try:
        return str(json.loads(path.read_text())["export_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class GraphFolder:
    """The graphs of one export folder, opened lazily on one provider.

    Every graph opened is checked against the first: same codec and the same `shared` facts
    (export id, rates, quantizer...), and the role/mode its file name promises.
    """

    codec = ""  # metadata "codec" the folder must hold
    label = ""  # codec name for messages
    graphs: tuple[str, ...] = ()
    shared: tuple[str, ...] = ("codec", "export_id", "variant", "sample_rate", "weights_sha256",
                               "quantizer", "n_codebooks", "codebook_size")

    def __init__(self, model_dir: Path, provider: str = "cpu", fallback: str | None = None,
                 options: dict[str, str] | None = None):
        self.dir = Path(model_dir)
        self.options = options
        if not self.dir.is_dir():
            raise ModelFileError(f"{self.dir}: no such model folder; run codec-export {self.codec} "
                                 f"-o {self.dir}")
        self.present = [g for g in self.graphs if (self.dir / f"{g}.onnx").is_file()]
        if not self.present:
            raise ModelFileError(f"{self.dir}: holds no {self.label} graphs; run codec-export "
                                 f"{self.codec} -o {self.dir}")
        self.provider = resolve_provider(provider, fallback)
        self._graphs: dict[str, Graph] = {}
        self._manifest_id = _manifest_export_id(self.dir / "manifest.json")
        self.meta = self.graph(self.present[0]).meta

    def check_codes(self, codes: np.ndarray) -> np.ndarray:
        """Codes as `[C, K, T]` int64, or `CodesError` saying what is wrong."""
        codes = np.asarray(codes)
        if codes.ndim == 2:
            codes = codes[None]
        n = int(self.meta["n_codebooks"])
        if codes.ndim != 3 or not 1 <= codes.shape[1] <= n or codes.shape[2] == 0:
            raise CodesError(f"codes must be [channels, codebooks<={n}, frames], got shape "
                             f"{list(codes.shape)}")
        check_code_values(codes, int(self.meta["codebook_size"]))
        return codes.astype(np.int64)

    def expected(self, name: str) -> dict[str, str]:
        """Metadata the graph stored as `name`.onnx must carry."""
        return {"role": name.split("_")[0]}

    def missing(self, name: str) -> str:
        """What to do when `name`.onnx is absent."""
        return f"re-run codec-export {self.codec}"

    def graph(self, name: str) -> Graph:
        if name not in self._graphs:
            if name not in self.present:
                raise ModelFileError(f"{self.dir} has no {name}.onnx; {self.missing(name)}")
            g = open_graph(self.dir / f"{name}.onnx", self.provider, self.options)
            if g.meta.get("codec") != self.codec:
                raise ModelFileError(f"{g.path}: holds a {g.meta.get('codec')} model, not "
                                     f"{self.codec}; use a {self.codec} export")
            if self._manifest_id not in (None, g.meta.get("export_id")):
                raise ModelFileError(f"{g.path} does not belong with {self.dir}/manifest.json "
                                     f"(export_id {g.meta.get('export_id')} vs {self._manifest_id}); "
                                     "re-export the folder")
            if self._graphs:
                ref = next(iter(self._graphs.values()))
                bad = [k for k in self.shared if g.meta.get(k) != ref.meta.get(k)]
                if bad:
                    raise ModelFileError(f"{g.path} does not belong with {ref.path} ({bad[0]}: "
                                         f"{g.meta.get(bad[0])} vs {ref.meta.get(bad[0])}); "
                                         "re-export the folder")
            wrong = {k: v for k, v in self.expected(name).items() if g.meta.get(k) != v}
            if wrong:
                k = next(iter(wrong))
                raise ModelFileError(f"{g.path}: has {k} {g.meta.get(k)}, expected {wrong[k]} "
                                     f"for {name}.onnx; re-export the folder")
            self._graphs[name] = g
        return self._graphs[name]
