"""Mimi export: the released config's four graphs, tiny geometries, the in-graph quantizer, refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import load_file
from shared_exports import skipped_init

from codecport import __version__
from codecport.codecs.mimi import export as export_mod
from codecport.codecs.mimi.export import export_mimi, rvq_of
from codecport.codecs.mimi.model import PRESETS, MimiModel, init_random
from codecport.errors import ExportError, ValidationError

GRAPHS = ["encoder", "decoder", "encoder_step", "decoder_step"]

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _io(vis) -> dict[str, tuple[tuple[int, ...], int]]:
    """name -> (static shape, ONNX element type) of graph inputs or outputs."""
    out = {}
    for vi in vis:
        t = vi.type.tensor_type
        out[vi.name] = (tuple(d.dim_value for d in t.shape.dim), t.elem_type)
    return out


def _assert_portable(path) -> tuple[onnx.ModelProto, dict[str, str]]:
    """Checker passes, no ConvTranspose, no Conv pads, every inferred shape static."""
    model = onnx.load(path)
    onnx.checker.check_model(model)
    ops = {n.op_type for n in model.graph.node}
    assert "ConvTranspose" not in ops and "Conv" in ops
    for node in model.graph.node:
        if node.op_type == "Conv":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert not any(attrs.get("pads", [])), node.name
            assert attrs.get("auto_pad", b"NOTSET") in (b"NOTSET", b"VALID"), node.name
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for vi in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]:
        assert vi.type.tensor_type.HasField("shape"), vi.name
        assert all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim), vi.name
    return model, {p.key: p.value for p in model.metadata_props}


def _session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _zero_feeds(sess: ort.InferenceSession) -> dict[str, np.ndarray]:
    """The documented initial state: every `<state>_in` zeros, offset_in 0."""
    return {i.name: np.zeros(i.shape, np.int64 if i.name == "offset_in" else np.float32)
            for i in sess.get_inputs()[1:]}


# ---- the released config ------------------------------------------------------------------
@pytest.fixture(scope="module")
def preset_export(released_mimi):
    """The full "mimi" config (random weights), exported once a run for every test that needs
    it (shared_exports.py): --len 48000, one-frame step graphs."""
    weights, out = released_mimi
    with skipped_init():
        model = MimiModel(PRESETS["mimi"]).eval()
    model.load_state_dict(load_file(str(weights)))  # the weights it was exported with, every one
    report = json.loads((out / "manifest.json").read_text())  # the export's report is in it
    graphs = {name: _assert_portable(out / f"{name}.onnx") for name in GRAPHS}
    return model, out, report, graphs


@pytest.mark.slow
def test_preset_validates_and_every_graph_is_portable(preset_export):
    _, _, report, graphs = preset_export
    assert set(report["validation"]) == set(GRAPHS)
    for name in ("decoder", "decoder_step"):
        assert report["validation"][name]["audio_max_abs_err"] <= 1e-4
    for name in ("encoder", "encoder_step"):
        assert report["validation"][name] == {"codes_identical": 1.0}
    assert report["geometry"]["frames"] == 25 and report["geometry"]["step_samples"] == 1920
    metas = [meta for _, meta in graphs.values()]
    for name, meta in zip(graphs, metas):
        assert meta["codec"] == "mimi" and meta["preset"] == "mimi", name
        assert meta["frame_size"] == "1920" and meta["sample_rate"] == "24000", name
        assert meta["quantizer"] == "numpy" and meta["n_codebooks"] == "32", name
        assert meta["codecport_version"] == __version__, name
        assert meta["mode"] == ("step" if "step" in name else "fixed"), name
        assert meta["role"] == name.split("_")[0], name
    ids = {meta["export_id"] for meta in metas}
    assert len(ids) == 1 and len(ids.pop()) == 16


def test_preset_fixed_graph_shapes(preset_export):
    _, _, _, graphs = preset_export
    enc, meta = graphs["encoder"]
    assert _io(enc.graph.input) == {"audio": ((1, 1, 48000), onnx.TensorProto.FLOAT)}
    assert _io(enc.graph.output) == {"latent": ((1, 512, 25), onnx.TensorProto.FLOAT)}
    assert meta["samples"] == "48000" and meta["frames"] == "25"
    dec, meta = graphs["decoder"]
    assert _io(dec.graph.input) == {"latent": ((1, 512, 25), onnx.TensorProto.FLOAT)}
    assert _io(dec.graph.output) == {"audio": ((1, 1, 48000), onnx.TensorProto.FLOAT)}


@pytest.mark.parametrize("name", ["encoder_step", "decoder_step"])
def test_preset_step_graph_state_pairs(preset_export, name):
    model, _, _, graphs = preset_export
    graph, meta = graphs[name]
    inputs, outputs = _io(graph.graph.input), _io(graph.graph.output)
    side = name.split("_")[0]
    # First input/output is the signal; everything else comes as `*_in` / `*_out` pairs.
    first_in, first_out = graph.graph.input[0].name, graph.graph.output[0].name
    assert {first_in, first_out} == {"audio", "latent"}
    ins = {n[:-3] for n in inputs if n != first_in}
    outs = {n[:-4] for n in outputs if n != first_out}
    assert all(n.endswith("_in") for n in inputs if n != first_in)
    assert all(n.endswith("_out") for n in outputs if n != first_out)
    assert ins == outs and "offset" in ins
    for stem in ins:
        assert inputs[f"{stem}_in"] == outputs[f"{stem}_out"], stem
    assert inputs["offset_in"] == ((1,), onnx.TensorProto.INT64)
    # The attention caches: one per transformer layer, [1 (a stream a batch row), 2, heads, context,
    # head_dim].
    kv = [s for s, (shape, _) in inputs.items() if len(shape) == 5]
    assert len(kv) == model.cfg.n_layers
    assert {inputs[s] for s in kv} == {((1, 2, 8, 250, 64), onnx.TensorProto.FLOAT)}
    assert meta["states"].split(",") == list(model.state_shapes(side))
    assert meta["frames"] == "1" and meta["samples"] == "1920" and meta["positions_per_step"] == "2"
    signal = (1, 1, 1920) if side == "encoder" else (1, 512, 1)
    assert inputs[first_in][0] == signal


def test_preset_encoder_step_matches_torch(preset_export):
    """One step from the zero state gives torch's codes for that one-frame clip."""
    model, out, _, _ = preset_export
    x = (0.3 * np.random.default_rng(11).standard_normal((1, 1, 1920))).astype(np.float32)
    sess = _session(out / "encoder_step.onnx")
    latent, offset = sess.run(["latent", "offset_out"], {"audio": x, **_zero_feeds(sess)})
    with torch.no_grad():
        want = model.encode(torch.from_numpy(x)).numpy()[0]
    np.testing.assert_array_equal(rvq_of(model).encode(latent[0]), want)
    assert offset.tolist() == [2]


