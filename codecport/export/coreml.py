"""GraphSpec -> CoreML `.mlpackage` (ML Program), converted by coremltools from the torch module.

The ONNX graphs reach Apple hardware through ONNX Runtime's CoreML provider; this is the other
route, a native package for apps that load CoreML directly. It is converted from the same torch
reference modules as the ONNX graphs, at the same static shapes, with the same I/O names and
metadata, so one `GraphSpec` describes both.

Design choices:
- Frontend: `torch.export` (an ExportedProgram), not TorchScript. coremltools' TorchScript
  frontend fails on these graphs: it folds shape arithmetic into 1-element arrays that NumPy >= 2.4
  no longer turns into Python ints (every DAC graph with a polyphase upsampler), and it turns
  Mimi's `x / math.sqrt(d)` on a traced size into an int32 `inverse`. torch.export records
  static shapes as plain ints, and every graph of both codecs converts.
- Integers: CoreML has no int64 inputs or outputs; the spec's int64 tensors (Mimi's step
  `offset`, codes with an in-graph quantizer) are declared int32, which the package reports.
- Precision: `fp32` or `fp16` compute precision; the inputs and outputs stay float32 either way,
  so callers feed the same arrays as to the ONNX graphs. In fp16, the few ops computing from the
  integer step offset alone (positions, RoPE angles, attention mask) stay fp32.
- Verification on Linux stops at the spec: coremltools converts anywhere, but prediction needs
  the CoreML framework (macOS). `inspect_mlpackage` reads the saved package's I/O, ops, weight
  precision and metadata, and says plainly that nothing was run.
- Writes are atomic: a `.mlpackage` is a directory, so it is saved into a temporary directory
  beside the target and renamed into place; a failed conversion leaves the old one untouched.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_dir
from ..errors import ExportError, ModelFileError
from ..version import __version__
from .graph import GraphSpec

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16")
# iOS 16 / macOS 13 (ML Program opset CoreML6, spec version 7): every graph of both codecs
# converts to it, so no newer target (and no newer OS) is required.
DEPLOYMENT_TARGET = "iOS16"
NOT_RUN = "prediction needs macOS; only the spec was inspected"
_CONVERTER_KEY = "com.github.apple.coremltools."  # metadata coremltools writes itself
_INSTALL = "pip install 'codecport[coreml]'"
_HEAVY_OPS = ("conv", "linear", "matmul")  # where a model's time and weights go


class _DropExpected(logging.Filter):
    """Drops coremltools warnings that say nothing here, so they do not bury real ones."""

    def __init__(self, *prefixes: str):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


def _coremltools():
    ct_logger = logging.getLogger("coremltools")
    # At import, once per class, that its native runtime is missing: expected off macOS, where
    # we only convert and inspect.
    noise = _DropExpected("Failed to load")
    ct_logger.addFilter(noise)
    try:
        import coremltools as ct
    except ImportError as e:
        raise ExportError(f"coremltools is not installed ({e}); {_INSTALL}") from e
    finally:
        ct_logger.removeFilter(noise)
    return ct


@contextlib.contextmanager
def _converter_quiet() -> Iterator[None]:
    """coremltools logs every op it converts and every const it folds at INFO (thousands of lines
    per graph); keep its logger at WARNING while it converts, so a verbose CLI stays readable."""
    ct_logger = logging.getLogger("coremltools")
    level = ct_logger.level
    # Also, once per folded int64 constant, that it is stored as int32: the ints in these graphs
    # are shapes, positions and codes, all far below 2**31.
    noise = _DropExpected("Saving value type of int64 into a builtin type of int32")
    ct_logger.setLevel(max(level, logging.WARNING))
    ct_logger.addFilter(noise)
    # Its pass-by-pass tqdm bars go to sys.stderr, which is swapped for a buffer; log handlers
    # keep the stream they were made with, so warnings still show.
    bars = io.StringIO()
    try:
        with contextlib.redirect_stderr(bars):
            yield
    finally:
        ct_logger.removeFilter(noise)
        ct_logger.setLevel(level)


@contextlib.contextmanager
def _model_restored(module: torch.nn.Module) -> Iterator[None]:
    """Hand the model back as it came: the graph wrappers switch modes inside forward (DAC's
    padding for the chunked graphs) and conversion needs eval mode, so every submodule's plain
    attributes are put back afterwards, whatever the codec."""
    plain = (bool, int, float, str, type(None))
    saved = [(m, k, v) for m in module.modules() for k, v in vars(m).items() if isinstance(v, plain)]
    # torch.export puts the wrapper back in the mode it found it in with a recursive train(),
    # which would leave the (eval) codec model in training mode: restore each module's own.
    modes = [(m, m.training) for m in module.modules()]
    try:
        yield
    finally:
        for m, k, v in saved:
            setattr(m, k, v)
        for m, mode in modes:
            m.training = mode


def _dtype(name: str) -> type:
    # CoreML I/O has no int64: declare int32 (codes < 2**31, offsets far below it).
    return {"float32": np.float32, "int64": np.int32}[name]


class _PositionsInFp32:
    """`op_selector` for fp16 compute: fp16 for every op except those computing from integer
    inputs (as numbers, not as indices into a table) and constants alone.

    In Mimi's step graphs those ops turn `offset_in` into positions, RoPE angles and the
    attention mask. fp16 skips whole numbers above 2048 (so the mask goes wrong) and rounds an
    angle of 500 rad by up to 0.125 rad, so the streaming graph would drift from the fixed one
    (whose angles and mask coremltools folds in fp32). They are a few small tensors; their results
    (sin/cos in [-1, 1], a mask bias of -3e4) enter the fp16 ops exactly enough. A codebook
    lookup from input codes (in-graph quantizer) is a table row, not arithmetic on the ints: what
    follows it runs in fp16, else the whole decoder would stay fp32.
    """

    LOOKUPS = ("gather", "gather_along_axis", "gather_nd")

    def __init__(self):
        self.keep: set[str] | None = None

    def __call__(self, op) -> bool:
        if self.keep is None:  # first call, before any op is cast: the function as converted
            self.keep = self._integer_derived(op.enclosing_block)
        return op.name not in self.keep

    @staticmethod
    def _integer_derived(block) -> set[str]:
        from coremltools.converters.mil.mil import types

        inputs = block.inputs.values() if isinstance(block.inputs, dict) else block.inputs
        derived = {id(v) for v in inputs if types.is_int(v.dtype)}
        keep = set()
        for op in block.operations:  # topological order
            args = [v for x in op.inputs.values() for v in (x if isinstance(x, (list, tuple)) else (x,))]
            if op.op_type == "const" or (op.op_type not in _PositionsInFp32.LOOKUPS
                                         and all(id(v) in derived for v in args)):
                derived.update(id(v) for v in op.outputs)
                keep.add(op.name)
        return keep


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def to_mlpackage(spec: GraphSpec, path: Path, precision: str = "fp32") -> dict:
    """Convert `spec.module` at its static shapes to an ML Program `.mlpackage` at `path`.

    Inputs and outputs keep the spec's names, shapes and float32 (int64 becomes int32: CoreML
    has no int64). The model is handed back as it came. Returns `inspect_mlpackage(path)`.
    Raises `ExportError` when coremltools is missing or the conversion fails; nothing is
    written then.
    """
    path = Path(path)
    if precision not in PRECISIONS:
        raise ExportError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if path.suffix != ".mlpackage":
        raise ExportError(f"{path}: a CoreML ML Program is a directory ending in .mlpackage")
    ct = _coremltools()
    t0 = time.perf_counter()
    with atomic_dir(path) as scratch:
        # Converted straight into the scratch folder: by default coremltools keeps a copy of every
        # package it converts in /tmp until the process exits.
        mlmodel = _convert(ct, spec, precision, scratch / "converted.mlpackage")
        _check_io(spec, mlmodel.get_spec())
        mlmodel.short_description = f"codecport {spec.name} ({precision})"
        for k, v in {**spec.metadata, "codecport_version": __version__, "precision": precision}.items():
            mlmodel.user_defined_metadata[k] = str(v)
        mlmodel.save(str(scratch / path.name))
    log.info("%s: converted to %s (%s) in %.1f s", spec.name, path, precision, time.perf_counter() - t0)
    return inspect_mlpackage(path)


def _convert(ct, spec: GraphSpec, precision: str, package_dir: Path):
    args = tuple(torch.from_numpy(a) for a in spec.random_inputs(seed=0, high=1))
    with _model_restored(spec.module), _converter_quiet(), warnings.catch_warnings():
        # torch.export and coremltools deprecation notices about each other's internals
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            with torch.no_grad():
                program = torch.export.export(spec.module.eval(), args)
            # Inference IR with an empty table: functional, but linear/layer_norm/gelu stay whole,
            # which coremltools maps to single ML Program ops.
            program = program.run_decompositions({})
        except Exception as e:
            raise ExportError(f"{spec.name}: torch.export could not capture the module "
                              f"({_one_line(e)})") from e
        try:
            return ct.convert(
                program, convert_to="mlprogram", package_dir=str(package_dir),
                inputs=[ct.TensorType(name=t.name, shape=t.shape, dtype=_dtype(t.dtype))
                        for t in spec.inputs],
                outputs=[ct.TensorType(name=t.name, dtype=_dtype(t.dtype)) for t in spec.outputs],
                compute_precision=ct.precision.FLOAT32 if precision == "fp32"
                else ct.transform.FP16ComputePrecision(op_selector=_PositionsInFp32()),
                minimum_deployment_target=getattr(ct.target, DEPLOYMENT_TARGET))
        except Exception as e:
            raise ExportError(f"{spec.name}: coremltools {ct.__version__} could not convert the "
                              f"graph ({_one_line(e)}); try a newer coremltools") from e


def _check_io(spec: GraphSpec, mlspec) -> None:
    """The package must take and give what the GraphSpec (and so the ONNX graph) declares."""
    for kind, declared, got in (("inputs", spec.inputs, mlspec.description.input),
                                ("outputs", spec.outputs, mlspec.description.output)):
        want = [(t.name, list(t.shape)) for t in declared]
        have = [(f.name, list(f.type.multiArrayType.shape)) for f in got]
        if want != have:
            raise ExportError(f"{spec.name}: the CoreML {kind} are {have}, declared {want}")


def _walk(block) -> Iterator:
    for op in block.operations:
        yield op
        for inner in op.blocks:  # control flow (cond/while) nests blocks
            yield from _walk(inner)


def inspect_mlpackage(path: Path) -> dict:
    """What the package declares, read from its spec without running it.

    Keys: `inputs`/`outputs` ({name: {"shape", "dtype"}}), `ops` (ML Program op type -> count,
    consts excluded), `op_dtypes` (dtype of the ops' first outputs -> count), `weights` (dtype of
    the non-scalar float constants -> count), `precision` ("fp32", "fp16" or "mixed": the dtype
    of the conv/linear/matmul ops), `spec_version`, `opset`, `metadata` (user-defined),
    `converter` (what coremltools recorded), `predicted` (always False) and `not_run`.
    """
    path = Path(path)
    if not (path / "Manifest.json").is_file():
        raise ModelFileError(f"{path}: not a CoreML .mlpackage (no Manifest.json)")
    ct = _coremltools()
    from coremltools.proto import FeatureTypes_pb2, MIL_pb2

    try:
        spec = ct.utils.load_spec(str(path))
    except Exception as e:
        raise ModelFileError(f"{path}: unreadable CoreML package ({_one_line(e)})") from e
    if spec.WhichOneof("Type") != "mlProgram":
        raise ModelFileError(f"{path}: a {spec.WhichOneof('Type')} model, not an ML Program")
    array_dtype = FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name
    mil_dtype = MIL_pb2.DataType.Name

    def features(fs) -> dict:
        return {f.name: {"shape": list(f.type.multiArrayType.shape),
                         "dtype": array_dtype(f.type.multiArrayType.dataType).lower()} for f in fs}

    main = spec.mlProgram.functions["main"]
    ops, op_dtypes, weights, compute = Counter(), Counter(), Counter(), Counter()
    for op in _walk(main.block_specializations[main.opset]):
        out = op.outputs[0].type.tensorType if op.outputs else None
        dtype = mil_dtype(out.dataType).lower() if out is not None else "none"
        if op.type == "const":
            if out is not None and out.rank > 0 and dtype.startswith("float"):
                weights[dtype] += 1
            continue
        ops[op.type] += 1
        op_dtypes[dtype] += 1
        if op.type in _HEAVY_OPS:
            compute[dtype] += 1
    # The precision the bulk of the work runs in; small position arithmetic may stay fp32.
    precision = {frozenset({"float32"}): "fp32", frozenset({"float16"}): "fp16"}.get(
        frozenset(compute), "mixed" if compute else "unknown")
    user = dict(spec.description.metadata.userDefined)
    return {
        "path": str(path),
        "inputs": features(spec.description.input),
        "outputs": features(spec.description.output),
        "ops": dict(sorted(ops.items())),
        "op_dtypes": dict(op_dtypes),
        "weights": dict(weights),
        "precision": precision,
        "spec_version": spec.specificationVersion,
        "opset": main.opset,
        "metadata": {k: v for k, v in user.items() if not k.startswith(_CONVERTER_KEY)},
        "converter": {k[len(_CONVERTER_KEY):]: v for k, v in user.items() if k.startswith(_CONVERTER_KEY)},
        "predicted": False,
        "not_run": NOT_RUN if sys.platform != "darwin" else "prediction not attempted; only the spec "
                                                            "was inspected",
    }
