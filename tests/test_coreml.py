"""CoreML .mlpackage conversion: the saved spec is inspected (prediction needs macOS, not run here).

coremltools is imported plainly: CI installs the `coreml` extra, and a missing converter must fail
these tests rather than skip them.
"""

from __future__ import annotations

import sys

import coremltools as ct
import pytest
import torch
from coremltools.proto import MIL_pb2
from shared_exports import MIMI_TINY_STEP, TINY_CHUNK, TINY_LEN

from codecport import __version__
from codecport.codecs.dac import export as dac_export
from codecport.codecs.mimi import export as mimi_export
from codecport.errors import ExportError, ModelFileError
from codecport.export.coreml import NOT_RUN, inspect_mlpackage, to_mlpackage
from codecport.export.graph import GraphSpec, Tensor

META = {"codec": "test", "export_id": "abc123"}


def _io(tensors) -> dict:
    return {t.name: list(t.shape) for t in tensors}


def _shapes(features: dict) -> dict:
    return {name: f["shape"] for name, f in features.items()}


def _op_dtypes(path, op_type: str) -> set[str]:
    """Output dtypes of every `op_type` op in the package's main function."""
    spec = ct.utils.load_spec(str(path))
    main = spec.mlProgram.functions["main"]
    return {MIL_pb2.DataType.Name(op.outputs[0].type.tensorType.dataType)
            for op in main.block_specializations[main.opset].operations if op.type == op_type}


def _dac_spec(dac, name: str, codebooks: int | None = None) -> GraphSpec:
    specs = dac_export.graph_specs(dac, dac_export.Geometry.of(dac.cfg, TINY_LEN, TINY_CHUNK), META,
                                   codebooks)
    return next(s for s in specs if s.name == name)


def test_dac_decoder_fp32_then_fp16_replaces_it(tiny_dac, tmp_path):
    spec = _dac_spec(tiny_dac, "decoder_chunked")
    path = tmp_path / "decoder_chunked.mlpackage"
    r32 = to_mlpackage(spec, path, "fp32")
    # The chunked wrapper turns the padding off inside forward; conversion hands the model back.
    assert all(m.use_padding for m in tiny_dac.modules() if hasattr(m, "use_padding"))
    assert not tiny_dac.training

    assert list(r32["inputs"]) == [t.name for t in spec.inputs]
    assert list(r32["outputs"]) == [t.name for t in spec.outputs]
    assert _shapes(r32["inputs"]) == _io(spec.inputs)
    assert _shapes(r32["outputs"]) == _io(spec.outputs)
    assert {f["dtype"] for f in [*r32["inputs"].values(), *r32["outputs"].values()]} == {"float32"}
    assert {"conv", "sin", "reshape"} <= set(r32["ops"])  # convs, Snake, polyphase interleave
    assert r32["ops"]["conv"] >= 10
    assert not any("conv_transpose" in op or "gather" in op for op in r32["ops"])
    assert r32["precision"] == "fp32" and set(r32["weights"]) == {"float32"}
    assert r32["metadata"]["export_id"] == "abc123" and r32["metadata"]["role"] == "decoder"
    assert r32["metadata"]["codecport_version"] == __version__
    assert r32["metadata"]["precision"] == "fp32"
    assert r32["converter"]["source_dialect"].startswith("TorchExport")
    assert r32["predicted"] is False and r32["not_run"]
    if sys.platform != "darwin":
        assert r32["not_run"] == NOT_RUN

    r16 = to_mlpackage(spec, path, "fp16")  # over the fp32 package: replaced whole
    assert [p.name for p in tmp_path.iterdir()] == ["decoder_chunked.mlpackage"]  # no temp left
    assert inspect_mlpackage(path) == r16
    assert r16["precision"] == "fp16" and set(r16["weights"]) == {"float16"}
    assert _op_dtypes(path, "conv") == {"FLOAT16"} and _op_dtypes(path, "sin") == {"FLOAT16"}
    assert r16["ops"]["cast"] == 2  # fp32 audio in, fp32 audio out
    assert r16["inputs"] == r32["inputs"] and r16["outputs"] == r32["outputs"]
    assert r16["metadata"]["precision"] == "fp16"