def test_preset_manifest_lists_the_files(preset_export):
    _, out, _, graphs = preset_export
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"] == {**{g: f"{g}.onnx" for g in GRAPHS}, "rvq": "rvq.npz",
                                 "manifest": "manifest.json"}
    assert manifest["export_id"] == graphs["encoder"][1]["export_id"]
    assert manifest["codec"] == "mimi" and manifest["n_codebooks"] == 32
    assert sorted(p.name for p in out.iterdir()) == sorted(manifest["files"].values())
    with np.load(out / "rvq.npz", allow_pickle=False) as z:
        assert z["codebook"].shape == (32, 2048, 256) and int(z["n_semantic"]) == 1


# ---- tiny geometries ----------------------------------------------------------------------
def test_length_not_a_frame_multiple(tmp_path, tiny_mimi):
    cfg = tiny_mimi.cfg
    n = 250
    assert n % cfg.frame_size
    frames = math.ceil(n / cfg.frame_size)
    report = export_mimi(tiny_mimi, tmp_path, n, None, preset="tiny", weights="random",
                         weights_sha256="none")
    assert report["geometry"]["frames"] == frames == 11
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decoder.onnx", "encoder.onnx",
                                                          "manifest.json", "rvq.npz"]
    enc, meta = _assert_portable(tmp_path / "encoder.onnx")
    assert meta["samples"] == str(n) and meta["frames"] == str(frames)
    assert _io(enc.graph.input)["audio"][0] == (1, 1, n)
    assert _io(enc.graph.output)["latent"][0] == (1, cfg.dimension, frames)
    dec, meta = _assert_portable(tmp_path / "decoder.onnx")
    assert _io(dec.graph.output)["audio"][0] == (1, 1, frames * cfg.frame_size)
    assert meta["samples"] == str(frames * cfg.frame_size)
    # The zero padding happens inside the graph: same latent as torch on the padded clip.
    x = (0.3 * np.random.default_rng(2).standard_normal((1, 1, n))).astype(np.float32)
    with torch.no_grad():
        want = tiny_mimi.encode_latent(tiny_mimi.pad(torch.from_numpy(x))).numpy()
    assert np.abs(_session(tmp_path / "encoder.onnx").run(None, {"audio": x})[0] - want).max() <= 1e-5


