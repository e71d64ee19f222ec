"""Export: every preset and several tiny lengths, static checks, metadata, refusal to write bad graphs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from cli_support import invoke

from codecport.codecs.dac import export as export_mod
from codecport.codecs.dac.export import export_dac
from codecport.codecs.dac.model import DAC, PRESETS
from codecport.errors import CodecportError, ExportError, ValidationError

GRAPHS = ["encoder", "decoder", "encoder_chunked", "decoder_chunked"]


def _assert_portable(path):
    model = onnx.load(path)
    ops = {n.op_type for n in model.graph.node}
    assert "ConvTranspose" not in ops and "Conv" in ops
    for node in model.graph.node:
        if node.op_type == "Conv":
            pads = [list(a.ints) for a in node.attribute if a.name == "pads"]
            assert not pads or not any(pads[0]), node.name
    inferred = onnx.shape_inference.infer_shapes(model)
    for vi in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]:
        assert all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim), vi.name
    return {p.key: p.value for p in model.metadata_props}


def test_16khz_has_the_24khz_graphs():
    """The 16 kHz preset's encoder and decoder are the 24 kHz preset's, layer for layer: only the
    rate and the codebook count (numpy's, outside the graphs) differ."""
    shapes = lambda m: {k: v.shape for k, v in m.state_dict().items() if not k.startswith("quantizer.")}
    a, b = DAC(PRESETS["16khz"]), DAC(PRESETS["24khz"])
    assert shapes(a) == shapes(b) and a.cfg.hop_length == b.cfg.hop_length
    assert (a.cfg.sample_rate, a.cfg.n_codebooks) != (b.cfg.sample_rate, b.cfg.n_codebooks)


def test_16kbps_has_the_44khz_graphs_but_the_latent_width():
    """The 44khz-16kbps preset is the 44 kHz one with a 128-wide latent (the encoder's last conv,
    the decoder's first) and 18 codebooks (numpy's, outside the graphs): nothing the export does
    depends on either. No full-size DAC export runs in the suite (a minute and a half of CPU each):
    the code path is the tiny preset's (strides 2 and 3, every test here), the presets' layers are
    compared above, and `scripts/check_official_dac.py --preset 44khz`, `codec-bench dac` and the
    demo (24 kHz) export the released sizes."""
    shapes = lambda m: {k: v.shape for k, v in m.state_dict().items() if not k.startswith("quantizer.")}
    a, b = shapes(DAC(PRESETS["44khz-16kbps"])), shapes(DAC(PRESETS["44khz"]))
    assert a.keys() == b.keys()
    assert sorted(k for k in a if a[k] != b[k]) == ["decoder.model.0.weight", "encoder.block.6.bias",
                                                    "encoder.block.6.weight"]
    assert (PRESETS["44khz-16kbps"].latent_dim, PRESETS["44khz-16kbps"].n_codebooks) == (128, 18)


@pytest.mark.parametrize("length", [6, 601, 1200, 4096])
def test_tiny_lengths(tmp_path, tiny_dac, length):
    report = export_dac(tiny_dac, tmp_path, length, 2400, preset="tiny", weights="random",
                        weights_sha256="none")
    geo = report["geometry"]
    assert geo["frames"] == -(-length // 6)
    for name in GRAPHS:
        meta = _assert_portable(tmp_path / f"{name}.onnx")
        assert meta["role"] == name.split("_")[0]
        assert meta["mode"] == ("chunked" if "chunked" in name else "fixed")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["geometry"] == geo and manifest["quantizer"] == "numpy"
    with np.load(tmp_path / "rvq.npz", allow_pickle=False) as z:
        assert z["codebook"].shape == (4, 64, 4)


def test_in_graph_quantizer(tmp_path, tiny_dac):
    export_dac(tiny_dac, tmp_path, 600, 2400, preset="tiny", weights="random",
               weights_sha256="none", in_graph_codebooks=3)
    assert not (tmp_path / "rvq.npz").exists()
    enc = onnx.load(tmp_path / "encoder.onnx")
    dec = onnx.load(tmp_path / "decoder.onnx")
    assert "ArgMax" in {n.op_type for n in enc.graph.node}
    assert "Gather" in {n.op_type for n in dec.graph.node}
    x = np.random.default_rng(3).standard_normal((1, 1, 600)).astype(np.float32) * 0.3
    codes = ort.InferenceSession(str(tmp_path / "encoder.onnx"),
                                 providers=["CPUExecutionProvider"]).run(None, {"audio": x})[0]
    with torch.no_grad():
        want = tiny_dac.encode(torch.from_numpy(x), 3).numpy()
    np.testing.assert_array_equal(codes, want)
    audio = ort.InferenceSession(str(tmp_path / "decoder.onnx"),
                                 providers=["CPUExecutionProvider"]).run(None, {"codes": codes})[0]
    with torch.no_grad():
        assert np.abs(audio - tiny_dac.decode(torch.from_numpy(codes)).numpy()).max() <= 1e-4


def test_failed_validation_writes_nothing(tmp_path, tiny_dac, monkeypatch):
    """A graph that disagrees with torch raises with the numbers, and no file is left."""
    real = export_mod.validate

    def corrupt(spec, serialized, dac, rvq, seed=1):
        if spec.name == "decoder_chunked":
            model = onnx.load_from_string(serialized)
            for init in model.graph.initializer:  # scale one weight: the audio must move
                if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 3:
                    arr = onnx.numpy_helper.to_array(init) * 3
                    init.CopyFrom(onnx.numpy_helper.from_array(arr.astype(np.float32), init.name))
                    break
            serialized = model.SerializeToString()
        return real(spec, serialized, dac, rvq, seed)

    monkeypatch.setattr(export_mod, "validate", corrupt)
    out = tmp_path / "out"
    with pytest.raises(ValidationError, match=r"decoder_chunked: max abs error .* exceeds 0.0001"):
        export_dac(tiny_dac, out, 600, 2400, preset="tiny", weights="random", weights_sha256="none")
    assert not out.exists() or not any(out.iterdir())
    assert tiny_dac.padding  # the shared model is handed back in its official padding mode


def test_window_shorter_than_receptive_field_is_refused(tmp_path, tiny_dac):
    with pytest.raises(ExportError, match="--chunk-len"):
        export_dac(tiny_dac, tmp_path, 600, 60, preset="tiny", weights="random",
                   weights_sha256="none")


def test_a_short_chunk_len_is_refused_before_the_released_weights_are_fetched(monkeypatch, tmp_path):
    """A preset's (or a release's) config is known before its weights: `--chunk-len` is checked
    against it first, not after hundreds of megabytes are downloaded. A checkpoint brings its own
    config, so there the check waits for it."""
    from codecport import registry

    fetched = []

    def load(*args, **kwargs):
        fetched.append(args)
        raise CodecportError("no download in this test")

    monkeypatch.setattr(registry.get("dac").module("weights"), "load", load)
    for args in (("--preset", "24khz"), ("--weights", "16khz"), ("--random-init",)):
        proc = invoke("codec-export", "dac", *args, "--len", "48000", "--chunk-len", "4000",
                      "-o", tmp_path / "no")
        assert proc.returncode == 1 and "receptive field" in proc.stderr and not fetched, (args, proc.stderr)
    assert not (tmp_path / "no").exists()
    # A window past the receptive field goes on to the weights; a file's config is read from it.
    for args in (("--preset", "24khz", "--chunk-len", "96000"), ("--weights", str(tmp_path / "w.pth"))):
        proc = invoke("codec-export", "dac", *args, "--len", "48000", "-o", tmp_path / "no")
        assert proc.returncode == 1 and "no download in this test" in proc.stderr, proc.stderr
    assert len(fetched) == 2
