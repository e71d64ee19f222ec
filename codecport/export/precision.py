"""fp16 and int8 versions of a validated fp32 ONNX graph (onnxruntime's own tools).

- fp16: ONNX Runtime's converter, inputs and outputs kept fp32; every node whose fp32 output was
  measured past fp16's range on real feeds is kept fp32.
- int8: onnxruntime.quantization static QDQ (per-channel int8 weights, uint8 activations),
  calibrated on recorded feeds.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from ..errors import ExportError
from .graph import copy_model

log = logging.getLogger(__name__)

FP16_MAX = 65504.0


@contextlib.contextmanager
def quiet(what: str) -> Iterator[None]:
    """ORT's quantizer and converter print and log to the root logger at INFO/WARNING (advice
    meant for image models); keep that out of the user's terminal, but in our debug log."""
    out = io.StringIO()
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(out):
            yield
    finally:
        logging.disable(previous)
        if out.getvalue():
            log.debug("%s said:\n%s", what, out.getvalue())


def overflowing_nodes(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[str]:
    """Nodes whose fp32 output exceeds fp16's range on `feeds` (measured, every intermediate).

    Each float intermediate gets an Abs -> ReduceMax output, so the probe returns one number per
    tensor instead of keeping every activation of a long window in memory at once.
    """
    import onnxruntime as ort

    probe = copy_model(model)
    g = probe.graph
    floats = {vi.name for vi in onnx.shape_inference.infer_shapes(model).graph.value_info
              if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    floats |= {o.name for o in g.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    producer, peaks, nodes = {}, [], []
    for node in g.node:
        nodes.append(node)
        for out in node.output:
            if out in floats:
                producer[f"{out}__absmax"] = node.name
                nodes.append(helper.make_node("Abs", [out], [f"{out}__abs"]))
                nodes.append(helper.make_node("ReduceMax", [f"{out}__abs"], [f"{out}__absmax"], keepdims=0))
                peaks.append(helper.make_tensor_value_info(f"{out}__absmax", onnx.TensorProto.FLOAT, []))
    del g.node[:]
    g.node.extend(nodes)
    del g.output[:]
    g.output.extend(peaks)
    # ORT's default order ran the reductions last, keeping every activation alive until then
    # (DAC-44k decoder, 5 s: 12.4 GB); priority order runs each right after its producer (1.9 GB).
    opts = ort.SessionOptions()
    opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    peak: dict[str, float] = {}
    for feed in feeds:
        for name, value in zip(names, sess.run(None, feed)):
            peak[name] = max(peak.get(name, 0.0), float(value))
    hot = sorted({producer[n] for n, v in peak.items() if not v < FP16_MAX})
    if hot:
        log.info("fp16: %d node(s) overflow fp16 on the probe clips and stay fp32: %s", len(hot),
                 ", ".join(hot[:8]))
    return hot


def to_fp16(model: onnx.ModelProto, keep_fp32: list[str]) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    m = convert_float_to_float16(copy_model(model), keep_io_types=True, node_block_list=keep_fp32)
    _toposort(m)  # the converter appends its input/output Casts at the end of the node list
    return m


def _toposort(model: onnx.ModelProto) -> None:
    g = model.graph
    ready = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    pending, ordered = list(g.node), []
    while pending:
        rest = [n for n in pending if not all(i in ready for i in n.input)]
        done = [n for n in pending if all(i in ready for i in n.input)]
        if not done:
            raise ExportError("fp16 conversion left a graph with a cycle or a dangling input")
        for n in done:
            ready.update(n.output)
        ordered += done
        pending = rest
    del g.node[:]
    g.node.extend(ordered)


def in_graph_quantizer_nodes(model: onnx.ModelProto) -> list[str]:
    """The Conv/MatMul nodes of an encoder's in-graph quantizer (its projections and codebook
    distances), which int8 leaves in fp32: an 8-bit distance picks another code wherever two
    are close (tiny Mimi web encoder: 52 % of the codes equal with them quantized). They are the
    nodes after the encoder's last conv of kernel > 1, in a graph that ends in ArgMin/ArgMax;
    none elsewhere (a decoder's codebook lookup is a Gather)."""
    nodes = list(model.graph.node)
    if not any(n.op_type in ("ArgMin", "ArgMax") for n in nodes):
        return []
    kernel = lambda n: next((a.ints[0] for a in n.attribute if a.name == "kernel_shape"), 1)
    last = max((i for i, n in enumerate(nodes) if n.op_type == "Conv" and kernel(n) > 1), default=-1)
    return [n.name for n in nodes[last + 1:] if n.op_type in ("Conv", "MatMul")]


def to_int8(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """Static QDQ: per-channel int8 weights of 7 bits, uint8 activations calibrated (min/max) on
    `feeds`.

    Seven bits (`reduce_range`): ONNX Runtime's x86 kernels without VNNI (AVX2 and older) sum
    uint8 x int8 products in 16-bit pairs, which saturate on full-range weights, so an 8-bit
    build's measured deviation did not hold on those CPUs. With seven bits no sum saturates
    anywhere; it costs a few dB of decoder SNR where 8 bits would not have saturated
    (measured: docs/targets.md#int8-weights-of-7-bits).

    Only Conv and MatMuls with a constant weight are quantized: an activation x activation
    MatMul (attention scores) would quantize both sides to 8 bits for little speed. Convs on
    the audio side (one or two channels in or out) stay fp32: they are small and set the output's
    noise floor. (Keeping an encoder's last conv fp32 as well, the one whose output the RVQ
    rounds, changed DAC-44k's code agreement by 0.2 points, so it is quantized like the rest.)
    """
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    inits = {i.name: i for i in model.graph.initializer}
    exclude = [n.name for n in model.graph.node
               if n.op_type == "MatMul" and not any(i in inits for i in n.input)]
    exclude += [n.name for n in model.graph.node
                if n.op_type == "Conv" and min(inits[n.input[1]].dims[:2]) <= 2]
    exclude += in_graph_quantizer_nodes(model)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as tmp, quiet("onnxruntime.quantization"):
        out = Path(tmp) / "int8.onnx"
        quantize_static(copy_model(model), out, Reader(), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=["Conv", "MatMul"], nodes_to_exclude=exclude,
                        per_channel=True, reduce_range=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8,
                        extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
        return onnx.load(str(out))
