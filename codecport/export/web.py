"""The browser target: what `codec-export ... --target web` adds, and the web verdicts of
`codec-export check`.

The browser cannot read `.npz` or ONNX metadata (onnxruntime-web exposes neither), so a web
folder carries the quantizer inside its graphs (the encoders output codes, the decoders take
them) and a `manifest.json` whose `graphs` entry repeats, per graph, what the Python runtime
reads from the file: its metadata and the names, types and shapes of its inputs and outputs.
`codecport.mjs` reads only that and the `.onnx` files.

Verdicts, judged from the graph (the browser tests run the real thing):
- `wasm`: onnxruntime-web's CPU provider is ONNX Runtime's CPU EP compiled to WebAssembly, so
  it takes every op; what stops it is the size of a 32-bit address space (`WASM_MAX_BYTES`).
- `webgpu`: the JSEP kernel table of onnxruntime-web 1.30.0 (its `WEBGPU_OP_RESOLVE_RULES`,
  read from `dist/ort.all.mjs`; `tests/test_web.py` checks it against the installed copy). A
  node outside it, or one with int64 tensors (WebGPU has no 64-bit integers), runs on the
  CPU instead: it works, with a copy across each such boundary.
"""

from __future__ import annotations

import onnx
from onnx import helper

ORT_WEB_VERSION = "1.30.0"  # the onnxruntime-web the table below and the tests are from
WEBGPU_OPS = frozenset(
    """
Abs Acos Acosh Add ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool BatchNormalization
BiasAdd BiasSplitGelu Cast Ceil Clip Concat Conv ConvTranspose Cos Cosh CumSum DepthToSpace
DequantizeLinear DFT Div Einsum Elu Equal Erf Exp Expand FastGelu Floor FusedConv Gather
GatherElements GatherBlockQuantized GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool Greater
GreaterOrEqual GridSample GroupQueryAttention HardSigmoid HardSwish InstanceNormalization
LayerNormalization LeakyRelu Less LessOrEqual Log MatMul MatMulNBits MaxPool Mul
MultiHeadAttention Neg Not Pad Pow QuickGelu Range Reciprocal ReduceMin ReduceMean ReduceMax
ReduceSum ReduceProd ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceSumSquare Relu Resize
RotaryEmbedding ScatterND Sigmoid Sin Sinh Slice SkipLayerNormalization Split Sqrt Softmax Sub Tan Tanh
ThresholdedRelu Tile Transpose Where
""".split()  # noqa: SIM905 (the table as the dist file lists it)
)
# Ops that only move or reshape data: ORT runs them wherever their neighbours are, without a
# kernel of their own on the GPU, so they are no reason to leave it.
_SHAPE_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Shape", "Identity", "Flatten"})
# wasm32 has 4 GiB in all, and onnxruntime-web holds a graph's bytes and its session's copy of the
# weights at once. Measured in Chromium (onnxruntime-web 1.30, NeuCodec at the released size): a
# 1.32 GB graph loaded, a 1.77 GB one failed (std::bad_alloc). The line is drawn between them.
WASM_MAX_BYTES = 3 << 29  # 1.5 GiB

_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
           onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32"}


def _value(v: onnx.ValueInfoProto) -> dict:
    t = v.type.tensor_type
    return {"name": v.name,
            "type": _DTYPES.get(t.elem_type, helper.tensor_dtype_to_np_dtype(t.elem_type).name),
            "shape": [d.dim_value for d in t.shape.dim]}


def graph_facts(model: onnx.ModelProto, file: str) -> dict:
    """What `codecport.mjs` needs of one graph: its file, metadata, inputs and outputs."""
    return {"file": file, "metadata": {p.key: p.value for p in model.metadata_props},
            "inputs": [_value(v) for v in model.graph.input],
            "outputs": [_value(v) for v in model.graph.output]}