def test_streaming_only_export(tmp_path, tiny_mimi):
    cfg = tiny_mimi.cfg
    report = export_mimi(tiny_mimi, tmp_path, None, 3, preset="tiny", weights="random",
                         weights_sha256="none")
    assert report["geometry"]["step_samples"] == 3 * cfg.frame_size
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decoder_step.onnx", "encoder_step.onnx",
                                                          "manifest.json", "rvq.npz"]
    for side in ("encoder", "decoder"):
        graph, meta = _assert_portable(tmp_path / f"{side}_step.onnx")
        assert meta["frames"] == "3" and meta["samples"] == str(3 * cfg.frame_size)
        assert meta["positions_per_step"] == str(3 * cfg.downsample_stride)
        signal = {"encoder": ("audio", (1, 1, 3 * cfg.frame_size)),
                  "decoder": ("latent", (1, cfg.dimension, 3))}[side]
        assert (graph.graph.input[0].name, _io(graph.graph.input)[signal[0]][0]) == signal
    # Two chained steps from the zero state: offset_out counts SEANet positions.
    sess = _session(tmp_path / "encoder_step.onnx")
    feeds = _zero_feeds(sess)
    names = [o.name for o in sess.get_outputs()]
    for expected in (6, 12):
        res = sess.run(None, {"audio": np.zeros((1, 1, 72), np.float32), **feeds})
        feeds = {n[:-4] + "_in": v for n, v in zip(names[1:], res[1:])}
        assert feeds["offset_in"].tolist() == [expected]


def test_in_graph_quantizer(tmp_path, tiny_mimi):
    cfg = tiny_mimi.cfg
    n = 20 * cfg.frame_size - 7
    frames = 20
    export_mimi(tiny_mimi, tmp_path, n, 2, preset="tiny", weights="random", weights_sha256="none",
                in_graph_codebooks=3)
    assert not (tmp_path / "rvq.npz").exists()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["quantizer"] == "graph" and manifest["n_codebooks"] == 3
    enc, meta = _assert_portable(tmp_path / "encoder.onnx")
    assert meta["quantizer"] == "graph" and meta["n_codebooks"] == "3"
    assert _io(enc.graph.output) == {"codes": ((1, 3, frames), onnx.TensorProto.INT64)}
    dec, _ = _assert_portable(tmp_path / "decoder.onnx")
    assert _io(dec.graph.input) == {"codes": ((1, 3, frames), onnx.TensorProto.INT64)}
    step, _ = _assert_portable(tmp_path / "encoder_step.onnx")
    assert _io(step.graph.output)["codes"] == ((1, 3, 2), onnx.TensorProto.INT64)

    x = (0.3 * np.random.default_rng(4).standard_normal((1, 1, n))).astype(np.float32)
    codes = _session(tmp_path / "encoder.onnx").run(None, {"audio": x})[0]
    with torch.no_grad():
        want = tiny_mimi.encode(tiny_mimi.pad(torch.from_numpy(x)), 3).numpy()
    assert codes.dtype == np.int64 and codes.shape == (1, 3, frames)
    np.testing.assert_array_equal(codes, want)
    assert len(np.unique(codes)) > 10  # spread-out codes: the comparison means something
    audio = _session(tmp_path / "decoder.onnx").run(None, {"codes": codes})[0]
    with torch.no_grad():
        assert np.abs(audio - tiny_mimi.decode(torch.from_numpy(codes)).numpy()).max() <= 1e-4


