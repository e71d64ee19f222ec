"""ONNX Runtime sessions: provider choice, and the facts each graph carries in its metadata.

A graph is `{name}.onnx`, or `{name}.ort` (ONNX Runtime's own format, for the mobile and minimal
builds) where there is no `.onnx`; both carry the same metadata (the converter keeps it).
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..errors import CodesError, ModelFileError, ProviderError
from .rvq import blas_on_one_thread, check_code_values

log = logging.getLogger(__name__)

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "dml": "DmlExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
}
# What to install for each provider (the error message says it).
INSTALL = {
    "cuda": "pip install 'codecport[gpu]' (onnxruntime-gpu; current releases need CUDA 13 and cuDNN 9)",
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
# - windows: how many windows of a long signal run at once through the graphs a folder slides
#   over it (DAC's chunked pair; their windows are independent). `auto` is 2 on the CPU EP with
#   2 or more cores, each run on half of them, and 1 elsewhere. Two runs keep both cores busy
#   through the kernels ORT runs on one thread: `Sin` (DAC's Snake) is 15 % of a DAC-44k
#   decoder's time and does not use the thread pool. Same results either way.
CODECPORT_OPTIONS = {"io_binding": "1", "windows": "auto"}
# .onnx first: an .ort beside it is a copy converted for one build or target, not the export itself.
SUFFIXES = (".onnx", ".ort")
# numpy dtypes of the tensor types our graphs' inputs and outputs may have.
DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
          "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def provider_options(provider: str, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Options for ORT provider `provider`: our defaults, then the caller's overrides, less the
    `CODECPORT_OPTIONS` keys (ORT refuses keys it does not know for some providers)."""
    merged = {**DEFAULT_OPTIONS.get(provider, {}), **(overrides or {})}
    return {k: v for k, v in merged.items() if k not in CODECPORT_OPTIONS}


def codecport_option(key: str, overrides: dict[str, str] | None = None) -> bool:
    """A 0/1 `CODECPORT_OPTIONS` value: its default unless `overrides` set it."""
    value = str((overrides or {}).get(key, CODECPORT_OPTIONS[key])).strip().lower()
    if value not in ("0", "1", "false", "true"):
        raise ProviderError(f"option {key} must be 0 or 1, got {value!r}")
    return value in ("1", "true")


def cpu_cores() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def concurrent_windows(provider: str, overrides: dict[str, str] | None = None) -> int:
    """The `windows` option (see `CODECPORT_OPTIONS`) as a number of windows run at once."""
    value = str((overrides or {}).get("windows", CODECPORT_OPTIONS["windows"])).strip().lower()
    if value == "auto":
        return 2 if provider == "CPUExecutionProvider" and cpu_cores() >= 2 else 1
    if not value.isdigit() or int(value) < 1:
        raise ProviderError(f"option windows must be auto or a whole number of at least 1, got {value!r}")
    return int(value)


