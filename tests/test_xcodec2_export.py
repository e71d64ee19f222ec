"""XCodec2's graphs (codecs/xcodec2/export.py, NeuCodec's exporter) as `codec-export xcodec2` writes
them: validated against torch, marked as XCodec2's with its alignment of the encoder paths, the
encoder taking the padded clip only (no acoustic frame past the codes), plain portable ops."""

from __future__ import annotations

import json

import onnx
import pytest
from cli_support import invoke
from shared_exports import cli_output

from codecport.export.check import check_graph
from codecport.runtime.graph import read_metadata


@pytest.fixture(scope="module")
def folder(smoke_exports):
    return smoke_exports["xcodec2"]


def test_the_export_is_validated_and_marked_as_xcodec2s(folder):
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["codec"] == "xcodec2" and manifest["preset"] == "tiny"
    assert manifest["validation"]["decoder"]["audio_max_abs_err"] <= 1e-4
    assert manifest["validation"]["encoder"] == {"codes_identical": 1.0}
    geo = manifest["geometry"]
    # --len 4000 at 8 kHz: a clip of 8000 samples at 16 kHz, 25 frames, and the official pad's 26th.
    assert (geo["frames"], geo["samples"], geo["input_samples"]) == (26, 26 * 160, 25 * 320)
    enc = onnx.load(str(folder / "encoder.onnx"))
    meta = {p.key: p.value for p in enc.metadata_props}
    assert (meta["codec"], meta["fbank_pad"], meta["acoustic_extra"]) == ("xcodec2", "160", "0")
    dims = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in enc.graph.input]
    assert dims == [[1, 1, 26 * 320], [1, 26, 160], [1, 1, 26]]
    out = cli_output(folder).stdout
    assert "26 frames (0.52 s) a call: a clip of up to 4000 samples at 8000 Hz (--len; 8000 at 16000 Hz in)" \
        in out, out


def test_every_target_takes_them_whole(folder):
    for name in ("decoder", "encoder"):
        path = folder / f"{name}.onnx"
        ops = {n.op_type for n in onnx.load(str(path)).graph.node}
        assert not ops & {"DFT", "STFT", "ConvTranspose", "Gather"}, (name, ops)
        eps = check_graph(path)["eps"]
        for ep in ("coreml-mlprogram", "directml", "wasm", "webgpu"):
            assert eps[ep]["full"], (name, ep, eps[ep])
    assert read_metadata(folder / "decoder.onnx")["sample_rate"] == "8000"


def test_too_short_and_a_quantized_batch_are_refused_with_xcodec2s_name(tmp_path):
    proc = invoke("codec-export", "xcodec2", "--preset", "tiny", "--random-init", "--len", "100",
                  "-o", tmp_path / "a")
    assert proc.returncode == 1 and "XCodec2 graphs need at least 2 frames" in proc.stderr
    proc = invoke("codec-export", "xcodec2", "--preset", "tiny", "--random-init", "--len", "4000",
                  "--batch", "2", "--precision", "int8", "-o", tmp_path / "b")
    assert proc.returncode == 1 and "--batch writes fp32 graphs" in proc.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