# ---- refusals -----------------------------------------------------------------------------
def _export(model, out, samples=240, step_frames=2, **kw):
    return export_mimi(model, out, samples, step_frames, preset="tiny", weights="random",
                       weights_sha256="none", **kw)


@pytest.mark.parametrize("args, match", [
    ({"samples": None, "step_frames": None}, "nothing to export"),
    ({"samples": 0}, "--len must be positive"),
    ({"step_frames": 0}, "--step-frames must be at least 1"),
    ({"in_graph_codebooks": 0}, "--codebooks must be between 1 and 4"),
    ({"in_graph_codebooks": 5}, "--codebooks must be between 1 and 4"),
])
def test_bad_arguments_are_refused(tmp_path, tiny_mimi, args, match):
    out = tmp_path / "out"
    with pytest.raises(ExportError, match=match):
        _export(tiny_mimi, out, **args)
    assert not out.exists()


@pytest.mark.parametrize("victim, match", [
    ("encoder_step", r"encoder_step: \d+ of \d+ codes differ from torch"),
    ("decoder_step", r"decoder_step: max abs error .* exceeds 0.0001"),
])
def test_failed_validation_writes_nothing(tmp_path, tiny_mimi, monkeypatch, victim, match):
    """The last graphs are validated after the others passed; still no file may be written."""
    real = export_mod.validate

    def corrupt(spec, serialized, *args, **kw):
        if spec.name == victim:
            onnx_model = onnx.load_from_string(serialized)
            for init in onnx_model.graph.initializer:  # scale the first conv weight
                if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 3:
                    arr = onnx.numpy_helper.to_array(init) * 3
                    init.CopyFrom(onnx.numpy_helper.from_array(arr.astype(np.float32), init.name))
                    break
            else:
                raise AssertionError(f"{victim} has no conv weight to corrupt")
            serialized = onnx_model.SerializeToString()
        return real(spec, serialized, *args, **kw)

    monkeypatch.setattr(export_mod, "validate", corrupt)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValidationError, match=match):
        _export(tiny_mimi, out)
    assert list(out.iterdir()) == []  # no graph, no rvq.npz, no manifest, no .part file
    # The shared model is handed back without streaming state attached.
    assert all(m.stream is None for side in ("encoder", "decoder") for m in tiny_mimi.stateful(side))


def test_zero_tolerance_fails_the_decoder(tmp_path, tiny_mimi, monkeypatch):
    """Tolerance comes from the module constant: at 0 the float decoder cannot pass."""
    monkeypatch.setattr(export_mod, "AUDIO_ATOL", 0.0)
    out = tmp_path / "out"
    with pytest.raises(ValidationError, match=r"decoder: max abs error .* exceeds 0$"):
        _export(tiny_mimi, out)
    assert not out.exists() or list(out.iterdir()) == []


def _torch_steps(model, x, side, frames_per_step):
    """Chain torch streaming steps from the zero state (the reference for step graphs)."""
    state, out = model.zero_state(side), []
    size = model.cfg.frame_size if side == "encoder" else 1
    with torch.no_grad():
        for i in range(0, x.shape[-1], frames_per_step * size):
            with model.streaming(state, side):
                chunk = x[..., i:i + frames_per_step * size]
                out.append(model.encode(chunk) if side == "encoder" else model.decode(chunk))
            state.inputs, state.outputs = state.outputs, {}
            state.offset = state.offset + frames_per_step * model.cfg.downsample_stride
    return torch.cat(out, -1)


