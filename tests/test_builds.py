"""Every --target and --precision on the tiny DAC and Mimi: checker verdicts, measured deviation
within each precision's bounds, files that the runtime (and ORT, for .ort) loads and runs."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from shared_exports import MIMI_TINY_FRAMES, MIMI_TINY_STEP, ONE_THREAD, TINY_CHUNK
from support import noise

import codecport
from codecport.codecs.dac import export as export_dac_mod
from codecport.codecs.mimi import export as export_mimi_mod
from codecport.errors import ExportError
from codecport.export import builds, deviation, precision
from codecport.export.builds import Build, finish_export
from codecport.export.check import check_graph
from codecport.export.graph import write_export
from codecport.export.rewrite import conv_to_2d, nnapi_ops
from codecport.export.targets import TARGETS

# Targets whose graphs are another's: cuda and dml write cpu's (dml fewer precisions), nnapi writes
# mobile's graphs without the .ort files (test_a_target_that_writes_anothers_graphs_is_covered).
COVERED_BY = {"cuda": "cpu", "dml": "cpu", "nnapi": "mobile"}
# The web target needs the quantizer in the graphs: tests/test_web.py exports and runs it. CoreML's
# .mlpackage conversion takes a quarter of a minute a codec: fp16 (what ships to Apple devices)
# here, fp32 and fp16 of a graph in test_coreml.py.
COMBOS = [(t, p) for t, spec in TARGETS.items() for p in spec.precisions
          if not spec.web and t not in COVERED_BY and not (spec.mlpackage and p != "fp16")]
# Lower bounds per precision on the tiny random models (decoder SNR dB, encoder code agreement %).
# fp32 rewrites (2-D layout, NNAPI spellings) must be rounding-level; fp16 keeps ~11 bits of
# mantissa; int8 is coarse on random weights, the bounds only catch a broken quantization (the
# tiny Mimi's encoder: 54-55 % of codes with 7-bit weights, which saturate nowhere; 8-bit weights
# gave 46 % where x86 kernels without VNNI saturate).
BOUNDS = {"fp32": (90.0, 99.9), "fp16": (40.0, 95.0), "int8": (15.0, 50.0)}

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _stage(monkeypatch, module, export, *args, **kwargs):
    """Run the real exporter, keeping what it hands the variant step (the validated fp32 graphs)."""
    seen = {}

    def capture(out_dir, models, rvq, manifest, build, probe):
        seen.update(models=models, rvq=rvq, manifest=manifest, probe=probe)
        return builds.finish_export(out_dir, models, rvq, manifest, build, probe)

    with monkeypatch.context() as m:
        m.setattr(module, "finish_export", capture)
        export(*args, **kwargs)
    return seen


@pytest.fixture(scope="module")
def dac_stage(tiny_export):
    """What `export_dac(tiny_dac, out, TINY_LEN, TINY_CHUNK, ...)` hands the variant step, read back
    (as `build_of_folder` reads a folder) from the shared export of that very call
    (shared_exports.py: `tiny_export`) rather than traced again. DAC's builds need no torch module
    (its .mlpackage conversion is test_coreml.py's)."""
    from codecport.codecs.dac.runtime import DacCodec
    from codecport.runtime.folder import read_manifest

    manifest = read_manifest(tiny_export)
    models = {name: onnx.load(str(tiny_export / file)) for name, file in manifest["files"].items()
              if file.endswith(".onnx")}
    manifest = {k: v for k, v in manifest.items() if k != "files"}
    return {"models": models, "rvq": DacCodec(tiny_export).rvq.arrays(), "manifest": manifest,
            "probe": export_dac_mod.probe(manifest)}


@pytest.fixture(scope="module")
def mimi_stage(tmp_path_factory, tiny_mimi):
    with pytest.MonkeyPatch.context() as mp:
        return _stage(mp, export_mimi_mod, export_mimi_mod.export_mimi, tiny_mimi,
                      tmp_path_factory.mktemp("mimi_fp32"), MIMI_TINY_FRAMES * tiny_mimi.cfg.frame_size,
                      MIMI_TINY_STEP, preset="tiny", weights="random-init seed 0", weights_sha256="none")


def test_a_target_that_writes_anothers_graphs_is_covered():
    """The matrix below leaves out the targets whose graphs another target writes: they differ
    from it in nothing that shapes a graph (only in the precisions they take, or the .ort files)."""
    from dataclasses import replace

    for target, by in COVERED_BY.items():
        mine, theirs = TARGETS[target], TARGETS[by]
        assert set(mine.precisions) <= set(theirs.precisions)
        assert replace(mine, precisions=theirs.precisions, ort_format=theirs.ort_format) == theirs, target


def test_cli_targets_match_the_exporter():
    from codecport.cli.export import export_cli

    target = next(p for p in export_cli.commands["dac"].params if p.name == "target")
    assert set(target.type.choices) == set(TARGETS)


# The folder-level .mlpackage build runs on Mimi's folder; DAC's graphs convert in test_coreml.py
# (a minute of CPU saved).
CASES = [(c, t, p) for c in ("dac", "mimi") for t, p in COMBOS if not (c == "dac" and TARGETS[t].mlpackage)]


@pytest.mark.parametrize("codec,target,precision", CASES)
def test_every_target_and_precision(codec, target, precision, dac_stage, mimi_stage, tmp_path):
    stage = dac_stage if codec == "dac" else mimi_stage
    out = tmp_path / "out"
    report = finish_export(out, stage["models"], stage["rvq"], stage["manifest"],
                           Build(target, precision), stage["probe"])
    manifest = json.loads((out / "manifest.json").read_text())
    graphs = list(stage["models"])
    t = TARGETS[target]

    # Checker verdicts: every graph is one partition on what the target promises.
    for name in graphs:
        verdicts = check_graph(out / f"{name}.onnx")["eps"]
        if precision != "int8":
            assert verdicts["coreml-mlprogram"]["full"], (name, verdicts["coreml-mlprogram"])
            assert verdicts["directml"]["full"], (name, verdicts["directml"])
        if t.layout_2d:
            assert verdicts["nnapi"]["full"], (name, verdicts["nnapi"])
        else:
            assert not verdicts["nnapi"]["full"]  # 1-D convs: what the 2-D targets are for
        if precision == "int8":  # ORT's ML Program table has no Q/DQ: int8 is not for iOS
            assert not verdicts["coreml-mlprogram"]["full"]

    if report.get("deviation") is None:  # the validated fp32 graphs, written as they are
        assert (target, precision) == ("cpu", "fp32")
        assert "precision" not in manifest
    else:
        snr_min, agree_min = BOUNDS[precision]
        assert manifest["precision"] == precision and manifest["target"] == target
        assert manifest["export_id"] != stage["manifest"]["export_id"]
        for name in graphs:
            d = report["deviation"][name]
            meta = {p.key: p.value for p in onnx.load(str(out / f"{name}.onnx")).metadata_props}
            assert json.loads(meta["deviation"]) == json.loads(json.dumps(d))
            assert meta["precision"] == precision and meta["export_id"] == manifest["export_id"]
            assert d["size_bytes"] == (out / f"{name}.onnx").stat().st_size
            if "code_agreement_pct" in d:
                assert d["code_agreement_pct"] >= agree_min, (name, d)
            else:
                assert d["snr_db"] >= snr_min, (name, d)
        if precision == "fp16":  # the weights really are half precision
            dec = onnx.load(str(out / "decoder.onnx"))
            assert sum(i.data_type == TensorProto.FLOAT16 for i in dec.graph.initializer) > 0
            assert all(i.type.tensor_type.elem_type == TensorProto.FLOAT for i in dec.graph.input
                       if i.name in ("latent", "audio"))
        if precision == "int8":
            dec = onnx.load(str(out / "decoder.onnx"))
            assert any(n.op_type == "DequantizeLinear" for n in dec.graph.node)
            # Weights of 7 bits: x86 int8 kernels without VNNI saturate on full-range ones
            # (precision.to_int8), and the deviation measured here would not hold there.
            weights = [numpy_helper.to_array(i) for i in dec.graph.initializer
                       if i.data_type == TensorProto.INT8]
            assert weights and max(int(np.abs(w.astype(np.int16)).max()) for w in weights) <= 64

    # The folder runs through the runtime as written.
    folder = codecport.load(out, options=ONE_THREAD)
    long_mode = next(m for m in folder.modes if m != "fixed")

    def roundtrip(folder):
        codes = folder.encode(noise(2 * TINY_CHUNK), folder.sample_rate, mode=long_mode).data
        return codes, folder.decode(codes, mode=long_mode)[0]

    codes, audio = roundtrip(folder)
    assert np.isfinite(audio).all()

    if t.ort_format:
        assert (out / "required_operators_and_types.config").read_text().strip()
        only_ort = tmp_path / "only_ort"
        shutil.copytree(out, only_ort)
        for f in only_ort.glob("*.onnx"):
            f.unlink()
        for name in graphs:  # ORT itself loads each file and runs it on the CPU
            sess = ort.InferenceSession(str(only_ort / f"{name}.ort"), providers=["CPUExecutionProvider"])
            feeds = {i.name: np.zeros(i.shape, np.int64 if "int64" in i.type else np.float32)
                     for i in sess.get_inputs()}
            assert all(np.isfinite(o).all() for o in sess.run(None, feeds) if o.dtype.kind == "f")
        # ... and the runtime runs a folder of only .ort files to the same codes and audio.
        # (ORT optimizes an .onnx fully at load; the .ort keeps the converter's level, so
        # reduced-precision graphs may round differently.)
        codes_ort, audio_ort = roundtrip(codecport.load(only_ort, options=ONE_THREAD))
        if precision == "fp32":
            np.testing.assert_array_equal(codes_ort, codes)
            np.testing.assert_allclose(audio_ort, audio, atol=1e-5)
        else:
            assert np.mean(codes_ort == codes) >= 0.95
            assert deviation.snr_db(audio, audio_ort) >= 30.0
    if t.mlpackage:
        for name in graphs:
            spec = report["mlpackage"][name]
            assert (out / f"{name}.mlpackage").is_dir()
            want = {i.name: list(i.shape) for i in stage["probe"].specs[name].inputs}
            assert {k: v["shape"] for k, v in spec["inputs"].items()} == want


def test_nothing_is_written_when_a_variant_fails(dac_stage, tmp_path, monkeypatch):
    def broken(model, feeds):
        raise ExportError("quantizer broke")

    monkeypatch.setattr(builds, "to_int8", broken)
    with pytest.raises(ExportError, match="quantizer broke"):
        finish_export(tmp_path / "out", dac_stage["models"], dac_stage["rvq"], dac_stage["manifest"],
                      Build("mobile", "int8"), dac_stage["probe"])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("build,msg", [
    (Build("dml", "int8"), "dml takes"), (Build("coreml", "int8"), "coreml takes"),
    (Build("phone", "fp32"), "--target must be"), (Build("cpu", "fp8"), "--precision must be"),
    (Build("cpu", "fp16", calibration=["x.wav"]), "--calibration only applies"),
])
def test_refused_combinations(build, msg):
    with pytest.raises(ExportError, match=msg):
        build.check()


def test_int8_calibrates_on_the_users_audio(dac_stage, tmp_path):
    import soundfile as sf

    wav = tmp_path / "calib.wav"
    sf.write(wav, noise(3 * TINY_CHUNK, seed=3).T, 16000)
    probe = dac_stage["probe"]
    clips = deviation.calibration_clips([wav], probe)
    assert len(clips) >= 1 and all(c.shape == (1, probe.clip_samples) for c in clips)
    generated = deviation.calibration_clips(None, probe)
    assert not np.allclose(clips[0], generated[0][:, :clips[0].shape[1]])
    out = tmp_path / "out"
    finish_export(out, dac_stage["models"], dac_stage["rvq"], dac_stage["manifest"],
                  Build("cpu", "int8", [wav]), probe)
    # Calibrated on other audio, the quantization scales differ from the default's.
    default = tmp_path / "default"
    finish_export(default, dac_stage["models"], dac_stage["rvq"], dac_stage["manifest"],
                  Build("cpu", "int8"), probe)
    scales = lambda d: sorted(float(numpy_helper.to_array(i).ravel()[0]) for i in
                              onnx.load(str(d / "decoder.onnx")).graph.initializer
                              if i.name.endswith("_scale"))
    assert scales(out) != scales(default)


# ---- the rewrites, op by op ----------------------------------------------------------------
def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _one_op(op: str, shape: list[int], inits: list = (), extra_inputs: list[str] = (), **attrs):
    node = helper.make_node(op, ["x", *extra_inputs], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_erf_spelling_is_within_fp32_rounding():
    x = np.concatenate([np.linspace(-6, 6, 20001), [0.0, 1e-35, -1e-35, 40.0, -40.0]]).astype(np.float32)
    model = nnapi_ops(_one_op("Erf", [x.size]))
    assert {n.op_type for n in model.graph.node}.isdisjoint({"Erf", "Abs", "Sign"})
    got = _run(model, {"x": x})[0]
    want = np.array([math.erf(v) for v in x.astype(np.float64)])
    assert np.max(np.abs(got - want)) < 5e-7


def test_cos_spelling_holds_for_large_angles():
    x = np.concatenate([np.linspace(-10, 10, 1001), np.linspace(1e3, 3e4, 1001)]).astype(np.float32)
    model = nnapi_ops(_one_op("Cos", [x.size]))
    assert "Cos" not in {n.op_type for n in model.graph.node}
    assert np.max(np.abs(_run(model, {"x": x})[0] - np.cos(x.astype(np.float64)))) < 1e-5


def test_layer_norm_and_tile_spellings_are_exact():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 5, 16)).astype(np.float32)
    scale, bias = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "s"), \
        numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")
    ln = _one_op("LayerNormalization", [1, 5, 16], [scale, bias], ["s", "b"], epsilon=1e-5)
    ln = onnx.shape_inference.infer_shapes(ln)
    spelled = nnapi_ops(ln)
    assert "LayerNormalization" not in {n.op_type for n in spelled.graph.node}
    np.testing.assert_allclose(_run(spelled, {"x": x})[0], _run(ln, {"x": x})[0], atol=2e-6)
    reps = numpy_helper.from_array(np.array([1, 1, 3], np.int64), "r")
    tile = _one_op("Tile", [1, 5, 1], [reps], ["r"])
    spelled = nnapi_ops(tile)
    assert "Tile" not in {n.op_type for n in spelled.graph.node}
    np.testing.assert_array_equal(_run(spelled, {"x": x[..., :1]})[0], _run(tile, {"x": x[..., :1]})[0])


