"""codec-export check: per-EP verdicts on our graphs, and on small graphs built to pass or fail."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_support import invoke
from onnx import TensorProto, helper, numpy_helper

from codecport.errors import ModelFileError
from codecport.export.check import MOBILE_EPS, check, check_graph

BIN = Path(sys.executable).parent
TWO_D_ONLY = "takes only 2-D Conv"


def _conv_graph(path: Path, kernel: tuple[int, ...], op: str = "Conv", pads: bool = False,
                dtype: int = TensorProto.FLOAT) -> Path:
    """One conv node with static shapes: 1-D or 2-D by `kernel`."""
    spatial = (16,) * len(kernel)
    w = np.ones((4, 4, *kernel), np.float32)
    attrs = {"pads": [1] * (2 * len(kernel))} if pads else {}
    out = tuple(s - k + 1 + (2 if pads else 0) for s, k in zip(spatial, kernel)) if op == "Conv" \
        else tuple(s + k - 1 for s, k in zip(spatial, kernel))
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "w"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", dtype, [1, 4, *spatial])],
        [helper.make_tensor_value_info("y", dtype, [1, 4, *out])],
        [numpy_helper.from_array(w.astype(np.float64) if dtype == TensorProto.DOUBLE else w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_two_d_conv_is_taken_whole_by_nnapi(tmp_path):
    r = check_graph(_conv_graph(tmp_path / "c2.onnx", (3, 1)))
    for ep in ("nnapi", "coreml-mlprogram", "directml"):
        assert r["eps"][ep]["full"], (ep, r["eps"][ep])


def test_a_graph_past_what_wasm32_loads_is_not_taken_by_the_browser(tmp_path, monkeypatch):
    """The size rule (measured: 1.77 GB failed to load in Chromium, 1.32 GB loaded), on a small
    graph with the line moved just under its size."""
    from codecport.export import web

    path = _conv_graph(tmp_path / "c.onnx", (3, 1))
    assert check_graph(path)["eps"]["wasm"]["full"]
    monkeypatch.setattr(web, "WASM_MAX_BYTES", onnx.load(str(path)).ByteSize() - 1)
    for ep in ("wasm", "webgpu"):  # WebGPU's session is made in the same wasm32 heap
        r = check_graph(path)["eps"][ep]
        assert not r["full"] and "1.77 GB graph failed" in str(r), r


def test_one_d_conv_is_refused_where_only_2d_is_taken(tmp_path):
    r = check_graph(_conv_graph(tmp_path / "c1.onnx", (3,)))
    for ep in ("nnapi", "coreml-neuralnetwork"):
        v = r["eps"][ep]
        assert not v["full"] and v["supported"] == 0 and TWO_D_ONLY in v["reasons"]["Conv"]
    assert r["eps"]["coreml-mlprogram"]["full"] and r["eps"]["directml"]["full"]


@pytest.mark.parametrize("case, reason", [
    ({"op": "ConvTranspose"}, "ConvTranspose"),
    ({"pads": True}, "Conv"),
    ({"dtype": TensorProto.DOUBLE}, "(dtype)"),
])
def test_directml_rules(tmp_path, case, reason):
    v = check_graph(_conv_graph(tmp_path / "g.onnx", (3,), **case))["eps"]["directml"]
    assert not v["full"] and reason in v["reasons"] and v["supported"] < v["nodes"]


def _assert_our_graphs(reports: list[dict]) -> None:
    assert reports
    for r in reports:
        assert r["opset"] == 17
        eps = r["eps"]
        assert set(eps) == {*MOBILE_EPS, "directml", "wasm", "webgpu"}
        assert eps["directml"]["full"], r["file"]  # no ConvTranspose, no Conv pads, fp32
        assert eps["wasm"]["full"], r["file"]
        # The default export's goal: CoreML ML Program takes every graph whole (padding as
        # Concat, no Constant nodes, no Gather/Expand/comparisons in the attention).
        assert eps["coreml-mlprogram"]["full"], (r["file"], eps["coreml-mlprogram"])
        for ep in ("nnapi", "coreml-neuralnetwork"):
            assert TWO_D_ONLY in eps[ep]["reasons"]["Conv"], (r["file"], ep)
        for v in eps.values():
            assert 0 <= v["supported"] <= v["nodes"] == r["nodes"]
            # A graph not taken whole always says why.
            assert v["full"] or v["reasons"], (r["file"], v)


def test_our_dac_graphs(tiny_export):
    _assert_our_graphs(check(tiny_export))


def test_our_mimi_graphs(tiny_mimi_export):
    reports = check(tiny_mimi_export)
    assert len(reports) == 10  # the fixed, step and slot pairs (3 streams a call, and its ladder's 1 and 2)
    _assert_our_graphs(reports)


def test_no_graph_here(tmp_path):
    with pytest.raises(ModelFileError, match="no .onnx"):
        check(tmp_path)
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    with pytest.raises(ModelFileError, match="not a readable ONNX model"):
        check(tmp_path)
    for junk in (b"", b"\x08\x07"):  # protobuf parses these as a model with no graph: passed as fine
        (tmp_path / "bad.onnx").write_bytes(junk)
        with pytest.raises(ModelFileError, match="no graph in it"):
            check(tmp_path / "bad.onnx")


def test_cli(tmp_path, tiny_mimi_export):
    out = tmp_path / "report.json"
    proc = invoke("codec-export", "check", tiny_mimi_export, "--json", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("directml") == 10 and "coreml-mlprogram" in proc.stdout and \
        "webgpu" in proc.stdout
    assert [Path(r["file"]).name for r in json.loads(out.read_text())] == \
        ["decoder.onnx", "decoder_slots.onnx", "decoder_slots_s1.onnx", "decoder_slots_s2.onnx",
         "decoder_step.onnx",
         "encoder.onnx", "encoder_slots.onnx", "encoder_slots_s1.onnx", "encoder_slots_s2.onnx",
         "encoder_step.onnx"]
    proc = invoke("codec-export", "check", tmp_path / "nope")
    assert proc.returncode == 1 and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr
