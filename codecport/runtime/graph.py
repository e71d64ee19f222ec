"""One exported graph: its ONNX Runtime session and the facts it carries in its metadata.

A graph is `{name}.onnx`, or `{name}.ort` (ONNX Runtime's own format, for the mobile and minimal
builds) where there is no `.onnx`; both carry the same metadata (the converter keeps it). Every
metadata value is parsed and range-checked where it is read (`Graph.int`, `Graph.choice`): a
file that lies about itself is refused with a one-line error, never trusted into an allocation.
Where only the facts are needed (`codec-run info`, which codec a folder holds), `read_graph` reads
an .onnx file's metadata and input/output shapes from its protobuf, with no session and no onnx
package; an .ort file (a FlatBuffer) still opens a session for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ModelFileError, ProviderError
from .onnxfile import read_onnx
from .providers import load_cuda_libraries, onnxruntime, provider_options, session_options

if TYPE_CHECKING:
    import onnxruntime as ort

# .onnx first: an .ort beside it is a copy converted for one build or target, not the export itself.
SUFFIXES = (".onnx", ".ort")
# numpy dtypes of the tensor types our graphs' inputs and outputs may have.
DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
          "tensor(int64)": np.int64, "tensor(int32)": np.int32}
# Integer metadata and the range a real export stays in. A value outside is a damaged or lying
# file: the bounds keep a bad file from sizing a buffer (2**31 samples is 12 hours at 48 kHz in
# one call, far past any fixed graph).
INT_RANGES = {
    "sample_rate": (1_000, 1_000_000), "frame_size": (1, 1 << 20), "n_codebooks": (1, 1024),
    "codebook_size": (2, 1 << 20), "codebook_dim": (1, 1 << 16), "latent_dim": (1, 1 << 16),
    "samples": (1, 1 << 31), "frames": (1, 1 << 31), "window": (1, 1 << 31),
    "chunk_step": (1, 1 << 31), "chunk_frames": (1, 1 << 31), "delay": (0, 1 << 31),
    "positions_per_step": (1, 1 << 20), "batch": (1, 4096), "slots": (1, 4096), "context": (1, 1 << 20),
    "n_semantic": (0, 1024), "unit_frames": (1, 1 << 16), "step_frames": (1, 1 << 20),
    "margin": (0, 1 << 20), "vq_strides": (1, 4096), "decoder_rates": (1, 64),
    "channels": (1, 8), "fbank_pad": (0, 1 << 16), "acoustic_extra": (0, 8),
    "input_rate": (1_000, 1_000_000), "input_frame_size": (1, 1 << 20), "levels": (2, 1 << 16),
}
RERUN = "re-export it with this version of codec-export"
# How ONNX Runtime refuses feeds whose names or types are not the graph's: shapes are checked as a
# graph opens, but a file whose inputs were renamed or retyped (edited, or written by another
# tool) is only found at its first call, and is the file's fault, not the caller's.
FEED_MISMATCH = ("Unexpected input data type", "Invalid input name", "are missing from input feed")
# Metadata and manifest keys that codecport 0.2 wrote under other names: folders it exported
# still load, read as if written today.
RENAMED = {"variant": "preset", "attention_window": "attention", "stream_frames": "step_frames"}


def current_names(meta: dict) -> dict:
    """`meta` with the keys of `RENAMED` under their current names (a current name wins)."""
    out = dict(meta)
    for old, new in RENAMED.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    return out


@dataclass
class Graph:
    """One loaded graph: its session, metadata and the provider that actually runs it. A graph
    read for its facts alone (`read_graph`) has no session: its metadata, and `io`, the static
    shapes of its inputs and outputs."""

    path: Path
    session: ort.InferenceSession | None
    meta: dict[str, str]
    io: tuple[list[tuple], list[tuple]] | None = None

    @property
    def provider(self) -> str:
        return self.session.get_providers()[0]

    def __call__(self, x: np.ndarray | dict[str, np.ndarray]) -> np.ndarray:
        """The first output on input `x`, or on the feeds `x` of a graph with several inputs."""
        feeds = x if isinstance(x, dict) else {self.session.get_inputs()[0].name: x}
        return self.run(feeds)[0]

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """All outputs, in the graph's output order."""
        try:
            return self.session.run(None, feeds)
        except Exception as e:  # noqa: BLE001 (ORT raises its own types; a feed mismatch is re-raised as ours)
            raise self._mismatch(e) or e from None

    def run_with_iobinding(self, binding) -> None:
        try:
            self.session.run_with_iobinding(binding)
        except Exception as e:  # noqa: BLE001 (as in run)
            raise self._mismatch(e) or e from None

    def _mismatch(self, e: Exception) -> ModelFileError | None:
        """ModelFileError for an ORT error that says the graph takes other inputs than it is fed."""
        first = (str(e).strip().splitlines() or [""])[0]
        if not any(m in first for m in FEED_MISMATCH):
            return None
        return ModelFileError(f"{self.path}: its inputs are not those codecport feeds "
                              f"({first.split(' : ')[-1].rstrip('.')}); the file was changed, {RERUN}")

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.session.get_outputs()]

    def text(self, key: str) -> str:
        """Metadata `key`, which must be present."""
        if key not in self.meta:
            raise ModelFileError(f"{self.path}: its metadata has no {key!r}; {RERUN}")
        return self.meta[key]

    def int(self, key: str) -> int:
        """Metadata `key` as an integer within `INT_RANGES[key]`."""
        raw = self.text(key)
        lo, hi = INT_RANGES.get(key, (0, 1 << 62))
        try:
            value = int(raw)
        except ValueError:
            raise ModelFileError(f"{self.path}: metadata {key}={raw!r} is not an integer; {RERUN}") from None
        if not lo <= value <= hi:
            raise ModelFileError(f"{self.path}: metadata {key}={value} is outside [{lo}, {hi}]; "
                                 f"the file is damaged, {RERUN}")
        return value

    def ints(self, key: str) -> list[int]:
        """Metadata `key`, a comma-separated list of integers each within `INT_RANGES[key]`."""
        raw = self.text(key)
        lo, hi = INT_RANGES.get(key, (0, 1 << 62))
        try:
            values = [int(v) for v in raw.split(",")]
        except ValueError:
            raise ModelFileError(f"{self.path}: metadata {key}={raw!r} is not a list of integers; "
                                 f"{RERUN}") from None
        if not 1 <= len(values) <= 64 or not all(lo <= v <= hi for v in values):
            raise ModelFileError(f"{self.path}: metadata {key}={raw!r} is outside [{lo}, {hi}]; "
                                 f"the file is damaged, {RERUN}")
        return values

    @property
    def batch(self) -> int:
        """Rows per call: metadata `batch` of a batched copy (`codec-export --batch`), else 1."""
        return self.int("batch") if "batch" in self.meta else 1

    def choice(self, key: str, choices: tuple[str, ...]) -> str:
        """Metadata `key`, which must be one of `choices`."""
        value = self.text(key)
        if value not in choices:
            raise ModelFileError(f"{self.path}: metadata {key}={value!r} is not one of "
                                 f"{', '.join(choices)}; {RERUN}")
        return value

    def shapes(self) -> tuple[list[tuple], list[tuple]]:
        """Static shapes of the inputs and the outputs, in graph order."""
        if self.session is None:
            return self.io
        return ([tuple(i.shape) for i in self.session.get_inputs()],
                [tuple(o.shape) for o in self.session.get_outputs()])

    @property
    def device(self) -> tuple[str, int]:
        """(device type, id) for OrtValues and IO binding: where this session's kernels leave
        their results. Only CUDA is taken off the host; other providers bind host memory."""
        if self.provider == "CUDAExecutionProvider":
            opts = self.session.get_provider_options().get(self.provider, {})
            return "cuda", int(opts.get("device_id", 0))
        return "cpu", 0


