"""SNAC export: static, portable graphs validated against torch, the receptive field in the
metadata, what is refused, precision variants with their measured deviation, and EP verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import invoke
from shared_exports import SNAC_TINY_LEN
from support import noise

import codecport
from codecport.codecs.snac.model import PRESETS

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_graphs_are_static_plain_convs_with_the_receptive_field_in_the_metadata(tiny_snac_export):
    manifest = json.loads((tiny_snac_export / "manifest.json").read_text())
    assert set(manifest["files"]) == {"encoder", "decoder", "decoder_step", "decoder_slots",
                                      "decoder_slots_s2", "rvq", "manifest"}
    enc_margin, dec_margin = PRESETS["tiny"].margins()
    for name in ("encoder", "decoder", "decoder_step", "decoder_slots", "decoder_slots_s2"):
        model = onnx.load(str(tiny_snac_export / f"{name}.onnx"))
        ops = {n.op_type for n in model.graph.node}
        assert "ConvTranspose" not in ops and "Pad" not in ops and "Conv" in ops
        for node in model.graph.node:
            if node.op_type == "Conv":
                pads = [a for a in node.attribute if a.name == "pads"]
                assert not pads or not any(onnx.helper.get_attribute_value(pads[0]))
        for value in [*model.graph.input, *model.graph.output]:
            assert all(d.HasField("dim_value") for d in value.type.tensor_type.shape.dim)
        meta = {p.key: p.value for p in model.metadata_props}
        if name in ("encoder", "decoder"):
            assert int(meta["margin"]) == (enc_margin if name == "encoder" else dec_margin)
        else:  # a step: its audio runs the decoder's right context behind, 149 samples for tiny
            assert int(meta["delay"]) == 149 and meta["states"] and meta["slots"] in ("1", "2", "3")
        assert meta["vq_strides"] == "4,2,1" and meta["unit_frames"] == "4"
    inputs = [i.name for i in onnx.load(str(tiny_snac_export / "decoder.onnx")).graph.input]
    assert inputs == ["latent", "mask", "noise_0", "noise_1"]  # the noise is an input
    geo = manifest["geometry"]
    assert geo["frames"] * 6 == geo["samples"] >= SNAC_TINY_LEN
    assert geo["step_frames"] == 4 and geo["step_delay"] == 149 and geo["slots"] == 3
    assert manifest["validation"]["encoder"] == {"codes_identical": 1.0}
    assert manifest["validation"]["decoder"]["audio_max_abs_err"] <= 1e-4


def _export(*args):
    """`codec-export snac --preset tiny --random-init ARGS` in this process (cli_support.py: what
    is checked is the command's contract; the smoke export, shared_exports.py, runs the console
    script)."""
    return invoke("codec-export", "snac", "--preset", "tiny", "--random-init", *args)


@pytest.mark.parametrize("args, match", [
    (["--len", "100"], "too short for windows that keep their receptive field: pass at least 360 samples"),
    (["--len", "720", "--in-graph-quantizer"], "quantizer runs in numpy"),
    (["--len", "720", "--batch", "4", "--precision", "int8"], "--batch writes fp32 graphs"),
    (["--len", "720", "--stream-frames", "0"], "0 is not in the range"),
    ([], "pass --len N"),
])
def test_what_cannot_be_exported_is_one_line(tmp_path, args, match):
    proc = _export(*args, "-o", tmp_path / "out")
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr
    assert match in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_precision_variants_carry_their_measured_deviation(tmp_path, precision):
    out = tmp_path / precision
    proc = _export("--len", "720", "--precision", precision, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "deviation from fp32" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    dev = manifest["deviation"]
    assert set(dev) == {"encoder", "decoder", "decoder_step"}
    assert 0 <= dev["encoder"]["code_agreement_pct"] <= 100 and np.isfinite(dev["decoder"]["snr_db"])
    assert np.isfinite(dev["decoder_step"]["snr_db"])
    codec = codecport.load(out)
    codes = codec.encode(noise(2000), 16000)
    audio, _ = codec.decode(codes, noise="zero")
    assert audio.shape == (1, 2000) and np.isfinite(audio).all()
    if precision == "fp16":  # fp16 keeps most codes of a random model
        assert dev["encoder"]["code_agreement_pct"] > 50 and dev["decoder"]["snr_db"] > 20


def test_check_gives_every_graph_a_verdict(tiny_snac_export, tmp_path):
    proc = invoke("codec-export", "check", tiny_snac_export, "--json", tmp_path / "c.json")
    assert proc.returncode == 0, proc.stderr
    reports = {Path(r["file"]).stem: r for r in json.loads((tmp_path / "c.json").read_text())}
    assert set(reports) == {"encoder", "decoder", "decoder_step", "decoder_slots", "decoder_slots_s2"}
    for r in reports.values():
        assert r["eps"]["directml"]["full"], r["eps"]["directml"]  # no ConvTranspose, no Conv pads
        assert set(r["eps"]) >= {"coreml-mlprogram", "nnapi", "directml"}