def test_conv_to_2d_is_the_same_conv():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((6, 2, 5)).astype(np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"], strides=[2], dilations=[3], group=2,
                            kernel_shape=[5])
    graph = helper.make_graph([conv], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 40])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 14])],
                              initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    two_d = conv_to_2d(model)
    conv2 = next(n for n in two_d.graph.node if n.op_type == "Conv")
    weight = next(i for i in two_d.graph.initializer if i.name == conv2.input[1])
    assert list(weight.dims) == [6, 2, 5, 1]
    assert {n.op_type for n in two_d.graph.node} == {"Reshape", "Conv"}
    x = rng.standard_normal((1, 4, 40)).astype(np.float32)
    np.testing.assert_allclose(_run(two_d, {"x": x})[0], _run(model, {"x": x})[0], atol=1e-6)


def test_fp16_keeps_the_nodes_that_overflow_in_fp32():
    """A node whose output passes fp16's range on the probe feeds is found and stays fp32."""
    big = numpy_helper.from_array(np.array([1e5], np.float32), "big")
    small = numpy_helper.from_array(np.array([1e-5], np.float32), "small")
    nodes = [helper.make_node("Mul", ["x", "big"], ["h"], name="blow_up"),
             helper.make_node("Mul", ["h", "small"], ["y"], name="scale_down")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              initializer=[big, small])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([0.5, 1.0, 2.0, -3.0], np.float32)
    assert precision.overflowing_nodes(model, [{"x": x}]) == ["blow_up"]
    assert precision.overflowing_nodes(model, [{"x": x * 1e-3}]) == []
    kept = precision.to_fp16(model, ["blow_up"])
    np.testing.assert_allclose(_run(kept, {"x": x})[0], x, rtol=5e-3)  # 1e-5 is subnormal in fp16
    # Not kept, the fp16 converter clips the 1e5 to fp16's 65504: the result is a third off.
    assert np.max(np.abs(_run(precision.to_fp16(model, []), {"x": x})[0] / x - 1)) > 0.2