def dtype_of(arg: ort.NodeArg, path: Path) -> type:
    if arg.type not in DTYPES:
        raise ModelFileError(f"{path}: {arg.name} is a {arg.type}, which codecport does not handle; "
                             "re-export it")
    return DTYPES[arg.type]


def graph_file(folder: Path, name: str) -> Path | None:
    """`name`.onnx in `folder`, else `name`.ort; None with neither."""
    return next((p for p in (folder / f"{name}{s}" for s in SUFFIXES) if p.is_file()), None)


def graph_files(folder: Path) -> list[Path]:
    """The folder's graphs as the runtime loads them: each `.onnx`, and each `.ort` without an
    `.onnx` beside it."""
    onnx_files = sorted(folder.glob("*.onnx"))
    stems = {f.stem for f in onnx_files}
    return onnx_files + sorted(f for f in folder.glob("*.ort") if f.stem not in stems)


def read_metadata(path: Path) -> dict[str, str]:
    """Metadata of a graph file, without a session for an .onnx (see `read_graph`)."""
    return read_graph(path, io=False).meta


def read_graph(path: Path, io: bool = True) -> Graph:
    """Graph `path`'s facts without a session for execution: its metadata and (`io`) the static
    shapes of its inputs and outputs, checked as `open_graph` checks them. An .onnx file is read
    by `read_onnx`; an .ort file (a FlatBuffer, which codecport does not parse) opens a session
    on the CPU EP, closed once read."""
    _check_file(path)
    if path.suffix == ".ort":
        g = open_graph(path, "CPUExecutionProvider")
        return Graph(path, None, g.meta, g.shapes())
    meta, args = read_onnx(path, io)
    meta = current_names(meta)
    if "codec" not in meta:
        raise ModelFileError(f"{path}: has no codecport metadata; export it with codec-export")
    if not io:
        return Graph(path, None, meta)
    _check_static(path, [*args[0], *args[1]])
    return Graph(path, None, meta, ([s for _, s in args[0]], [s for _, s in args[1]]))


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file; run codec-export first")
    if path.stat().st_size == 0:
        raise ModelFileError(f"{path}: the file is empty; re-run codec-export")