def test_mimi_step_graph_with_state(tiny_mimi, tmp_path):
    cfg = tiny_mimi.cfg
    geo = mimi_export.Geometry(None, None, MIMI_TINY_STEP, cfg.frame_size)
    spec = next(s for s in mimi_export.graph_specs(tiny_mimi, geo, META) if s.name == "encoder_step")
    path = tmp_path / "encoder_step.mlpackage"
    r = to_mlpackage(spec, path, "fp16")

    assert list(r["inputs"]) == [t.name for t in spec.inputs]
    assert list(r["outputs"]) == [t.name for t in spec.outputs]
    assert _shapes(r["inputs"]) == _io(spec.inputs)
    assert _shapes(r["outputs"]) == _io(spec.outputs)
    assert len(spec.inputs) > 3  # audio, offset and the conv and attention states
    # CoreML I/O has no int64: the offset is int32 both ways, everything else float32.
    assert r["inputs"]["offset_in"]["dtype"] == r["outputs"]["offset_out"]["dtype"] == "int32"
    assert {f["dtype"] for n, f in r["inputs"].items() if n != "offset_in"} == {"float32"}
    assert {"conv", "linear", "matmul", "softmax", "layer_norm", "clip"} <= set(r["ops"])
    assert not any("conv_transpose" in op for op in r["ops"])

    # fp16 compute, except the position arithmetic from the integer offset (RoPE, mask).
    assert r["precision"] == "fp16"
    assert _op_dtypes(path, "conv") == _op_dtypes(path, "linear") == {"FLOAT16"}
    assert _op_dtypes(path, "sin") == _op_dtypes(path, "cos") == {"FLOAT32"}
    assert _op_dtypes(path, "clip") == {"FLOAT32"}
    assert r["weights"]["float16"] > 10 * r["weights"].get("float32", 0)
    assert r["metadata"]["mode"] == "step" and r["metadata"]["states"] == ",".join(
        tiny_mimi.state_shapes("encoder"))


def test_in_graph_codes_decoder_fp16(tiny_dac, tmp_path):
    """Codes in: the codebook lookup is a table row, so what follows it still runs in fp16."""
    spec = _dac_spec(tiny_dac, "decoder", codebooks=2)
    path = tmp_path / "decoder.mlpackage"
    r = to_mlpackage(spec, path, "fp16")
    assert r["inputs"] == {"codes": {"shape": [1, 2, spec.inputs[0].shape[-1]], "dtype": "int32"}}
    assert _shapes(r["outputs"]) == _io(spec.outputs)
    assert "gather" in r["ops"] and r["precision"] == "fp16"
    assert _op_dtypes(path, "conv") == {"FLOAT16"}


class _Broken(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("no")


def test_failed_conversion_keeps_the_old_package(tiny_dac, tmp_path):
    path = tmp_path / "g.mlpackage"
    path.mkdir()
    (path / "Manifest.json").write_text("{}")
    spec = GraphSpec("g", _Broken(), [Tensor("x", (1, 4), "float32")], [Tensor("y", (1, 4), "float32")])
    with pytest.raises(ExportError, match="^g: torch.export could not capture"):
        to_mlpackage(spec, path)
    assert [p.name for p in path.iterdir()] == ["Manifest.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["g.mlpackage"]
    with pytest.raises(ModelFileError, match="unreadable"):
        inspect_mlpackage(path)
    with pytest.raises(ExportError, match=".mlpackage"):
        to_mlpackage(spec, tmp_path / "g.mlmodel")
    with pytest.raises(ExportError, match="precision"):
        to_mlpackage(spec, path, "int8")


def test_missing_coremltools_says_what_to_install(monkeypatch, tmp_path, tiny_dac):
    monkeypatch.setitem(sys.modules, "coremltools", None)  # import raises ImportError
    with pytest.raises(ExportError, match=r"pip install 'codecport\[coreml\]'"):
        to_mlpackage(_dac_spec(tiny_dac, "decoder"), tmp_path / "d.mlpackage")
    assert not list(tmp_path.iterdir())


def test_snac_decoder_with_its_mask_and_noise_inputs(tiny_snac, tmp_path):
    """SNAC's decoder, whose mask and per-block noise are inputs beside the latent: every input
    kept by name and shape, attention and Snake inside, no transposed conv."""
    from shared_exports import SNAC_TINY_LEN

    from codecport.codecs.snac import export as snac_export
    geo = snac_export.Geometry.of(tiny_snac, SNAC_TINY_LEN, 1)
    spec = next(s for s in snac_export.graph_specs(tiny_snac, geo, META) if s.name == "decoder")
    r = to_mlpackage(spec, tmp_path / "decoder.mlpackage", "fp32")
    assert list(r["inputs"]) == ["latent", "mask", "noise_0", "noise_1"]
    assert _shapes(r["inputs"]) == _io(spec.inputs) and _shapes(r["outputs"]) == _io(spec.outputs)
    assert {"conv", "sin", "softmax", "layer_norm", "tile"} <= set(r["ops"])
    assert not any("conv_transpose" in op for op in r["ops"])
    assert r["metadata"]["margin"] == str(geo.decoder_margin)