def session_options() -> ort.SessionOptions:
    """Session options for every graph; DirectML needs its own (see `open_graph`)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # Worker threads spin between the kernels of a run (waking a sleeping thread for each of a
    # step graph's ~600 small kernels cost an int8 Mimi step a fifth of its time), and stop
    # spinning when the run returns: left spinning, they starve the next session (Mimi runs
    # encoder and decoder steps back to back; an encode step took 47 ms, not 32, on 2 cores).
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
    opts.add_session_config_entry("session.force_spinning_stop", "1")
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

    @property
    def device(self) -> tuple[str, int]:
        """(device type, id) for OrtValues and IO binding: where this session's kernels leave
        their results. Only CUDA is taken off the host; other providers bind host memory."""
        if self.provider == "CUDAExecutionProvider":
            opts = self.session.get_provider_options().get(self.provider, {})
            return "cuda", int(opts.get("device_id", 0))
        return "cpu", 0


def _dtype(arg: ort.NodeArg, path: Path) -> type:
    if arg.type not in DTYPES:
        raise ModelFileError(f"{path}: {arg.name} is a {arg.type}, which codecport does not handle; "
                             "re-export it")
    return DTYPES[arg.type]


class StepRunner:
    """A streaming step graph with its state carried between calls: each `<state>_out` (and
    `offset_out`) of one step is the `<state>_in` of the next; `reset()` zeroes it all, which is
    the initial state the step graphs document in their `initial_state` metadata.

    `io_binding=False` keeps the state as numpy arrays and calls `session.run`. `io_binding=True`
    keeps it as OrtValues on `graph.device`, in two sets that swap roles every step (one bound as
    the inputs, the other as the outputs: an output never overwrites the input it is computed
    from, and nothing is allocated per step); only the step's first input goes in from the host
    and its first output comes back, into a new array the caller owns. Both give the same bits.
    """

    def __init__(self, graph: Graph, io_binding: bool):
        self.graph, self.io_binding = graph, io_binding
        inputs, outputs = graph.session.get_inputs(), graph.session.get_outputs()
        self.input, self.output = inputs[0].name, outputs[0]
        self.out_dtype = _dtype(self.output, graph.path)
        self.pairs = [(o.name, o.name[:-len("_out")] + "_in") for o in outputs[1:]]
        self.states = {i.name: i for i in inputs[1:]}
        if any(not o.endswith("_out") for o, _ in self.pairs) or {i for _, i in self.pairs} != set(self.states):
            raise ModelFileError(f"{graph.path}: its state inputs and outputs are not <name>_in/<name>_out "
                                 "pairs; re-export it")
        self.reset()

    def _zeros(self, name: str) -> np.ndarray:
        arg = self.states[name]
        return np.zeros(arg.shape, _dtype(arg, self.graph.path))

    def reset(self) -> None:
        """Back to the initial state (all zeros)."""
        if not self.io_binding:
            self._state = {name: self._zeros(name) for name in self.states}
            return
        device, device_id = self.graph.device
        zeros = {n: ort.OrtValue.ortvalue_from_numpy(self._zeros(n), device, device_id) for n in self.states}
        spare = {n: ort.OrtValue.ortvalue_from_shape_and_type(a.shape, _dtype(a, self.graph.path), device,
                                                              device_id)
                 for n, a in self.states.items()}
        self._bindings = [self._bind(zeros, spare), self._bind(spare, zeros)]
        self._turn = 0

    def _bind(self, src: dict[str, ort.OrtValue], dst: dict[str, ort.OrtValue]) -> ort.IOBinding:
        """Binding that reads the state from `src` and writes the next one into `dst`."""
        binding = self.graph.session.io_binding()
        for out_name, in_name in self.pairs:
            binding.bind_ortvalue_input(in_name, src[in_name])
            binding.bind_ortvalue_output(out_name, dst[in_name])
        return binding

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The step's first output for its first input `x`; the state moves on one step."""
        if not self.io_binding:
            outs = self.graph.session.run(None, {self.input: x, **self._state})
            self._state = {in_name: v for (_, in_name), v in zip(self.pairs, outs[1:])}
            return outs[0]
        binding = self._bindings[self._turn]
        binding.bind_cpu_input(self.input, np.ascontiguousarray(x))
        # A new host array each step: the caller keeps it while the next step writes elsewhere.
        out = np.empty(self.output.shape, self.out_dtype)
        binding.bind_ortvalue_output(self.output.name, ort.OrtValue.ortvalue_from_numpy(out))
        self.graph.session.run_with_iobinding(binding)
        self._turn ^= 1
        return out


def graph_file(folder: Path, name: str) -> Path | None:
    """`name`.onnx in `folder`, else `name`.ort; None with neither."""
    return next((p for p in (folder / f"{name}{s}" for s in SUFFIXES) if p.is_file()), None)


def read_metadata(path: Path) -> dict[str, str]:
    """Metadata of a graph file (.onnx or .ort), without building a full session for execution."""
    return open_graph(path, "CPUExecutionProvider").meta


