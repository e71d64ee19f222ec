"""Codec-independent export machinery: torch -> ONNX, simplification, static checks, metadata.

A `GraphSpec` declares a graph's inputs and outputs once; export, validation and the written
metadata all read it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch

from ..atomic import atomic_dir, atomic_path, check_dir_writable
from ..errors import ExportError, ModelFileError
from ..runtime.folder import read_manifest
from ..version import __version__

log = logging.getLogger(__name__)

OPSET = 17
# onnxsim may fold a Pad into the Conv's `pads`, which is what we avoid (our padding is a Concat, but
# a Pad must not slip into the Conv either).
_SKIPPED_OPTIMIZERS = ["fuse_pad_into_conv"]


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name: "float32", "int64" or "int32" (codes)


@dataclass
class GraphSpec:
    """One fixed-shape graph: the torch module computing it, its I/O, and its metadata."""

    name: str  # file stem, e.g. "encoder"
    module: torch.nn.Module
    inputs: list[Tensor]
    outputs: list[Tensor]
    metadata: dict[str, str] = field(default_factory=dict)

    def random_inputs(self, seed: int, high: int = 0) -> list[np.ndarray]:
        """Inputs for a check: audio-like floats, or integer codes in `[0, high)`."""
        rng = np.random.default_rng(seed)
        out = []
        for t in self.inputs:
            if t.dtype in ("int64", "int32"):
                out.append(rng.integers(0, high, size=t.shape, dtype=t.dtype))
            else:
                out.append((rng.standard_normal(t.shape) * 0.3).astype(np.float32))
        return out


def to_onnx(spec: GraphSpec) -> onnx.ModelProto:
    """Trace `spec.module` at its static shapes and simplify the result."""
    import onnxsim

    dummy = tuple(torch.from_numpy(a) for a in spec.random_inputs(seed=0, high=1))
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        # In eval mode already: the exporter puts the wrapper back in the mode it found, with a
        # recursive train() that would otherwise leave the codec model in training mode.
        torch.onnx.export(spec.module.eval(), dummy, buf, input_names=[t.name for t in spec.inputs],
                          output_names=[t.name for t in spec.outputs], opset_version=OPSET,
                          do_constant_folding=True, dynamo=False)
    model = onnx.load_from_string(buf.getvalue())
    simplified, ok = onnxsim.simplify(model, skipped_optimizers=_SKIPPED_OPTIMIZERS)
    if not ok:
        raise ExportError(f"{spec.name}: onnxsim could not verify the simplified graph")
    _constants_to_initializers(simplified)
    del simplified.metadata_props[:]
    for k, v in {**spec.metadata, "codecport_version": __version__}.items():
        simplified.metadata_props.add(key=k, value=str(v))
    return simplified


def _constants_to_initializers(model: onnx.ModelProto) -> None:
    """Move Constant nodes into initializers: the same values, but CoreML's ML Program (and
    ORT's partitioner for it) takes no Constant node, so each one would cut the graph."""
    keep = []
    for node in model.graph.node:
        if node.op_type != "Constant" or len(node.attribute) != 1:
            keep.append(node)
            continue
        attr = node.attribute[0]
        value = onnx.helper.get_attribute_value(attr)
        if attr.name == "value":
            tensor = value
        elif attr.name in ("value_float", "value_floats", "value_int", "value_ints"):
            dtype = np.float32 if "float" in attr.name else np.int64
            tensor = onnx.numpy_helper.from_array(np.array(value, dtype=dtype))
        else:  # sparse or string constants: leave them as they are
            keep.append(node)
            continue
        tensor.name = node.output[0]
        model.graph.initializer.append(tensor)
    del model.graph.node[:]
    model.graph.node.extend(keep)


def static_check(model: onnx.ModelProto, spec: GraphSpec, serialized: bytes | None = None) -> None:
    """Raise `ExportError` unless the graph is portable: checked, static, plain convs.
    `serialized`: the model's bytes, where the caller has them (the checker and the shape
    inference would each serialize it again)."""
    data = serialized if serialized is not None else model
    try:
        onnx.checker.check_model(data, full_check=True)
    except onnx.checker.ValidationError as e:
        raise ExportError(f"{spec.name}: onnx.checker rejects the graph: {e}") from e
    for node in model.graph.node:
        if node.op_type == "ConvTranspose":
            raise ExportError(f"{spec.name}: node {node.name} is a ConvTranspose; it must be "
                              "decomposed (polyphase) before export")
        if node.op_type == "Conv":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            if any(attrs.get("pads", [])) or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID"):
                raise ExportError(f"{spec.name}: Conv {node.name} pads its input itself "
                                  f"({attrs.get('pads')}); padding must be an explicit op")
    inferred = onnx.shape_inference.infer_shapes(data, strict_mode=True)
    for vi in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]:
        dims = vi.type.tensor_type.shape.dim
        if not vi.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
            raise ExportError(f"{spec.name}: tensor {vi.name} has a dynamic shape; "
                              "every shape must be static")
    declared = {t.name: t.shape for t in [*spec.inputs, *spec.outputs]}
    for vi in [*inferred.graph.input, *inferred.graph.output]:
        shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        if declared.get(vi.name) != shape:
            raise ExportError(f"{spec.name}: {vi.name} has shape {shape}, declared "
                              f"{declared.get(vi.name)}")