def _check_static(path: Path, args: list[tuple[str, tuple | list | None]]) -> None:
    for name, shape in args:
        if shape is None or any(not isinstance(d, int) or d < 1 for d in shape):
            raise ModelFileError(f"{path}: {name} has the shape {shape}, not a static one; "
                                 "codecport's graphs have static shapes, re-run codec-export")


def open_graph(path: Path, provider: str, options: dict[str, str] | None = None,
               threads: int | None = None) -> Graph:
    """Session for `path` (.onnx, or ORT-format .ort) on `provider` (with `provider_options`
    overridden by `options`), its CPU kernels on `threads` threads (ORT's default: one per
    core); a missing or corrupt file is a `ModelFileError`."""
    _check_file(path)
    ort = onnxruntime()
    if provider == "CUDAExecutionProvider":
        load_cuda_libraries()
    opts = session_options()
    if threads:
        opts.intra_op_num_threads = threads
    if provider == "DmlExecutionProvider":
        # DirectML's documented requirements: no memory pattern, sequential execution.
        opts.enable_mem_pattern = False
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    try:
        sess = ort.InferenceSession(str(path), opts, providers=[provider],
                                    provider_options=[provider_options(provider, options)])
    except Exception as e:  # ORT raises its own untyped Fail/InvalidProtobuf errors
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelFileError(f"{path}: not a loadable model ({first}); re-run codec-export") from e
    meta = current_names(sess.get_modelmeta().custom_metadata_map)
    if "codec" not in meta:
        raise ModelFileError(f"{path}: has no codecport metadata; export it with codec-export")
    if provider not in sess.get_providers():
        # ORT silently drops a provider whose libraries fail to load.
        why = ("ONNX Runtime found no CUDA and cuDNN libraries it could load; pip install "
               "'codecport[gpu]' brings them" if provider == "CUDAExecutionProvider"
               else "check its install")
        raise ProviderError(f"{provider} failed to initialise for {path.name} (running on "
                            f"{sess.get_providers()[0]}): {why}, or pass --fallback cpu")
    _check_static(path, [(a.name, a.shape) for a in [*sess.get_inputs(), *sess.get_outputs()]])
    return Graph(path, sess, meta)
