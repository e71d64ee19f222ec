"""Static per-EP support report for an ONNX graph: `codec-export check FILE.onnx|DIR`.

Only the CPU EP runs here, so support elsewhere is judged from the graph:
- CoreML (ML Program and NeuralNetwork) and NNAPI: ONNX Runtime's own mobile usability checker
  (its supported-op tables and partitioning), with the limits those tables leave out added as
  rules: NNAPI and CoreML NeuralNetwork take 2-D Conv only.
- DirectML: no checker exists, so a rule table of what breaks there (onnx-eps facts): no
  ConvTranspose, no `pads` on Conv, float tensors fp32/fp16 only.
- the browser (onnxruntime-web's `wasm` and `webgpu`): see export/web.py.
Every unsupported node is reported with the reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from ..errors import ModelFileError
from .web import web_verdicts

# EP -> (ORT support table, max tensor rank, 2-D Conv only)
MOBILE_EPS = {
    "coreml-mlprogram": ("coreml_supported_mlprogram_ops.md", 5, False),
    "coreml-neuralnetwork": ("coreml_supported_neuralnetwork_ops.md", 5, True),
    "nnapi": ("nnapi_supported_ops.md", 999, True),
}
_OTHER_FLOATS = {onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


@dataclass
class Verdict:
    """One EP's view of one graph."""

    ep: str
    nodes: int
    supported: int
    partitions: int
    reasons: dict[str, str] = field(default_factory=dict)  # op -> why it is not taken

    @property
    def full(self) -> bool:
        return self.partitions == 1 and self.supported == self.nodes


def _mobile(model: onnx.ModelProto, ep: str) -> Verdict:
    from onnxruntime.tools.mobile_helpers import usability_checker as uc

    table, max_rank, conv2d_only = MOBILE_EPS[ep]
    weight_rank = {i.name: len(i.dims) for i in model.graph.initializer}
    reasons: dict[str, str] = {}

    class Rules(uc._SupportedOpsChecker):  # ORT's table, plus the limits it does not encode
        def is_op_supported(self, node) -> bool:
            if not super().is_op_supported(node):
                reasons.setdefault(node.op_type, f"not in ONNX Runtime's {ep} op table")
                return False
            if conv2d_only and node.op_type == "Conv" and weight_rank.get(node.input[1]) == 3:
                reasons.setdefault("Conv", "1-D Conv: this EP takes only 2-D Conv; carry it as "
                                           "[1, C, T, 1] with a [k, 1] kernel")
                return False
            return True

    path = Path(uc.__file__).parent / table
    info = uc.check_partitioning(model.graph, Rules(path), require_fixed_input_sizes=True,
                                 max_rank=max_rank)
    if info.nodes_unsupported_due_to_dynamic_input:
        reasons["(dynamic input)"] = (f"{info.nodes_unsupported_due_to_dynamic_input} nodes take an "
                                      "input whose shape ORT's checker cannot see as fixed")
    for op in info.ops_with_unsupported_rank:
        reasons.setdefault(op, f"a tensor of rank above {max_rank}")
    return Verdict(ep, info.num_nodes, info.num_supported_nodes, info.num_partitions, reasons)


def _directml(model: onnx.ModelProto) -> Verdict:
    reasons: dict[str, str] = {}
    bad_nodes = set()
    for node in model.graph.node:
        if node.op_type == "ConvTranspose":
            reasons["ConvTranspose"] = "DirectML fails on (depthwise) ConvTranspose1d; decompose it"
            bad_nodes.add(id(node))
        if node.op_type == "Conv":
            pads = [a for a in node.attribute if a.name == "pads"]
            if pads and any(pads[0].ints):
                reasons["Conv"] = "Conv with `pads`: pad with an explicit op instead"
                bad_nodes.add(id(node))
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    others = {v.name for v in values if v.type.tensor_type.elem_type in _OTHER_FLOATS}
    others |= {i.name for i in model.graph.initializer if i.data_type in _OTHER_FLOATS}
    if others:
        reasons["(dtype)"] = f"float tensors other than fp32/fp16, e.g. {min(others)}"
        bad_nodes |= {id(n) for n in model.graph.node if others & {*n.input, *n.output}}
    n = len(model.graph.node)
    return Verdict("directml", n, n - len(bad_nodes), 1 if not bad_nodes else 0, reasons)


def check_graph(path: Path) -> dict:
    """Opset, node count and every EP's verdict for one `.onnx` file."""
    try:
        model = onnx.load(str(path), load_external_data=False)
        model = onnx.shape_inference.infer_shapes(model)
    except Exception as e:  # protobuf's DecodeError, onnx's InferenceError, OSError: no common base
        raise ModelFileError(f"{path}: not a readable ONNX model ({str(e).splitlines()[0]})") from e
    if not model.graph.node or not model.graph.output:  # (an empty file parses as an empty model)
        raise ModelFileError(f"{path}: not an ONNX model (no graph in it); pass a file codec-export wrote")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    verdicts = [_mobile(model, ep) for ep in MOBILE_EPS] + [_directml(model)] + \
        [Verdict(**v) for v in web_verdicts(model)]
    return {"file": str(path), "opset": opset, "nodes": len(model.graph.node),
            "eps": {v.ep: {**asdict(v), "full": v.full} for v in verdicts}}


def check(target: Path) -> list[dict]:
    """Reports for a file, or for every `.onnx` in a folder."""
    files = sorted(target.glob("*.onnx")) if target.is_dir() else [target]
    if not files or not all(f.is_file() for f in files):
        raise ModelFileError(f"{target}: no .onnx file here")
    return [check_graph(f) for f in files]