def test_moshi_stream_window(tmp_path):
    """attention="moshi-stream" step graphs follow moshi's ring cache: equal to the whole clip for
    the first `context` positions, then differing from it, and equal to torch's ring steps.

    A context of 8 rather than 250 makes one dropped key a visible change in the audio."""
    from dataclasses import replace

    from codecport.codecs.mimi.runtime import MimiCodec

    tiny_mimi = init_random(MimiModel(replace(PRESETS["tiny"], context=8)), seed=2).eval()
    export_mimi(tiny_mimi, tmp_path, None, 1, preset="tiny", weights="w", weights_sha256="none",
                attention="moshi-stream")
    meta = {p.key: p.value for p in onnx.load(tmp_path / "encoder_step.onnx").metadata_props}
    assert meta["attention"] == "moshi-stream"
    cfg = tiny_mimi.cfg
    x = torch.from_numpy((0.3 * np.random.default_rng(5).standard_normal((1, 1, 40 * cfg.frame_size)))
                         .astype(np.float32))
    codes = MimiCodec(tmp_path).encode(x[0].numpy(), cfg.sample_rate, cfg.n_codebooks, mode="step").data
    with torch.no_grad():
        whole = tiny_mimi.encode(x).numpy()
    tiny_mimi.set_moshi_ring(True)
    try:
        ring = _torch_steps(tiny_mimi, x, "encoder", 1).numpy()
    finally:
        tiny_mimi.set_moshi_ring(False)
    np.testing.assert_array_equal(codes, ring)
    # A dropped key moves the latent only slightly; the decoder's audio shows it.
    audio, _ = MimiCodec(tmp_path).decode(whole, mode="step")
    with torch.no_grad():
        want = tiny_mimi.decode(torch.from_numpy(whole)).numpy()[0]
        tiny_mimi.set_moshi_ring(True)
        try:
            ring_audio = _torch_steps(tiny_mimi, torch.from_numpy(whole), "decoder", 1).numpy()[0]
        finally:
            tiny_mimi.set_moshi_ring(False)
    np.testing.assert_allclose(audio, ring_audio, atol=1e-4)
    edge = cfg.context // cfg.downsample_stride * cfg.frame_size  # samples before a key is dropped
    np.testing.assert_allclose(audio[:, :edge], want[:, :edge], atol=1e-5)
    assert np.abs(audio[:, edge:] - want[:, edge:]).max() > 1e-3, "the ring window made no difference"


def test_rustymimi_window(tmp_path):
    """attention="rustymimi": both pairs attend to `context + 1` positions (candle's mask), the
    steps equal the fixed graphs, and the model is handed back with its own context.

    A context of 8 rather than 250 makes the extra key show within a short clip."""
    from dataclasses import replace

    from codecport.codecs.mimi.runtime import MimiCodec

    cfg = replace(PRESETS["tiny"], context=8)
    model = init_random(MimiModel(cfg), seed=2).eval()
    frames = 40
    export_mimi(model, tmp_path, frames * cfg.frame_size, 1, preset="tiny", weights="w",
                weights_sha256="none", attention="rustymimi")
    for name in ("encoder", "encoder_step"):
        meta = {p.key: p.value for p in onnx.load(tmp_path / f"{name}.onnx").metadata_props}
        assert (meta["attention"], meta["context"]) == ("rustymimi", "9")
    step = onnx.load(tmp_path / "encoder_step.onnx").graph.input
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in step}
    assert {s[3] for n, s in shapes.items() if "attn" in n} == {9}
    assert {s[3] for n, s in model.state_shapes("encoder").items() if "attn" in n} == {8}
    x = (0.3 * np.random.default_rng(5).standard_normal((1, frames * cfg.frame_size))).astype(np.float32)
    codec = MimiCodec(tmp_path)
    fixed = codec.encode(x, cfg.sample_rate, cfg.n_codebooks).data
    np.testing.assert_array_equal(codec.encode(x, cfg.sample_rate, cfg.n_codebooks, mode="step").data, fixed)
    wider = MimiModel(replace(cfg, context=9)).eval()
    wider.load_state_dict(model.state_dict())
    with torch.no_grad():
        np.testing.assert_array_equal(fixed[0], wider.encode(torch.from_numpy(x)[None]).numpy()[0])
        assert not np.array_equal(fixed[0], model.encode(torch.from_numpy(x)[None]).numpy()[0])


def test_unknown_attention_is_refused(tmp_path, tiny_mimi):
    with pytest.raises(ExportError, match="--attention must be one of"):
        export_mimi(tiny_mimi, tmp_path / "out", None, 1, preset="tiny", weights="w",
                    weights_sha256="none", attention="ring")
    assert not (tmp_path / "out").exists()