def export_validated(specs: list[GraphSpec], models: dict[str, onnx.ModelProto], validation: dict,
                     validate) -> None:
    """Trace, check and validate each spec into `models` (by name); `validate(spec, serialized)`
    (the model's bytes, which validate.session takes) raises past its bounds and returns the
    errors it measured, kept in `validation`."""
    for spec in specs:
        t0 = time.perf_counter()
        model = to_onnx(spec)
        serialized = model.SerializeToString()  # once for the checker, shape inference and sessions
        static_check(model, spec, serialized)
        validation[spec.name] = validate(spec, serialized)
        models[spec.name] = model
        log.info("%s: exported, checked and validated in %.1f s", spec.name, time.perf_counter() - t0)


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy: the rewrites and ORT's tools must not touch the validated graph they start from."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def save_atomic(model: onnx.ModelProto, path: Path) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written model."""
    with atomic_path(path) as tmp:
        onnx.save(model, str(tmp))


def export_id(*facts) -> str:
    """Id shared by the graphs of one export, so the runtime can refuse a folder mixing exports."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_graphs(out_dir: Path, models: dict[str, onnx.ModelProto], rvq: dict[str, np.ndarray] | None,
                 export_id: str) -> dict[str, str]:
    """The graphs and the RVQ arrays (when the quantizer is outside the graphs) into `out_dir`;
    returns name -> file written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, model in models.items():
        save_atomic(model, out_dir / f"{name}.onnx")
        files[name] = f"{name}.onnx"
    if rvq is not None:
        with atomic_path(out_dir / "rvq.npz") as tmp, open(tmp, "wb") as f:
            np.savez(f, **rvq, export_id=np.array(export_id))
        files["rvq"] = "rvq.npz"
    return files


def write_manifest(out_dir: Path, manifest: dict, files: dict[str, str]) -> dict[str, str]:
    """manifest.json, listing `files` and itself; returns the files."""
    files = {**files, "manifest": "manifest.json"}
    with atomic_path(out_dir / "manifest.json") as tmp:
        tmp.write_text(json.dumps(_strict_json({**manifest, "files": files}), indent=2, allow_nan=False))
    return files


def _strict_json(value):
    """`value` with non-finite floats as null: JSON has no Infinity, and browsers refuse it (an
    identical build's SNR is infinite)."""
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_export(out_dir: Path, models: dict[str, onnx.ModelProto], rvq: dict[str, np.ndarray] | None,
                 manifest: dict) -> dict[str, str]:
    """A whole export folder's files (graphs, RVQ arrays, manifest.json last)."""
    files = write_graphs(out_dir, models, rvq, manifest.get("export_id", ""))
    return write_manifest(out_dir, manifest, files)


def check_out_dir(out_dir: str | Path) -> Path:
    """`ExportError` unless `out_dir` is absent, empty, or an earlier codecport export and only
    that: its manifest names a codec and an export id and lists the folder's every entry. A
    folder that holds anything else may be the user's (a web app has a manifest.json too), and
    is refused with nothing touched; one that cannot be written there is an `OutputError`
    (`atomic.check_dir_writable`). Returns the folder to write: where a link given points."""
    out_dir = Path(out_dir)
    here = Path.cwd().resolve()
    if out_dir.is_symlink():  # the user's link stays; the export goes where it points
        out_dir = out_dir.resolve()
    if out_dir.resolve() in (here, *here.parents):
        # Replaced whole on success, it would leave the shell in a folder that no longer exists.
        raise ExportError(f"{out_dir} is the current folder or one above it; pass a new folder to -o")
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir} is a file; pass a folder to -o")
    check_dir_writable(out_dir)
    if not out_dir.exists():
        return out_dir
    entries = sorted(p.name for p in out_dir.iterdir())
    if not entries:
        return out_dir
    refuse = f"{out_dir} holds files that are not a codecport export; pass another -o, or empty it first"
    try:
        manifest = read_manifest(out_dir)  # None, or a dict that names a codec
    except ModelFileError:
        raise ExportError(refuse) from None
    files = manifest.get("files") if manifest else None
    if not (manifest and isinstance(manifest.get("export_id"), str) and isinstance(files, dict)
            and all(isinstance(f, str) for f in files.values())):
        raise ExportError(refuse)
    foreign = [e for e in entries if e not in {*files.values(), "manifest.json"}]
    if foreign:
        raise ExportError(f"{out_dir} holds {foreign[0]}, which is not part of the codecport export there "
                          "(its manifest.json lists its files); move it out, or pass another -o")
    return out_dir


@contextmanager
def export_folder(out_dir: str | Path) -> Iterator[Path]:
    """Yield a staging folder to build an export in; on success it replaces `out_dir` whole
    (nothing of a previous export is left behind), on failure `out_dir` stays as it was. An
    existing `out_dir` must be empty or an earlier export and only that (`check_out_dir`):
    anything else might be the user's and is refused."""
    out_dir = check_out_dir(out_dir)  # (a link's target: replacing the link would drop the user's link)
    with atomic_dir(out_dir) as scratch:
        stage = scratch / out_dir.name
        stage.mkdir()
        yield stage


def factorised_rvq_arrays(quantizers) -> dict[str, np.ndarray]:
    """The arrays of DAC-style quantizer levels (1x1 `in_proj`/`out_proj` convs and a
    `codebook` embedding each) as the numpy RVQ reads them (runtime/rvq.py `FactorisedRvq`)."""
    stack = lambda f: np.stack([f(q).detach().numpy() for q in quantizers]).astype(np.float32)
    return {
        "in_proj_weight": stack(lambda q: q.in_proj.weight[..., 0]),
        "in_proj_bias": stack(lambda q: q.in_proj.bias),
        "out_proj_weight": stack(lambda q: q.out_proj.weight[..., 0]),
        "out_proj_bias": stack(lambda q: q.out_proj.bias),
        "codebook": stack(lambda q: q.codebook.weight),
    }
