"""NeuCodec's graphs (export/neucodec.py, not a registered codec yet): validated against torch
as they are exported, plain static ops, one partition on the targets the project promises."""

from __future__ import annotations

import onnx
import pytest

from codecport.errors import ExportError
from codecport.export.check import check_graph
from codecport.export.neucodec import export_graphs
from codecport.models.neucodec import PRESETS, NeuCodec, init_random


@pytest.fixture(scope="module")
def graphs():
    return export_graphs(init_random(NeuCodec(PRESETS["tiny"]), seed=4), frames=20)


def test_graphs_are_validated_against_torch(graphs):
    models, validation = graphs
    assert set(models) == {"decoder", "encoder"}
    assert validation["decoder"]["audio_max_abs_err"] <= 1e-4
    assert validation["encoder"] == {"codes_identical": 1.0}
    dec = models["decoder"]
    assert [d.dim_value for d in dec.graph.output[0].type.tensor_type.shape.dim] == [1, 1, 20 * PRESETS["tiny"].hop]


def test_every_target_takes_them_whole(graphs, tmp_path):
    models, _ = graphs
    for name, model in models.items():
        ops = {n.op_type for n in model.graph.node}
        assert not ops & {"DFT", "STFT", "ConvTranspose", "Gather", "InstanceNormalization"}, (name, ops)
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, str(path))
        eps = check_graph(path)["eps"]
        for ep in ("coreml-mlprogram", "directml", "wasm", "webgpu"):
            assert eps[ep]["full"], (name, ep, eps[ep])


def test_too_short_is_refused():
    with pytest.raises(ExportError, match="at least 2 frames"):
        export_graphs(init_random(NeuCodec(PRESETS["tiny"]), seed=4), frames=1)