def test_recorded_feeds_are_a_bounded_sample(mimi_stage, tmp_path):
    """Calibration keeps at most `keep` real feeds per graph, step state included."""
    probe = mimi_stage["probe"]
    folder = tmp_path / "fp32"
    write_export(folder, mimi_stage["models"], mimi_stage["rvq"], mimi_stage["manifest"])
    clips = deviation.generated_clips(2, probe.clip_samples, probe.sample_rate, seed=1)
    everything = deviation.record_feeds(probe.open(folder, options={"io_binding": "0"}), probe, clips,
                                       keep=10_000)
    sample = deviation.record_feeds(probe.open(folder, options={"io_binding": "0"}), probe, clips, keep=5)
    steps = everything["encoder_step"]
    assert len(steps) > 5 and {"offset_in", "audio"} <= set(steps[0])
    # Real state: the stream's offset advances step by step from 0.
    assert steps[0]["offset_in"].item() == 0 < steps[1]["offset_in"].item() < steps[2]["offset_in"].item()
    assert all(len(v) <= 5 for v in sample.values()) and len(sample["encoder_step"]) == 5
    offsets = {f["offset_in"].item() for f in steps}
    assert all(f["offset_in"].item() in offsets for f in sample["encoder_step"])


def test_web_target_refuses_a_numpy_quantizer(dac_stage, tmp_path):
    """The browser reads no rvq.npz: a web variant of graphs that leave the quantizer out is
    refused before anything is written."""
    with pytest.raises(ExportError, match="puts the quantizer in the graphs"):
        finish_export(tmp_path / "out", dac_stage["models"], dac_stage["rvq"], dac_stage["manifest"],
                      Build("web", "fp32"), dac_stage["probe"])
    assert not (tmp_path / "out").exists()
