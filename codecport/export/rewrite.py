"""ONNX-level rewrites that shape a validated graph for one execution provider.

They work on the exported ONNX graph, never on a second torch trace, so a build is the graph
that was validated plus local substitutions whose effect `builds.py` measures.

- `conv_to_2d`: NNAPI and CoreML's NeuralNetwork take only 2-D Conv ("Only 2D Conv is
  supported"), so each 1-D conv is carried as `[N, C, T, 1]` with a `[k, 1]` kernel. The
  reshapes around it are Reshape nodes with constant shapes (both EPs take Reshape; CoreML
  NeuralNetwork has no Unsqueeze).
- `nnapi_ops`: NNAPI has no LayerNormalization, Erf, Cos, Tile or ReduceSum. Each becomes ops it
  has: LayerNormalization as its definition (ReduceMean/Sub/Mul/Sqrt/Div), ReduceSum as
  ReduceMean times the count, Cos(x) as
  1 - 2 sin^2(x/2) (exact in exact arithmetic; unlike sin(x + pi/2) it loses nothing for the
  large RoPE angles of late positions), Tile of constant repeats as a Concat of copies, and Erf
  as Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7, the size of fp32 rounding).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import ExportError
from .graph import copy_model


class _Builder:
    """Appends nodes and constants to a graph under unique names."""

    def __init__(self, model: onnx.ModelProto, prefix: str):
        self.g, self.prefix, self.n = model.graph, prefix, 0
        self.nodes: list[onnx.NodeProto] = []

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{self.prefix}/{hint}_{self.n}"

    def const(self, value, dtype=np.float32) -> str:
        name = self.name("const")
        self.g.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str | None = None, **attrs) -> str:
        out = output or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(op_type), **attrs))
        return out


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    inferred = onnx.shape_inference.infer_shapes(model)
    return {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]}


def _replace_nodes(model: onnx.ModelProto, rewrite, prefix: str) -> onnx.ModelProto:
    """Rebuild the node list, `rewrite(node, builder)` returning True when it replaced `node`
    (having emitted the replacement, which must write the node's outputs, into the builder)."""
    model = copy_model(model)
    g = model.graph
    b = _Builder(model, prefix)
    for node in list(g.node):
        if not rewrite(node, b):
            b.nodes.append(node)
    del g.node[:]
    g.node.extend(b.nodes)
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    kept = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(kept)
    return model


def conv_to_2d(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every 1-D Conv as Reshape -> 2-D Conv (`[k, 1]` kernel, zero pads) -> Reshape."""
    shapes = _shapes(model)
    inits = {i.name: i for i in model.graph.initializer}
    weights_2d: dict[str, str] = {}

    def rewrite(node: onnx.NodeProto, b: _Builder) -> bool:
        w = inits.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        if w is None or len(w.dims) != 3:
            return False
        if w.name not in weights_2d:
            weights_2d[w.name] = b.const(numpy_helper.to_array(w)[..., None], numpy_helper.to_array(w).dtype)
        x_shape, y_shape = shapes.get(node.input[0]), shapes.get(node.output[0])
        if not x_shape or not y_shape or 0 in x_shape or 0 in y_shape:
            raise ExportError(f"{node.name}: conv shapes unknown; the graph must have static shapes")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        x4 = b.op("Reshape", [node.input[0], b.const([*x_shape, 1], np.int64)])
        y4 = b.op("Conv", [x4, weights_2d[w.name], *node.input[2:]],
                  kernel_shape=[w.dims[2], 1], strides=[attrs.get("strides", [1])[0], 1],
                  dilations=[attrs.get("dilations", [1])[0], 1], pads=[0, 0, 0, 0],
                  group=attrs.get("group", 1))
        b.op("Reshape", [y4, b.const(y_shape, np.int64)], node.output[0])
        return True

    return _replace_nodes(model, rewrite, "codecport_2d")


# Abramowitz & Stegun 7.1.26
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def nnapi_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """LayerNormalization, Erf, Cos, Tile and ReduceSum spelled with ops NNAPI has (module docstring)."""
    shapes = _shapes(model)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}

    def rewrite(node: onnx.NodeProto, b: _Builder) -> bool:
        x, out = node.input[0] if node.input else "", node.output[0] if node.output else ""
        if node.op_type == "LayerNormalization" and not any(node.output[1:]):
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            rank = len(shapes[x])
            axes = list(range(attrs.get("axis", -1) % rank, rank))
            mean = b.op("ReduceMean", [x], axes=axes, keepdims=1)
            d = b.op("Sub", [x, mean])
            var = b.op("ReduceMean", [b.op("Mul", [d, d])], axes=axes, keepdims=1)
            std = b.op("Sqrt", [b.op("Add", [var, b.const(attrs.get("epsilon", 1e-5))])])
            has_bias = len(node.input) > 2 and bool(node.input[2])
            y = b.op("Mul", [b.op("Div", [d, std]), node.input[1]], None if has_bias else out)
            if has_bias:
                b.op("Add", [y, node.input[2]], out)
            return True
        if node.op_type == "Erf":
            # sign(x) without Sign (NNAPI has none): a huge gain clipped to [-1, 1]. Where |x| is
            # too small for that to reach 1, erf(x) is ~0 anyway. |x| = x * sign(x) (CoreML's ML
            # Program has no Abs).
            sign = b.op("Clip", [b.op("Mul", [x, b.const(1e30)]), b.const(-1.0), b.const(1.0)])
            ax = b.op("Mul", [x, sign])
            t = b.op("Div", [b.const(1.0), b.op("Add", [b.op("Mul", [ax, b.const(_ERF_P)]), b.const(1.0)])])
            poly = b.const(_ERF_A[-1])
            for a in reversed(_ERF_A[:-1]):  # Horner: t*(a1 + t*(a2 + ...))
                poly = b.op("Add", [b.op("Mul", [poly, t]), b.const(a)])
            poly = b.op("Mul", [poly, t])
            gauss = b.op("Exp", [b.op("Mul", [b.op("Mul", [ax, ax]), b.const(-1.0)])])
            b.op("Mul", [sign, b.op("Sub", [b.const(1.0), b.op("Mul", [poly, gauss])])], out)
            return True
        if node.op_type == "Cos":
            s = b.op("Sin", [b.op("Mul", [x, b.const(0.5)])])
            b.op("Sub", [b.const(1.0), b.op("Mul", [b.op("Mul", [s, s]), b.const(2.0)])], out)
            return True
        given = node.input[1] if len(node.input) > 1 else ""
        if node.op_type == "ReduceSum" and (not given or given in inits) and all(shapes.get(x, [0])):
            # The mean times the count (static shapes): NeuCodec's masked statistics sum over a
            # clip's frames, and NNAPI has ReduceMean only. No axes: all of them.
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            rank = len(shapes[x])
            axes = [int(a) % rank for a in np.atleast_1d(inits[given])] if given else list(range(rank))
            if not axes or (not given and attrs.get("noop_with_empty_axes", 0)):
                return False
            mean = b.op("ReduceMean", [x], axes=axes, keepdims=attrs.get("keepdims", 1))
            b.op("Mul", [mean, b.const(float(np.prod([shapes[x][a] for a in axes])))], out)
            return True
        if node.op_type == "Tile" and node.input[1] in inits:
            grow = [(axis, int(r)) for axis, r in enumerate(inits[node.input[1]]) if r > 1]
            y = x
            for i, (axis, r) in enumerate(grow):
                y = b.op("Concat", [y] * r, out if i == len(grow) - 1 else None, axis=axis)
            if not grow:
                b.op("Identity", [x], out)
            return True
        return False

    return _replace_nodes(model, rewrite, "codecport_nnapi")