def web_manifest(models: dict[str, onnx.ModelProto], files: dict[str, str], codec: type) -> dict:
    """The manifest entries of a web folder: `graphs` (name -> `graph_facts`), the `plans`
    codecport.mjs follows (see `plans`), and the onnxruntime-web it was checked against. `codec`
    is the runtime class, whose facts the plans carry."""
    graphs = {name: graph_facts(m, files[name]) for name, m in models.items()}
    return {"graphs": graphs, "plans": plans(graphs, codec), "ort_web": ORT_WEB_VERSION}


_ORDER = ("fixed", "chunked", "windowed", "step")  # the order the runtime tries its ways through the graphs


def plans(graphs: dict[str, dict], codec: type) -> dict:
    """How the browser goes through the graphs, as the Python runtime does, stated as data so that
    codecport.mjs needs no code of its own per codec: per direction, the graphs in the order they
    are tried, and the peak limit of the input and the loudness filters when decoding restores
    the input's loudness. The ways:
    - `fixed`: one call. `fits` says which clips: `up-to` its length (a causal codec, zero-padded),
      `masked` up to its length too (the graph takes a `mask` of the clip's frames; a clip of `n`
      samples has `(n + clip_frames[1]) // clip_frames[0]` of them), or `exact`ly its frames.
      Masked graphs of several lengths (`--buckets`) come shortest first;
    - `chunked`: windows of `window` samples stepping by `step`, the signal delayed by `delay`;
    - `windowed`: windows of the longest masked graph's `frames`, sharing `overlap`: the codes
      kept from the middle of each overlap, the audio cross-faded over it, a shorter last window
      through the shortest masked graph that holds it;
    - `step`: a step graph and its state's input/output pairs."""
    out = {"encode": [], "decode": [], "causal": codec.causal,
           "peak_limit": 1.0 if codec.limits_peak else None, "loudness": None}
    for name, g in graphs.items():
        m = g["metadata"]
        if m.get("mode") not in _ORDER or m.get("batch", "1") != "1":
            continue
        p = {"graph": name, "mode": m["mode"], "frames": int(m["frames"]), "samples": int(m["samples"])}
        if m["mode"] == "fixed" and any(i["name"] == "mask" for i in g["inputs"]):
            p["fits"] = "masked"
            if m["role"] == "encoder":
                p["clip_frames"] = list(codec.clip_frames(m))
        elif m["mode"] == "fixed":
            p["fits"] = "up-to" if codec.causal else "exact"
        elif m["mode"] == "chunked":
            p.update(frames=int(m["chunk_frames"]), window=int(m["window"]), step=int(m["chunk_step"]),
                     delay=int(m["delay"]))
        else:
            p["state"] = [[i["name"], i["name"][:-len("_in")] + "_out"] for i in g["inputs"][1:]]
        out["encode" if m["role"] == "encoder" else "decode"].append(p)
    for side in ("encode", "decode"):
        masked = [p for p in out[side] if p.get("fits") == "masked"]
        main = max(masked, key=lambda p: p["frames"], default=None)
        overlap = None if main is None else codec.crossfade_overlap(main["frames"])
        if overlap is not None:
            windowed = {**main, "mode": "windowed", "overlap": overlap}
            del windowed["fits"]
            out[side].append(windowed)
        out[side].sort(key=lambda p: (_ORDER.index(p["mode"]),
                                      p["frames"] if p.get("fits") == "masked" else 0))
    if codec.restores_loudness:
        from ..runtime.loudness import LoudnessMeter

        meter = LoudnessMeter(int(next(iter(graphs.values()))["metadata"]["sample_rate"]), 1)
        out["loudness"] = {"stages": [[float(gain), b.tolist(), a.tolist()] for gain, b, a in meter.stages],
                           "block_s": meter.block, "overlap": 1.0 - meter.step}
    return out


def _int64(model: onnx.ModelProto) -> set[str]:
    """Names of the int64 tensors a node computes or takes from the graph's inputs (not
    constant shapes and indices: ORT keeps those on the CPU anyway)."""
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    return {v.name for v in values if v.type.tensor_type.elem_type == onnx.TensorProto.INT64}


