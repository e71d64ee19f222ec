"""NeuCodec's graphs (codecs/neucodec/export.py) as `codec-export neucodec` writes them: validated against
torch as they are exported, plain static ops, one partition on the targets the project promises,
and a `--len` too short for two frames refused before any weights are read."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from cli_support import invoke

from codecport.codecs.neucodec.export import frames_of
from codecport.codecs.neucodec.model import PRESETS
from codecport.errors import ExportError
from codecport.export.check import check_graph

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_the_export_is_validated_and_described(smoke_exports):
    manifest = json.loads((smoke_exports["neucodec"] / "manifest.json").read_text())
    assert manifest["validation"]["decoder"]["audio_max_abs_err"] <= 1e-4
    assert manifest["validation"]["encoder"] == {"codes_identical": 1.0}
    geo = manifest["geometry"]
    assert (geo["frames"], geo["samples"], geo["input_samples"]) == (25, 25 * 160, 25 * 320)
    assert (manifest["sample_rate"], manifest["input_rate"], manifest["levels"]) == ("8000", "16000", "4,4,4")


def test_every_target_takes_them_whole(smoke_exports):
    for name in ("decoder", "encoder"):
        path = smoke_exports["neucodec"] / f"{name}.onnx"
        ops = {n.op_type for n in onnx.load(str(path)).graph.node}
        assert not ops & {"DFT", "STFT", "ConvTranspose", "Gather", "InstanceNormalization"}, (name, ops)
        eps = check_graph(path)["eps"]
        for ep in ("coreml-mlprogram", "directml", "wasm", "webgpu"):
            assert eps[ep]["full"], (name, ep, eps[ep])


def test_the_nnapi_build_runs_whole_on_nnapi(smoke_exports, tmp_path):
    """NNAPI has no ReduceSum, which the masked statistics use: the nnapi build spells it as
    ReduceMean times the count (export/rewrite.py), and both graphs run in one NNAPI partition,
    their results those of the fp32 folder (the build's lossless check)."""
    from codecport import registry
    from codecport.export.builds import Build, build_of_folder

    before = check_graph(smoke_exports["neucodec"] / "decoder.onnx")["eps"]["nnapi"]
    assert not before["full"] and "ReduceSum" in before["reasons"]
    report = build_of_folder(registry.get("neucodec"), smoke_exports["neucodec"], tmp_path / "n",
                             Build("nnapi"))
    assert report["deviation"]["encoder"]["code_agreement_pct"] == 100.0
    assert report["deviation"]["decoder"]["snr_db"] > 90
    for name in ("decoder", "encoder"):
        assert check_graph(tmp_path / "n" / f"{name}.onnx")["eps"]["nnapi"]["full"], name


def test_too_short_is_refused(tmp_path):
    with pytest.raises(ExportError, match="at least 2 frames"):
        frames_of(_Shell(), 160)  # one frame
    proc = invoke("codec-export", "neucodec", "--preset", "tiny", "--random-init", "--len", "100",
                  "-o", tmp_path / "out")
    assert proc.returncode == 1 and "at least 2 frames" in proc.stderr and not (tmp_path / "out").exists()


class _Shell:
    cfg = PRESETS["tiny"]


@pytest.mark.parametrize("codec", ["neucodec", "xcodec2"])
def test_len_gives_the_frames_of_a_clip_of_len_samples(codec):
    """`--len N` (samples at the output rate) gives graphs of the frames the official encode gives
    a clip of N samples, once at 16 kHz: `n // 320` for NeuCodec, `n // 320 + 1` where both paths
    have every padded frame (XCodec2, the distilled NeuCodec); on the frame exactly, and off it
    at most a frame more (the decoder's whole frames of N)."""
    from codecport import registry
    from codecport.runtime.audio import resampled_length

    for preset, cfg in registry.get(codec).presets.items():
        shell = type("Shell", (), {"cfg": cfg})
        for n in [*range(2 * cfg.hop, 6 * cfg.hop + 1), 500 * cfg.hop, 500 * cfg.hop + 1]:
            official = resampled_length(n, cfg.sample_rate, 16000) // 320 + 1 - cfg.acoustic_extra
            frames = frames_of(shell, n)
            assert frames == official if n % cfg.hop == 0 else official <= frames <= official + 1, \
                (preset, n, frames, official)


def test_the_bench_times_the_parts_it_names(smoke_exports):
    """codec-bench's split of a call's time between the torch modules (BenchFacts.parts): every
    node of the encoder but the few joining the paths belongs to one of them, the Linear layers'
    Gemm nodes (named after nothing but their weights) included."""
    from codecport import registry
    from codecport.bench.facts import facts_of
    from codecport.bench.measure import node_times

    parts = facts_of(registry.get("neucodec")).parts
    folder = smoke_exports["neucodec"]
    enc = node_times(folder / "encoder.onnx", {k: m for k, (g, m) in parts.items() if g == "encoder"}, runs=3)
    # The distilled variant's acoustic encoder is not in this model (test_neucodec_distill.py times it).
    assert enc.pop("the distilled acoustic encoder")["ms"] == 0
    assert all(p["ms"] > 0 for p in enc.values()) and 90 < sum(p["share_pct"] for p in enc.values()) <= 100.01
    dec = node_times(folder / "decoder.onnx", {"the ISTFT": "head.istft", "the backbone": "backbone"},
                     runs=3)
    assert 0 < dec["the ISTFT"]["share_pct"] < 100 and dec["the backbone"]["share_pct"] > 10


@pytest.fixture(scope="module")
def bucket_export(tmp_path_factory):
    """(`codec-export neucodec --preset tiny --random-init --len 4000 --buckets 1600`: the smoke
    export's graphs and a 10-frame pair beside them, what it printed, its int8 build)."""
    from codecport import registry
    from codecport.export.builds import Build, build_of_folder

    tmp = tmp_path_factory.mktemp("buckets")
    proc = invoke("codec-export", "neucodec", "--preset", "tiny", "--random-init", "--len", "4000",
                  "--buckets", "1600", "-o", tmp / "b")
    assert proc.returncode == 0, proc.stderr
    build_of_folder(registry.get("neucodec"), tmp / "b", tmp / "int8", Build("cpu", "int8"))
    return tmp / "b", proc, tmp / "int8"


def test_an_int8_build_carries_its_measured_deviation(bucket_export):
    """A build of an export folder (as codec-bench and codec-export make them): calibrated on the
    masked graphs through the runtime, its deviation from fp32 measured and written. (The folder
    is the bucketed export's below: its main pair is the smoke export's; one build serves both.)"""
    import codecport

    out = bucket_export[2]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "int8" and not (out / "rvq.npz").exists()
    dev = manifest["deviation"]
    assert 0 <= dev["encoder"]["code_agreement_pct"] <= 100 and dev["decoder"]["snr_db"] > 0
    codes = codecport.load(out).encode(np.zeros(4000, np.float32) + 0.1, 16000)
    assert codes.data.shape == (1, 1, 12)


def test_buckets_run_a_clip_through_the_shortest_graphs_that_hold_it(smoke_exports, bucket_export, tmp_path):
    """`--buckets`: shorter graphs beside the main pair, each validated; a clip runs through the
    shortest that holds it, with the codes and (to rounding) the audio of the main graphs; a build
    measures every bucket's deviation."""
    import codecport

    out, proc, int8 = bucket_export
    assert "buckets       : 10 frames (0.20 s)" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["geometry"]["buckets"] == [10]
    assert set(manifest["validation"]) == {"encoder", "decoder", "encoder_f10", "decoder_f10"}
    bucketed, main = codecport.load(out), codecport.load(smoke_exports["neucodec"])  # the same seeded weights
    assert bucketed.sizes == {"encoder": [10], "decoder": [10]} and main.sizes == {}
    rng = np.random.default_rng(1)
    for samples, graph in ((1000, "encoder_f10"), (3199, "encoder_f10"), (3200, "encoder")):
        x = (0.3 * rng.standard_normal((1, samples))).astype(np.float32)
        before = set(bucketed._graphs)
        codes = bucketed.encode(x, 16000)
        assert set(bucketed._graphs) - before <= {graph} and graph in bucketed._graphs, samples
        np.testing.assert_array_equal(codes.data, main.encode(x, 16000).data)
        np.testing.assert_allclose(bucketed.decode(codes.data)[0], main.decode(codes.data)[0], atol=1e-6)
    dev = json.loads((int8 / "manifest.json").read_text())["deviation"]
    assert set(dev) == set(manifest["validation"]) and all(d["snr_db"] > 0 for d in dev.values())
    for buckets, match in (("4000", "shorter than --len"), ("800,x", "separated by commas"),
                           ("0", "positive")):
        proc = invoke("codec-export", "neucodec", "--preset", "tiny", "--random-init", "--len", "4000",
                      "--buckets", buckets, "-o", tmp_path / "no")
        assert proc.returncode == 1 and match in proc.stderr and not (tmp_path / "no").exists(), proc.stderr


def test_buckets_are_refused_before_the_released_weights_are_fetched(monkeypatch, tmp_path):
    """What --buckets says on its own is checked before the weights load: a released model is
    gigabytes to fetch, then refused."""
    from codecport import registry

    fetched = []
    for name in ("neucodec", "xcodec2"):
        monkeypatch.setattr(registry.get(name).module("weights"), "load", lambda *a, **k: fetched.append(a))
        for buckets, match in (("4000", "shorter than --len"), ("800,x", "separated by commas")):
            proc = invoke("codec-export", name, "--len", "4000", "--buckets", buckets, "-o", tmp_path / "no")
            assert proc.returncode == 1 and match in proc.stderr and not fetched, (name, proc.stderr, fetched)
        assert not (tmp_path / "no").exists()


def test_batched_rows_are_checked_against_batch_1_masks_included():
    """The row-by-row check of a batched encoder (export/batch.py) passes a graph whose rows are
    independent, each under its own mask, and refuses one whose rows touch (a statistic over the
    batch), which a masked norm written over the wrong axis would be."""
    import torch

    from codecport.export.batch import batched, masked_rows, validate_batched
    from codecport.export.graph import GraphSpec, Tensor, to_onnx

    class Masked(torch.nn.Module):
        def __init__(self, axis: int):
            super().__init__()
            self.axis = axis

        def forward(self, audio, mask):
            x = audio[..., :8] * mask
            return x - (x.sum(self.axis, keepdim=True) / mask.sum(self.axis, keepdim=True)) * mask

    def check(axis: int) -> dict:
        spec = GraphSpec("encoder", Masked(axis), [Tensor("audio", (1, 1, 16), "float32"),
                                                   Tensor("mask", (1, 1, 8), "float32")],
                         [Tensor("y", (1, 1, 8), "float32")])
        bspec = batched(spec, 3)
        rows = masked_rows(bspec, lambda i, n: max(2, n - i * n // 6))  # as NeuCodec's export, at batch 3
        assert len({int(r["mask"].sum()) for r in rows}) == 3  # each row a clip of its own length
        codes = lambda y, row: np.round(y[..., :int(row["mask"].sum())] * 1e3).astype(np.int64)
        return validate_batched(bspec, to_onnx(bspec), to_onnx(spec), codes, rows)

    assert check(axis=-1)["rows_codes_identical"] == 1.0
    with pytest.raises(ExportError, match="encoder_b3 row"):
        check(axis=0)
