"""Qwen3-TTS tokenizer's graphs: static, portable (no ConvTranspose, no Conv pads, every shape
static), their metadata what the runtime reads, and the exporter's refusals."""

from __future__ import annotations

import json

import onnx
import pytest
from cli_support import invoke
from shared_exports import cli_output, qwen3tts_slots

GRAPHS = {"encoder", "decoder", "decoder_step", "decoder_slots", "decoder_slots_s1", "decoder_slots_s2"}


def _ops_and_meta(path):
    model = onnx.load(path)
    ops = {n.op_type for n in model.graph.node}
    for node in model.graph.node:
        if node.op_type == "Conv":
            pads = [list(a.ints) for a in node.attribute if a.name == "pads"]
            assert not pads or not any(pads[0]), (path.name, node.name)
    inferred = onnx.shape_inference.infer_shapes(model)
    for vi in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]:
        assert all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim), (path.name, vi.name)
    return ops, {p.key: p.value for p in model.metadata_props}


@pytest.fixture(scope="module")
def slotted(tmp_path_factory):
    out = qwen3tts_slots(tmp_path_factory)
    return out, cli_output(out)


def test_every_graph_is_static_and_portable(slotted):
    out, r = slotted
    names = {p.stem for p in out.glob("*.onnx")}
    assert names == GRAPHS
    for name in names:
        ops, meta = _ops_and_meta(out / f"{name}.onnx")
        assert "ConvTranspose" not in ops and "Conv" in ops, name
        assert meta["codec"] == "qwen3tts" and meta["quantizer"] == "graph" and meta["n_codebooks"] == "4"
    _, enc = _ops_and_meta(out / "encoder.onnx")
    assert enc["samples"] == "240" and enc["frames"] == "10"
    assert "ArgMin" in _ops_and_meta(out / "encoder.onnx")[0]  # the quantizer in the graph
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["geometry"]["slots"] == 4 and manifest["window"] == "8"
    assert "the step for 2, 4 independent streams a call" in r.stdout


def test_a_length_off_the_frame_is_rounded_up_and_said(tmp_path):
    r = invoke("codec-export", "qwen3tts", "--preset", "tiny", "--len", "250", "--random-init",
               "-o", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    assert "not a multiple of the 24-sample frame: the graphs hold 264 samples" in r.stderr
    assert "a clip of up to 264 samples" in r.stdout


def test_the_smoke_export_says_what_it_holds(smoke_exports):
    r = cli_output(smoke_exports["qwen3tts"])
    assert "a clip of up to 480 samples at 24 kHz (0.02 s) <-> 20 frames in one call" in r.stdout
    assert "exactly the whole clip's audio" in r.stdout


@pytest.mark.parametrize("args, match", [
    (["--batch", "2"], "no batched encoder"),
    (["--in-graph-quantizer", "--codebooks", "2"], "always in Qwen3-TTS's graphs"),
    (["--slots", "1"], "--slots"),
])
def test_refusals(tmp_path, args, match):
    r = invoke("codec-export", "qwen3tts", "--preset", "tiny", "--len", "48", "--random-init", *args,
               "-o", tmp_path / "o")
    assert r.returncode != 0 and match in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_len_is_needed_before_any_weights(tmp_path):
    r = invoke("codec-export", "qwen3tts", "--preset", "tiny", "--random-init", "-o", tmp_path / "o")
    assert r.returncode != 0 and "pass --len N" in r.stderr and "multiple of 1920" in r.stderr


def test_export_validates_the_slot_graphs_against_torch(slotted):
    out, r = slotted
    for name in ("decoder_slots", "decoder_slots_s2", "decoder_step"):
        line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith(f"{name}.onnx"))
        err = float(line.rsplit("=", 1)[1])
        assert err < 1e-4, line