def web_verdicts(model: onnx.ModelProto) -> list[dict]:
    """(ep, nodes, supported, partitions, reasons) for `wasm` and `webgpu`, as check.Verdict
    fields. `model` must have its shapes inferred (for the int64 rule)."""
    nodes = list(model.graph.node)
    n = len(nodes)
    reasons: dict[str, str] = {}
    foreign = sorted({node.domain for node in nodes if node.domain not in ("", "ai.onnx", "com.microsoft")})
    if foreign:
        reasons["(domain)"] = f"ops of domain {foreign[0]}, which onnxruntime-web has no kernels for"
    if model.ByteSize() > WASM_MAX_BYTES:
        reasons["(size)"] = (f"{model.ByteSize() / 1e9:.2f} GB: wasm32's 4 GiB cannot hold the graph and "
                             "its session (a 1.77 GB graph failed to load, 1.32 GB loaded); export a "
                             "smaller build (int8) or split the work")
    wasm = {"ep": "wasm", "nodes": n, "supported": 0 if reasons else n,
            "partitions": 0 if reasons else 1, "reasons": dict(reasons)}
    int64 = _int64(model)
    on_gpu = []
    for node in nodes:
        if node.op_type in _SHAPE_OPS:
            on_gpu.append(None)  # follows its neighbours
            continue
        ok = node.op_type in WEBGPU_OPS
        if not ok:
            reasons.setdefault(node.op_type, f"no WebGPU kernel in onnxruntime-web {ORT_WEB_VERSION}: "
                                             "runs on the CPU")
        elif int64 & {*node.input, *node.output}:
            ok = False
            reasons.setdefault(node.op_type, "int64 tensors (codes): WebGPU has no 64-bit integers, "
                                             "ORT runs the node on the CPU")
        on_gpu.append(ok)
    runs = [x for x in on_gpu if x is not None]
    partitions = sum(1 for i, x in enumerate(runs) if x and (i == 0 or not runs[i - 1]))
    supported = sum(1 for x in on_gpu if x is not False)
    if "(size)" in reasons:  # onnxruntime-web loads a graph for WebGPU through the same wasm32 heap
        supported = partitions = 0
    return [wasm, {"ep": "webgpu", "nodes": n, "supported": supported, "partitions": partitions,
                   "reasons": reasons}]


def int32_indices(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every Gather of computed int64 tensors (the codes) takes them cast to int32.

    WebGPU has no 64-bit integers; onnxruntime-web 1.30's WebGPU Gather of int64 codes
    returned wrong rows (tiny DAC decoder: a codebook lookup off by up to 4.5), while int32 is
    its native case. Codes are below 2^31, so the casts are exact.
    """
    from .rewrite import _Builder, _replace_nodes

    inferred = onnx.shape_inference.infer_shapes(model)
    int64 = _int64(inferred)
    consts = {i.name for i in model.graph.initializer}

    cast: dict[str, str] = {}  # int64 tensor -> its int32 copy
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    outputs = {o.name for o in model.graph.output}

    def rewrite(node: onnx.NodeProto, b: _Builder) -> bool:
        if node.op_type not in ("Gather", "GatherElements"):
            return False
        ins = [i for i in node.input[:2] if i in int64 and i not in consts]
        if not ins:
            return False
        for i in ins:
            if i not in cast:
                cast[i] = b.op("Cast", [i], to=onnx.TensorProto.INT32)
        new = onnx.NodeProto()
        new.CopyFrom(node)
        for k in range(2):
            new.input[k] = cast.get(new.input[k], new.input[k])
        b.nodes.append(new)
        if node.input[0] in cast:  # int32 data gives int32 rows, under a new name
            out = new.output[0]
            new.output[0] = b.name("gathered")
            if all(c.op_type in ("Gather", "GatherElements") and list(c.input).index(out) == 1
                   for c in consumers.get(out, [])) and out not in outputs:
                cast[out] = new.output[0]  # only ever indices: they stay int32
            else:  # the int64 the rest of the graph expects
                b.op("Cast", [new.output[0]], out, to=onnx.TensorProto.INT64)
        return True

    return _replace_nodes(model, rewrite, "codecport_web")