def open_graph(path: Path, provider: str, options: dict[str, str] | None = None,
               threads: int | None = None) -> Graph:
    """Session for `path` (.onnx, or ORT-format .ort) on `provider` (with `provider_options`
    overridden by `options`), its CPU kernels on `threads` threads (ORT's default: one per
    core); a missing or corrupt file is a `ModelFileError`."""
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file; run codec-export first")
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
        raise ModelFileError(f"{path}: not a loadable model ({str(e).splitlines()[0]}); "
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
    (export id, rates, quantizer...), and the role/mode its file name promises. A graph is read
    from `{name}.onnx`, or from `{name}.ort` where there is no `.onnx`.

    `options` are the provider's (see `provider_options`) plus `CODECPORT_OPTIONS`, e.g.
    `{"io_binding": "0"}` to stream through numpy state instead of IO binding.

    The graphs in `sliding` are run over long signals one window at a time; `map_windows` runs
    `windows` of those calls at once, each session on its share of the cores.
    """

    codec = ""  # metadata "codec" the folder must hold
    label = ""  # codec name for messages
    graphs: tuple[str, ...] = ()
    sliding: tuple[str, ...] = ()
    shared: tuple[str, ...] = ("codec", "export_id", "variant", "sample_rate", "weights_sha256",
                               "quantizer", "n_codebooks", "codebook_size")

    def __init__(self, model_dir: Path, provider: str = "cpu", fallback: str | None = None,
                 options: dict[str, str] | None = None):
        self.dir = Path(model_dir)
        self.options = options
        self.io_binding = codecport_option("io_binding", options)
        if not self.dir.is_dir():
            raise ModelFileError(f"{self.dir}: no such model folder; run codec-export {self.codec} "
                                 f"-o {self.dir}")
        self.files = {g: p for g in self.graphs if (p := graph_file(self.dir, g)) is not None}
        self.present = list(self.files)
        if not self.present:
            raise ModelFileError(f"{self.dir}: holds no {self.label} graphs; run codec-export "
                                 f"{self.codec} -o {self.dir}")
        self.provider = resolve_provider(provider, fallback)
        self.windows = concurrent_windows(self.provider, options)
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
        """Metadata the graph stored as `name`.onnx/.ort must carry."""
        return {"role": name.split("_")[0]}

    def missing(self, name: str) -> str:
        """What to do when `name`.onnx/.ort is absent."""
        return f"re-run codec-export {self.codec}"

    def graph(self, name: str) -> Graph:
        if name not in self._graphs:
            if name not in self.present:
                raise ModelFileError(f"{self.dir} has no {name}.onnx (or {name}.ort); "
                                     f"{self.missing(name)}")
            threads = None
            if name in self.sliding and self.windows > 1 and self.provider == "CPUExecutionProvider":
                threads = max(1, cpu_cores() // self.windows)
            g = open_graph(self.files[name], self.provider, self.options, threads)
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
                                     f"for {g.path.name}; re-export the folder")
            self._graphs[name] = g
        return self._graphs[name]

    def map_windows(self, fn: Callable, items: Iterable) -> Iterator:
        """`map(fn, items)` with up to `windows` calls running at once, lazily and in order.

        ORT lets go of the GIL while a session runs, so the calls run on their own cores; one
        more result than that waits for the caller at most, so memory stays bounded however
        long the signal. The graphs `fn` uses must be opened (`graph(name)`) before.
        """
        if self.windows == 1:
            yield from map(fn, items)
            return
        pool = ThreadPoolExecutor(self.windows, thread_name_prefix="codecport-window")
        pending: deque = deque()
        try:
            # BLAS on one thread for the whole map: the RVQ's per-call limit, taken and given
            # back from several threads at once, could leave BLAS on the wrong setting.
            with blas_on_one_thread():
                for item in items:
                    pending.append(pool.submit(fn, item))
                    if len(pending) > self.windows:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
