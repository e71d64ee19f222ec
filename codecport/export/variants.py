"""Shipping variants of an export: where the graphs run (`--target`) and in what precision
(`--precision`), each measured against the fp32 graphs before anything is written.

The fp32 graphs come out of the codec exporters already validated against torch. A variant is a
rewrite of those ONNX graphs, never a second trace, so it cannot drift from what was validated:
- layout: NNAPI and CoreML's NeuralNetwork take only 2-D Conv, so `nnapi` and `mobile` carry each
  1-D conv as `[1, C, T, 1]` with a `[k, 1]` kernel, and spell the ops NNAPI lacks with ops it
  has (rewrite.py);
- fp16: ONNX Runtime's converter, inputs and outputs kept fp32, and every node whose fp32 output
  was measured past fp16's range kept fp32;
- int8: onnxruntime.quantization static QDQ (per-channel int8 weights, uint8 activations) for
  Conv and weight MatMuls, calibrated on audio the user passes or on generated clips;
- `mobile`: ORT-format `.ort` files and the reduced-build operator config (ORT's converter);
- `coreml`: a `.mlpackage` per graph, converted by coremltools from the torch reference.

Deviation is measured through the runtime, the way users will run the files: the same clip set
goes through the fp32 folder and the variant folder, and each file's metadata and the report
record code agreement, SNR and max abs error of the decoded audio, and the file's size.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from ..atomic import atomic_path
from ..errors import ExportError
from .graph import export_id, write_export
from .rewrite import conv_to_2d, nnapi_ops

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8")
FP16_MAX = 65504.0
# fp32 rewrites (layout, NNAPI spellings) must reproduce fp32 up to rounding: anything past this
# is a bug in the rewrite, not a property of the target.
REWRITE_MIN_AGREEMENT, REWRITE_MIN_SNR = 99.0, 60.0
# Calibration feeds kept per graph (see record_feeds).
MAX_FEEDS = 64


@dataclass(frozen=True)
class Target:
    layout_2d: bool = False  # 1-D convs carried as 2-D
    ort_format: bool = False  # .ort files + required_operators_and_types.config
    mlpackage: bool = False  # CoreML .mlpackage per graph
    precisions: tuple[str, ...] = PRECISIONS


TARGETS = {
    "cpu": Target(),
    "cuda": Target(),
    # DirectML's int8 story is QDQ-on-GPU with its own caveats; we only claim what the rule table
    # checks (fp32/fp16 tensors).
    "dml": Target(precisions=("fp32", "fp16")),
    # coremltools quantizes its own way (ct.optimize), not from ONNX QDQ, and ORT's ML Program
    # partitioner takes no Q/DQ: no int8 here.
    "coreml": Target(mlpackage=True, precisions=("fp32", "fp16")),
    "nnapi": Target(layout_2d=True),
    "mobile": Target(layout_2d=True, ort_format=True),
}


@dataclass
class Shaping:
    """What the user asked for: `codec-export ... --target T --precision P [--calibration F]`."""

    target: str = "cpu"
    precision: str = "fp32"
    calibration: list[Path] | None = None

    @property
    def plain(self) -> bool:
        """Nothing to do beyond the validated fp32 graphs."""
        t = TARGETS[self.target]
        return self.precision == "fp32" and not (t.layout_2d or t.ort_format or t.mlpackage)

    def check(self) -> None:
        if self.target not in TARGETS:
            raise ExportError(f"--target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.precision not in PRECISIONS:
            raise ExportError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.precision not in TARGETS[self.target].precisions:
            raise ExportError(f"--target {self.target} takes --precision "
                              f"{' or '.join(TARGETS[self.target].precisions)}, not {self.precision}")
        if self.calibration and self.precision != "int8":
            raise ExportError("--calibration only applies to --precision int8")
        if self.calibration:  # a bad file is reported now, not after a long fp32 export
            from ..runtime.audio import read_audio

            for path in self.calibration:
                read_audio(Path(path))


@dataclass
class CodecHooks:
    """What the variant machinery needs from a codec exporter.

    `open(dir)` builds the runtime codec for an export folder. `encode(codec, name, clip)` gives
    codes for a clip `[1, N]` at the model rate through encoder graph `name` (the clip cut to
    what that graph's path takes); `decode(codec, name, codes)` gives audio through decoder
    graph `name`. `pairs` maps each encoder to the decoder its codes go back through.
    `clip_samples` is a clip length that reaches every graph (chunked/step ones included), and
    `specs` the graphs' GraphSpecs, for the .mlpackage conversion.
    """

    open: Callable[..., object]  # (dir, options=None) -> DacCodec | MimiCodec
    encode: Callable[[object, str, np.ndarray], np.ndarray]
    decode: Callable[[object, str, np.ndarray], np.ndarray]
    pairs: dict[str, str]
    sample_rate: int
    clip_samples: int
    specs: dict


def exercise(hooks: CodecHooks, codec, clip: np.ndarray,
             codes: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every graph of `codec` run once on `clip`: encoder name -> codes, decoder name -> audio.

    Decoders decode `codes[their encoder]` when given (the fp32 folder's codes, so both folders
    decode the same codes), else this codec's own codes.
    """
    out = {}
    for enc, dec in hooks.pairs.items():
        if enc in codec.present:
            out[enc] = hooks.encode(codec, enc, clip)
        src = (codes or out).get(enc)
        if dec in codec.present and src is not None:
            out[dec] = hooks.decode(codec, dec, src)
    return out


@contextlib.contextmanager
def _quiet(what: str) -> Iterator[None]:
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


# ---- clips ---------------------------------------------------------------------------------
def generated_clips(n: int, samples: int, sample_rate: int, seed: int) -> list[np.ndarray]:
    """Speech/music-like test audio `[1, samples]`: harmonic tones with a moving pitch, an
    amplitude envelope and a little noise; deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / sample_rate
    clips = []
    for _ in range(n):
        f0 = rng.uniform(90, 300) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t))
        phase = 2 * np.pi * np.cumsum(f0) / sample_rate
        tone = sum(np.sin(h * phase) / h for h in range(1, 6))
        env = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * t + rng.uniform(0, 6))
        x = 0.25 * env * tone + 0.02 * rng.standard_normal(samples)
        clips.append((x / max(1.0, np.abs(x).max()))[None].astype(np.float32))
    return clips


def calibration_clips(paths: list[Path] | None, hooks: CodecHooks, seed: int = 100) -> list[np.ndarray]:
    """The user's calibration audio (any format soundfile reads, resampled, mono) cut to the
    clip length, or generated clips when none is given."""
    if not paths:
        return generated_clips(4, hooks.clip_samples, hooks.sample_rate, seed)
    from ..runtime.audio import read_audio, resample

    clips = []
    for p in paths:
        audio, sr = read_audio(Path(p))
        x = resample(audio, sr, hooks.sample_rate).mean(axis=0, keepdims=True)
        for i in range(0, max(1, x.shape[1] - hooks.clip_samples + 1), hooks.clip_samples):
            piece = x[:, i:i + hooks.clip_samples]
            clips.append(np.pad(piece, ((0, 0), (0, hooks.clip_samples - piece.shape[1]))))
    return clips[:16]  # calibration cost grows with it; 16 clips cover the ranges


# ---- precision -----------------------------------------------------------------------------
def overflowing_nodes(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> list[str]:
    """Nodes whose fp32 output exceeds fp16's range on `feeds` (measured, every intermediate).

    Each float intermediate gets an Abs -> ReduceMax output, so the probe returns one number per
    tensor instead of keeping every activation of a long window in memory at once.
    """
    import onnxruntime as ort

    probe = _copy(model)
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

    m = convert_float_to_float16(_copy(model), keep_io_types=True, node_block_list=keep_fp32)
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


def to_int8(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """Static QDQ: per-channel int8 weights, uint8 activations calibrated (min/max) on `feeds`.

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

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    with tempfile.TemporaryDirectory() as tmp, _quiet("onnxruntime.quantization"):
        out = Path(tmp) / "int8.onnx"
        quantize_static(_copy(model), out, Reader(), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=["Conv", "MatMul"], nodes_to_exclude=exclude,
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": False, "WeightSymmetric": True})
        return onnx.load(str(out))


# ---- feeds recorded from the runtime -------------------------------------------------------
def record_feeds(codec, hooks: CodecHooks, clips: list[np.ndarray],
                 keep: int = MAX_FEEDS) -> dict[str, list[dict]]:
    """The inputs each graph of `codec` receives while `exercise` runs on `clips`: the real
    feeds, state included for step graphs, for calibration and range measurement. At most `keep`
    per graph, a uniform sample (reservoir): a step graph's feeds carry megabytes of state each."""
    feeds: dict[str, list[dict]] = {}
    seen: dict[str, int] = {}
    rng = np.random.default_rng(0)
    for name in codec.present:
        graph = codec.graph(name)
        sess_run = graph.session.run

        def recording(outputs, feed, *args, _name=name, _run=sess_run, **kwargs):
            n = seen[_name] = seen.get(_name, 0) + 1
            kept = feeds.setdefault(_name, [])
            if len(kept) < keep:
                kept.append({k: np.array(v) for k, v in feed.items()})
            elif (slot := int(rng.integers(0, n))) < keep:
                kept[slot] = {k: np.array(v) for k, v in feed.items()}
            return _run(outputs, feed, *args, **kwargs)

        graph.session.run = recording
    try:
        for clip in clips:
            exercise(hooks, codec, clip)
    finally:
        for name in codec.present:
            del codec.graph(name).session.run
    return feeds


# ---- deviation -----------------------------------------------------------------------------
def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((got.astype(np.float64) - ref) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    if noise == 0.0:
        return float("inf")
    return 10 * np.log10(max(signal, 1e-30) / noise)


def deviation(ref_dir: Path, var_dir: Path, hooks: CodecHooks, clips: list[np.ndarray]) -> dict[str, dict]:
    """Per graph: code agreement (encoders), SNR and max abs error of decoded audio vs fp32.

    An encoder's audio figures decode its codes with the fp32 decoder, so they show what the
    variant encoder alone costs; a decoder decodes the fp32 codes.
    """
    ref, var = hooks.open(ref_dir), hooks.open(var_dir)
    acc: dict[str, dict[str, list]] = {}
    for clip in clips:
        want = exercise(hooks, ref, clip)
        got = exercise(hooks, var, clip, codes=want)
        for enc, dec in hooks.pairs.items():
            if enc in got:
                a = acc.setdefault(enc, {"agree": [], "first": [], "ref": [], "got": []})
                a["agree"].append((got[enc] == want[enc]).ravel())
                a["first"].append((got[enc][:, 0] == want[enc][:, 0]).ravel())
                if dec in want:
                    a["ref"].append(want[dec].ravel())
                    a["got"].append(hooks.decode(ref, dec, got[enc]).ravel())
            if dec in got:
                a = acc.setdefault(dec, {"agree": [], "first": [], "ref": [], "got": []})
                a["ref"].append(want[dec].ravel())
                a["got"].append(got[dec].ravel())
    out = {}
    for name, a in acc.items():
        d = {}
        if a["agree"]:
            d["code_agreement_pct"] = round(100 * float(np.mean(np.concatenate(a["agree"]))), 3)
            d["first_codebook_agreement_pct"] = round(100 * float(np.mean(np.concatenate(a["first"]))), 3)
        if a["ref"]:
            r, g = np.concatenate(a["ref"]), np.concatenate(a["got"])
            d["snr_db"] = round(snr_db(r, g), 2)
            d["max_abs_err"] = float(np.max(np.abs(g.astype(np.float64) - r)))
        out[name] = d
    return out


# ---- the whole step ------------------------------------------------------------------------
def finish_export(out_dir: Path, models: dict[str, onnx.ModelProto], rvq: dict | None, manifest: dict,
                  shaping: Shaping, hooks: CodecHooks) -> dict:
    """Write the export for `shaping`: the validated fp32 graphs as they are, or their variant
    with its measured deviation. Returns the report additions (files, deviation, target)."""
    shaping.check()
    if shaping.plain:
        return {"files": write_export(out_dir, models, rvq, manifest)}
    target = TARGETS[shaping.target]
    new_id = export_id(manifest["export_id"], shaping.target, shaping.precision)
    tag = {"target": shaping.target, "precision": shaping.precision, "export_id": new_id}
    with tempfile.TemporaryDirectory(prefix="codecport-") as tmp:
        ref_dir, var_dir = Path(tmp) / "fp32", Path(tmp) / "variant"
        write_export(ref_dir, models, rvq, manifest)
        calib = None
        if shaping.precision != "fp32":
            clips = calibration_clips(shaping.calibration, hooks)
            # Without IO binding, every feed (state included) passes through session.run.
            calib = record_feeds(hooks.open(ref_dir, options={"io_binding": "0"}), hooks, clips)
        variants = {}
        for name, model in models.items():
            m = nnapi_ops(conv_to_2d(model)) if target.layout_2d else _copy(model)
            if shaping.precision == "fp16":
                m = to_fp16(m, overflowing_nodes(m, calib[name][:4]))
            elif shaping.precision == "int8":
                m = to_int8(m, calib[name])
            _set_metadata(m, tag)
            onnx.checker.check_model(m)
            variants[name] = m
            log.info("%s: %s/%s variant built", name, shaping.target, shaping.precision)
        var_manifest = {**manifest, **tag, "fp32_export_id": manifest["export_id"]}
        write_export(var_dir, variants, rvq, var_manifest)
        clips = generated_clips(2, hooks.clip_samples, hooks.sample_rate, seed=7)
        dev = deviation(ref_dir, var_dir, hooks, clips)
        if shaping.precision == "fp32":
            _check_lossless(dev)
        for name, m in variants.items():
            d = {**dev.get(name, {}), "size_bytes": 0, "fp32_size_bytes": models[name].ByteSize()}
            while d["size_bytes"] != m.ByteSize():  # the record is part of the size it records
                d["size_bytes"] = m.ByteSize()
                _set_metadata(m, {"deviation": json.dumps(d, sort_keys=True)})
            dev[name] = d
        report = {"target": shaping.target, "precision": shaping.precision, "deviation": dev,
                  "clip_set": "2 generated clips (tones with moving pitch, envelope, noise), "
                              f"{hooks.clip_samples} samples each, seed 7"}
        # Everything is built in a staging folder first: a conversion that fails leaves out_dir
        # as it was.
        stage = Path(tmp) / "stage"
        extra = {}
        write_export(stage, variants, None, {})
        if target.ort_format:
            extra.update(write_ort(stage, list(variants)))
        if target.mlpackage:
            extra.update(write_mlpackages(stage, hooks, tag, report))
        for name in extra.values():
            _install(stage / name, out_dir / name)
        report["files"] = write_export(out_dir, variants, rvq, {**var_manifest, **report}, extra)
    return report


def _install(src: Path, dst: Path) -> None:
    """Copy a staged file or folder (.mlpackage) into place, replacing what was there."""
    if src.is_dir():
        tmp = dst.with_name(f".{dst.name}.part")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        old = dst.with_name(f".{dst.name}.old")
        if dst.exists():
            dst.rename(old)
        tmp.rename(dst)
        shutil.rmtree(old, ignore_errors=True)
        return
    with atomic_path(dst) as tmp_file:
        shutil.copy(src, tmp_file)


def variant_of_folder(fp32_dir: Path, out_dir: Path, shaping: Shaping) -> dict:
    """`finish_export` from a written fp32 export folder instead of a fresh trace (no weights
    needed); the .mlpackage conversion needs the torch modules, so not `--target coreml`."""
    from ..runtime.rvq import DacRvq, MimiRvq

    if TARGETS[shaping.target].mlpackage:
        raise ExportError("a .mlpackage is converted from the torch model: export with --target coreml")
    manifest = json.loads((fp32_dir / "manifest.json").read_text())
    if "precision" in manifest:
        raise ExportError(f"{fp32_dir} is already a {manifest['precision']} variant; start from an "
                          "fp32 export")
    if manifest["codec"] == "dac":
        from .dac import hooks
    else:
        from .mimi import hooks
    models = {name: onnx.load(str(fp32_dir / file)) for name, file in manifest["files"].items()
              if file.endswith(".onnx")}
    rvq = None
    if "rvq" in manifest["files"]:
        rvq = (DacRvq if manifest["codec"] == "dac" else MimiRvq).load(fp32_dir / "rvq.npz").arrays()
    base = {k: v for k, v in manifest.items() if k != "files"}
    return finish_export(out_dir, models, rvq, base, shaping, hooks(manifest))


def _check_lossless(dev: dict[str, dict]) -> None:
    for name, d in dev.items():
        encoder = "code_agreement_pct" in d
        if (encoder and d["code_agreement_pct"] < REWRITE_MIN_AGREEMENT) or \
                (not encoder and not d.get("snr_db", 0.0) >= REWRITE_MIN_SNR):
            raise ExportError(f"{name}: the fp32 rewrite for this target changed the results ({d}); "
                              "this is a codecport bug, please report it")


def write_ort(out_dir: Path, names: list[str]) -> dict[str, str]:
    """ORT-format files of `out_dir`'s graphs and the reduced-build operator config, written
    into `out_dir`; returns file key -> name.

    'Runtime' optimization style, as ORT advises for NNAPI/CoreML: 'Fixed' would bake this
    machine's (x86) kernel layouts into a file meant for phones.
    """
    from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

    with tempfile.TemporaryDirectory(prefix="codecport-ort-") as tmp:
        src = Path(tmp) / "onnx"
        src.mkdir()
        for name in names:
            shutil.copy(out_dir / f"{name}.onnx", src / f"{name}.onnx")
        dst = Path(tmp) / "ort"
        try:
            with _quiet("convert_onnx_models_to_ort"):
                convert_onnx_models_to_ort(src, output_dir=dst, enable_type_reduction=True,
                                           optimization_styles=[OptimizationStyle.Runtime])
        except Exception as e:  # the converter raises bare exceptions
            raise ExportError(f"ORT-format conversion failed: {str(e).splitlines()[0]}") from e
        files = {}
        for f in sorted(dst.iterdir()):
            if f.suffix in (".ort", ".config"):
                name = f.name.replace(".with_runtime_opt", "")
                shutil.copy(f, out_dir / name)
                files[name.replace(".", "_")] = name
    return files


def write_mlpackages(out_dir: Path, hooks: CodecHooks, tag: dict, report: dict) -> dict:
    """One `.mlpackage` per graph, converted from the torch reference (see export/coreml.py);
    the inspected specs go into `report["mlpackage"]`."""
    from .coreml import to_mlpackage

    files, specs = {}, {}
    for name, spec in hooks.specs.items():
        spec.metadata = {**spec.metadata, **tag}
        specs[name] = to_mlpackage(spec, out_dir / f"{name}.mlpackage", tag["precision"])
        files[f"{name}_mlpackage"] = f"{name}.mlpackage"
    report["mlpackage"] = specs
    return files


def _set_metadata(model: onnx.ModelProto, values: dict[str, str]) -> None:
    props = {p.key: p.value for p in model.metadata_props}
    props.update({k: str(v) for k, v in values.items()})
    del model.metadata_props[:]
    for k, v in props.items():
        model.metadata_props.add(key=k, value=v)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


