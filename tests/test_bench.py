"""codec-bench runs end to end on the tiny configs and writes a complete report (not its speed).

The command runs in this process (click's runner) on bench folders exported once a run for every
test (shared_exports.py); each contender still runs in a process of its own, as it does for users.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from shared_exports import shared

BIN = Path(sys.executable).parent
QUICK = ("--peak-seconds", "0.05")  # the GEMM peak measured briefly: the report needs it, not its value
# audio a call on the tiny configs: the reports' structure does not depend on it, their cost does
SECONDS = 0.1

pytestmark = pytest.mark.bench


def bench(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`codec-bench ARGS` in this process: (exit code, stdout, stderr) as a process gives them."""
    from click.testing import CliRunner

    from codecport.bench.cli import main

    r = CliRunner().invoke(main, [str(a) for a in args], env=env)
    return subprocess.CompletedProcess(["codec-bench", *args], r.exit_code, r.stdout, r.stderr)


def bench_folder(tmp_path_factory, tmp_path: Path, codec: str, frames: int = 1) -> Path:
    """A copy of the bench's folder for `codec`'s tiny preset at SECONDS a call (exported once a
    run), which the bench reuses (`--dir`) and may add to (builds, memory files)."""
    from codecport import registry
    from codecport.bench.run import Options, ensure_model

    spec = registry.get(codec)
    src = shared(tmp_path_factory, f"bench-{codec}-tiny-{SECONDS:g}s-f{frames}",
                 lambda out: ensure_model(spec, Options("tiny", SECONDS, frames=frames), out))
    return Path(shutil.copytree(src, tmp_path / "bench"))


@pytest.mark.parametrize("codec", ["dac", "mimi"])
def test_bench_report_structure(tmp_path_factory, tmp_path, monkeypatch, codec):
    """Each codec's own parts (DAC's long audio and --memory, Mimi's streaming, --frames and
    --plot) and, on one of them each, the parts every codec shares (an int8 build and rounds
    taken in turn on Mimi; the torch contender, with DAC's long audio, and the memory runs on
    DAC): the same code with another codec. Mimi's torch model on the bench's weights is the
    official contender's in test_bench_official_contender_is_moshi_on_the_same_weights_and_config
    (its codes 100 % ours). Both list their official package as skipped, saying why, and go on:
    DAC's cannot share an environment with onnx, and this moshi is installed without its own
    dependencies."""
    out = tmp_path / "report.json"
    mimi = codec == "mimi"
    work = bench_folder(tmp_path_factory, tmp_path, codec, frames=2 if mimi else 1)
    env = None
    if mimi:
        env = _fake_moshi(tmp_path / "site", "raise ImportError(\"No module named 'sentencepiece'\")\n")
        monkeypatch.syspath_prepend(str(tmp_path / "site"))  # the bench looks for moshi in its own process
    own = (["--precision", "int8", "--frames", "2", "--rounds", "2", "--plot", str(tmp_path / "b.png")]
           if mimi else ["--contender", "torch", "--memory", "0.02"])
    proc = bench(codec, "--preset", "tiny", "--seconds", SECONDS, "--dir", work, *QUICK, "--runs", "1",
                 "--steps", "3", "--long", "3", "--contender", "rustymimi", "--contender", "official",
                 "--precision", "fp32", *own, "--json", str(out), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["gemm_peak"]["gflops"] > 0 and "onnxruntime" in report["gemm_peak"]["library"]
    assert report["flops"]["encode"] > 0 and report["flops"]["decode"] > 0
    ran = report["contenders"]
    int8, eager, rounds = mimi, not mimi, 2 if mimi else 1
    official, why_official = (("moshi",
                               "moshi is installed but does not import (No module named 'sentencepiece')")
                              if mimi else ("descript-audio-codec", "protobuf<3.20"))
    ours = ["onnx-cpu", *(["onnx-cpu-int8"] if int8 else []), *(["torch-eager"] if eager else [])]
    assert set(ran) == {*ours, "rustymimi", official}
    why = "released Mimi config only" if mimi else "not a contender for dac"
    assert why in ran["rustymimi"]["skipped"]
    assert why_official in ran[official]["skipped"]
    assert f"{official}  skipped: " in proc.stdout or f"{official:<16}skipped: " in proc.stdout
    if eager:  # contenders on the same weights report how many of their codes equal our fp32 graphs'
        eq = ran["torch-eager"]["codes_equal_pct"]
        assert eq["to"] == "onnx-cpu" and eq["frames"][0] == eq["frames"][1] and eq["pct"] >= 90
    assert not any("codes" in r for r in ran.values())
    if int8:
        dev = ran["onnx-cpu-int8"]["deviation"]
        assert 0 <= dev["encoder"]["code_agreement_pct"] <= 100 and "snr_db" in dev["decoder"]
        assert dev["decoder"]["size_bytes"] > 0
    # DAC also times long audio: 3 windows through the chunked graphs (Mimi has no such path).
    dirs = ["encode", "decode"] + (["encode-long", "decode-long"] if codec == "dac" else [])
    assert ("long" in report) == (codec == "dac")
    for name in ours:
        assert sorted(d for d in ran[name] if d.startswith(("encode", "decode"))) == sorted(dirs)
        for d in dirs:
            s = ran[name][d]
            assert 0 < s["rtf_min"] <= s["rtf_median"] <= s["rtf_max"]
            assert len(s["seconds"]) == rounds  # 1 run in each round, pooled
            assert len(s["round_rtf_medians"]) == rounds
            assert report["flops"][d] > 0
        assert ran[name]["peak_rss_mb"] > 0
    assert set(report["speedups"]) == {*(["onnx-cpu vs torch-eager"] if eager else []),
                                       *(["onnx-cpu-int8 vs onnx-cpu"] if int8 else [])}
    assert all(list(sp) == dirs for sp in report["speedups"].values())
    if codec == "dac":
        assert report["long"]["windows"] == 3 and report["long"]["seconds"] > 0
        assert ran["onnx-cpu"]["windows_at_once"] >= 1 and "3 windows" in proc.stdout
        # Long audio is several windows, so it costs more FLOPs than one fixed call of its graph.
        assert report["flops"]["decode-long"] > report["flops"]["decode"] / 2
    assert ("streaming" in ran["onnx-cpu"]) == mimi
    if mimi:
        p = ran["onnx-cpu"]["streaming"]["encode_step"]
        assert 0 < p["p50_ms"] <= p["p95_ms"] <= p["p99_ms"]
        # 3 steps in each of 2 rounds
        assert ran["onnx-cpu"]["streaming"]["steps"] == 6 and len(p["seconds"]) == 6
        assert len(p["round_p50_ms"]) == 2 and "p50 by round" in proc.stdout
        # Two frames a step: the step graphs were exported for it, and the cost per frame shown.
        assert ran["onnx-cpu"]["streaming"]["frames_per_step"] == 2
        assert ran["onnx-cpu"]["streaming"]["frame_ms"] == 1  # the tiny config: 24 samples at 24 kHz
        assert "2 × 1 ms frames a step" in proc.stdout and "per frame p50" in proc.stdout
        # --plot (matplotlib is in [bench])
        assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ("round 2 of 2" in proc.stdout) == (rounds == 2)
    if not int8:  # --memory: the real encode and decode commands, decode from the codec's own codes file
        mem = {m["direction"]: m for m in report["memory"]}
        assert set(mem) == {"encode", "decode"} and all(m["peak_rss_mb"] > 0 and m["minutes"] == 0.02
                                                        for m in mem.values())
        assert mem["decode"]["from"] == ".dac" and mem["decode"]["output_mb"] > 0
        assert "codec-run encode of 0.02 min of a 44.1 kHz stereo WAV: peak RSS" in proc.stdout
        assert "onnx-cpu vs torch-eager" in proc.stdout
    else:
        assert "onnx-cpu-int8 decoder deviation from fp32" in proc.stdout and \
            "onnx-cpu-int8 vs onnx-cpu" in proc.stdout
    assert "skipped" in proc.stdout


def test_bench_plot_without_matplotlib_fails_at_once(tmp_path, monkeypatch):
    """--plot without matplotlib fails before any work, in one line (a PNG is written in
    test_bench_report_structure[mimi])."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a))
    png, work = tmp_path / "b.png", tmp_path / "b"
    proc = bench("mimi", "--preset", "tiny", "--dir", work, "--plot", png)
    assert proc.returncode == 1 and proc.stderr.strip().startswith("error: --plot needs matplotlib")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not png.exists() and not work.exists()


def test_pool_summarises_the_rounds_together():
    from codecport.bench.measure import percentiles, pool, summary

    a = {"encode": summary([1.0, 3.0], 2.0),
         "streaming": {"steps": 2, "encode_step": percentiles([0.001, 0.002]),
                       "decode_step": percentiles([0.001, 0.001])},
         "peak_rss_mb": 10.0, "provider": "x"}
    b = {"encode": summary([2.5], 2.0), "streaming": {"steps": 1, "encode_step": percentiles([0.009]),
                                                     "decode_step": percentiles([0.001])},
         "peak_rss_mb": 30.0, "provider": "x"}
    p = pool([a, b])
    assert p["encode"]["seconds"] == [1.0, 3.0, 2.5] and p["encode"]["seconds_median"] == 2.5
    assert (p["encode"]["rtf_min"], p["encode"]["rtf_median"], p["encode"]["rtf_max"]) == (0.5, 1.25, 1.5)
    assert p["streaming"]["steps"] == 3 and p["streaming"]["encode_step"]["p50_ms"] == 2.0
    assert p["encode"]["round_rtf_medians"] == [1.0, 1.25]
    assert p["streaming"]["encode_step"]["round_p50_ms"] == [1.5, 9.0]
    assert p["peak_rss_mb"] == 30.0 and p["provider"] == "x"


@pytest.mark.slow
def test_bench_runs_rustymimi_on_the_released_config(tmp_path, released_mimi):
    """rustymimi builds the released config only: the bench runs on the released Mimi export the
    other tests share (2 s a call), its weights beside it as the bench keeps them."""
    from codecport import registry
    from codecport.bench.prepare import export_source_hash
    from codecport.codecs.mimi.model import PRESETS
    from codecport.version import __version__

    weights, model = released_mimi
    work = tmp_path / "bench"
    work.mkdir()
    (work / "model").symlink_to(model)  # read only: the bench writes beside it, never into it
    (work / "weights.safetensors").symlink_to(weights)
    (work / "config.json").write_text(json.dumps(PRESETS["mimi"].to_kwargs()))
    (work / "stamp.json").write_text(json.dumps({
        "codec": "mimi", "preset": "mimi", "seconds": 2.0, "codecport": __version__,
        "source": export_source_hash(), **({"frames": 1} if registry.get("mimi").has_step_graphs else {})}))
    out = tmp_path / "report.json"
    proc = bench("mimi", "--seconds", "2", "--dir", work, *QUICK, "--runs", "1", "--steps", "1",
                 "--contender", "rustymimi", "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exporting" not in proc.stdout  # the shared export, not a new one
    ran = json.loads(out.read_text())["contenders"]
    assert set(ran) == {"onnx-cpu", "rustymimi"}
    r = ran["rustymimi"]
    assert r["version"] and 0 < r["encode"]["rtf_median"] and 0 < r["decode"]["rtf_median"]
    assert r["streaming"]["steps"] == 1 and r["streaming"]["decode_step"]["p50_ms"] > 0
    assert r["codes_equal_pct"]["pct"] == 100 and r["codes_equal_pct"]["frames"] == [25, 25]
    sp = json.loads(out.read_text())["speedups"]["onnx-cpu vs rustymimi"]
    assert set(sp) == {"encode", "decode", "encode_step p95", "decode_step p95"}
    assert "rustymimi codes: 100.0% equal to onnx-cpu's" in proc.stdout
    assert "rustymimi streaming encode_step (1 × 80 ms frame a step, 1 steps)" in proc.stdout


@pytest.mark.parametrize("command", [["dac", "--preset", "tiny"], ["serve", "mimi", "--preset", "tiny"],
                                     ["web", "--codec", "dac", "--preset", "tiny"]])
def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, command):
    """It was written after the whole run (minutes), and then failed."""
    proc = bench(*command, "--json", tmp_path, "--dir", tmp_path / "b")
    assert proc.returncode == 1 and proc.stderr == f"error: --json {tmp_path} is a folder; pass a file name\n"
    assert not (tmp_path / "b").exists()


def test_bench_frames_is_for_mimi(tmp_path):
    from codecport import registry

    proc = bench("dac", "--preset", "tiny", "--frames", "2", "--dir", tmp_path / "b")
    stepped = ", ".join(s.name for s in registry.codecs() if s.has_step_graphs)
    assert "mimi" in stepped and "dac" not in stepped
    assert proc.returncode == 2 and f"--frames is for codecs with step graphs ({stepped})" in proc.stderr
    assert not (tmp_path / "b").exists()


def test_code_agreement_over_the_frames_both_have():
    from codecport.bench.report import code_agreement

    ours = [[[1, 2, 3, 4], [5, 6, 7, 8]]]
    contenders = {
        "onnx-cpu": {"codes": ours},
        "torch-eager": {"codes": [[[1, 2, 3, 9], [5, 6, 0, 8]]]},  # 2 of 8 differ
        "rustymimi": {"codes": [[[1, 2, 3], [5, 6, 7]]]},  # a frame short, the rest equal
        "onnx-cpu-int8": {"codes": ours, "deviation": {}},  # reports its deviation instead
        "transformers": {"encode": {}},  # its own weights: nothing to compare
    }
    code_agreement(contenders, "onnx-cpu")
    assert contenders["torch-eager"]["codes_equal_pct"] == {"to": "onnx-cpu", "pct": 75.0, "frames": [4, 4]}
    assert contenders["rustymimi"]["codes_equal_pct"] == {"to": "onnx-cpu", "pct": 100.0, "frames": [3, 4]}
    assert not any("codes" in r or "codes_equal_pct" in r
                   for n, r in contenders.items() if n in ("onnx-cpu", "onnx-cpu-int8", "transformers"))


# Stands in for moshi in the official-contender tests: moshi pins torch<2.10, so it is not in the
# test environment. It records how the bench called its loader and answers with our own torch
# model, under moshi's calling conventions (encode/decode of [B, 1, N] / [B, K, T], streaming()).
FAKE_LOADERS = '''
import contextlib, json, pathlib
from safetensors.torch import load_file
from codecport.models.checkpoint import load_state
from codecport.codecs.mimi.model import MimiConfig, MimiModel


class _Moshiish:
    def __init__(self, model, k):
        self.model, self.k = model, k

    def eval(self):
        return self

    def encode(self, x):
        return self.model.encode(self.model.pad(x), self.k)

    def decode(self, codes):
        return self.model.decode(codes)

    @contextlib.contextmanager
    def streaming(self, batch_size):
        yield


def get_mimi(filename, mimi_config=None, device="cpu", num_codebooks=8):
    folder = pathlib.Path(filename).parent
    (folder / "get_mimi.json").write_text(json.dumps(
        {"filename": str(filename), "mimi_config": mimi_config, "num_codebooks": num_codebooks}))
    model = MimiModel(MimiConfig.from_kwargs(json.loads((folder / "config.json").read_text())))
    load_state(model, load_file(filename), "fake moshi")
    return _Moshiish(model.eval(), num_codebooks)
'''


def _fake_moshi(root: Path, loaders: str) -> dict:
    """A `moshi` package under `root` (with the metadata `importlib.metadata.version` reads)."""
    (root / "moshi" / "models").mkdir(parents=True)
    (root / "moshi" / "__init__.py").write_text("")
    (root / "moshi" / "models" / "__init__.py").write_text("")
    (root / "moshi" / "models" / "loaders.py").write_text(loaders)
    (root / "moshi-0.0.1.dist-info").mkdir()
    (root / "moshi-0.0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: moshi\n"
                                                             "Version: 0.0.1\n")
    return {**os.environ, "PYTHONPATH": str(root)}


def test_bench_official_contender_is_moshi_on_the_same_weights_and_config(tmp_path_factory, tmp_path,
                                                                          monkeypatch):
    from codecport.codecs.mimi.model import PRESETS
    from codecport.codecs.mimi.weights import moshi_config

    env = _fake_moshi(tmp_path / "site", FAKE_LOADERS)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))  # the bench looks for moshi in its own process
    out, work = tmp_path / "report.json", bench_folder(tmp_path_factory, tmp_path, "mimi", frames=2)
    proc = bench("mimi", "--preset", "tiny", "--seconds", SECONDS, *QUICK, "--frames", "2", "--runs", "1",
                 "--steps", "3", "--contender", "official", "--dir", work, "--json", out, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    call = json.loads((work / "get_mimi.json").read_text())
    assert call["filename"] == str(work / "weights.safetensors")
    assert call["mimi_config"] == json.loads(json.dumps(moshi_config(PRESETS["tiny"])))
    assert call["num_codebooks"] == 4  # Moshi's 8, capped at the tiny config's 4
    report = json.loads(out.read_text())
    r = report["contenders"]["moshi"]
    assert r["version"] == "0.0.1" and r["encode"]["rtf_median"] > 0 and r["decode"]["rtf_median"] > 0
    assert r["streaming"]["steps"] == 3 and r["streaming"]["encode_step"]["p95_ms"] > 0
    assert r["codes_equal_pct"]["pct"] == 100
    assert set(report["speedups"]["onnx-cpu vs moshi"]) == {"encode", "decode", "encode_step p95",
                                                            "decode_step p95"}
    assert "moshi streaming decode_step" in proc.stdout


# Stands in for descript-audio-codec (which cannot share an environment with onnx) in the
# official-DAC test: the official class's calling conventions around our torch model, loading the
# official checkpoint layout through our own weight-norm folding.
FAKE_DAC = '''
import torch
from codecport.codecs.dac.model import DAC as Ours, DacConfig
from codecport.codecs.dac.weights import fold_weight_norm


class _Quantizer:
    def from_codes(self, codes):
        return (codes,)


class DAC(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.cfg = DacConfig.from_kwargs(kwargs)
        self.model, self.sample_rate, self.quantizer = Ours(self.cfg), self.cfg.sample_rate, _Quantizer()

    def load_state_dict(self, sd):
        assert any(k.endswith(".weight_g") for k in sd), "not the official weight-norm layout"
        return self.model.load_state_dict(fold_weight_norm(sd))

    def preprocess(self, x, sample_rate):
        assert sample_rate == self.sample_rate
        return torch.nn.functional.pad(x, (0, -x.shape[-1] % self.cfg.hop_length))

    def encode(self, x):
        return None, self.model.encode(x)

    def decode(self, z):
        return self.model.decode(z)
'''


def test_bench_official_dac_runs_in_the_interpreter_given(tmp_path_factory, tmp_path):
    site = tmp_path / "site"
    (site / "dac" / "model").mkdir(parents=True)
    (site / "dac" / "__init__.py").write_text('__version__ = "0.0.2"\n')
    (site / "dac" / "model" / "__init__.py").write_text("")
    (site / "dac" / "model" / "dac.py").write_text(FAKE_DAC)
    out = tmp_path / "report.json"
    work = bench_folder(tmp_path_factory, tmp_path, "dac")
    cmd = ["dac", "--preset", "tiny", "--seconds", SECONDS, "--dir", work, *QUICK, "--runs", "1",
           "--long", "0", "--contender", "official", "--official-python", sys.executable, "--json", out]
    proc = bench(*cmd, env={"PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(out.read_text())["contenders"]["descript-audio-codec"]
    assert r["python"] == sys.executable and r["version"] == "0.0.2"
    assert r["encode"]["rtf_median"] > 0 and r["decode"]["rtf_median"] > 0 and r["peak_rss_mb"] > 0
    # The official layout written from the bench's weights folds back to them exactly.
    assert r["codes_equal_pct"]["pct"] == 100
    assert "descript-audio-codec  decode" in proc.stdout
    # The same interpreter without the package: skipped, saying it does not import there.
    proc = bench(*cmd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "does not import with" in \
        json.loads(out.read_text())["contenders"]["descript-audio-codec"]["skipped"]


def test_official_python_is_for_dac(tmp_path):
    proc = bench("mimi", "--preset", "tiny", "--official-python", sys.executable, "--dir", tmp_path / "b")
    assert proc.returncode == 2 and "--official-python is for dac" in proc.stderr
    assert not (tmp_path / "b").exists()


def test_unfold_weight_norm_is_what_torch_weight_norm_folds_back():
    """The official layout written for the official contender: torch's own weight norm (the
    official WNConv1d) and our folding both give the original weights back."""
    import warnings

    import torch

    from codecport.codecs.dac.weights import fold_weight_norm, unfold_weight_norm

    torch.manual_seed(0)
    conv, tconv = torch.nn.Conv1d(3, 5, 7), torch.nn.ConvTranspose1d(4, 2, 6)
    sd = {"a.weight": conv.weight.detach(), "a.bias": conv.bias.detach(), "t.weight": tconv.weight.detach(),
          "codebook.weight": torch.randn(16, 8), "alpha": torch.rand(1, 3, 1)}
    official = unfold_weight_norm(sd)
    assert {"a.weight_g", "a.weight_v", "t.weight_g", "t.weight_v", "codebook.weight", "alpha"} <= \
        set(official)
    assert "a.weight" not in official and "t.weight" not in official
    for stem, module in (("a", torch.nn.Conv1d(3, 5, 7)), ("t", torch.nn.ConvTranspose1d(4, 2, 6))):
        with warnings.catch_warnings():  # deprecated, but it is the one the official layers use
            warnings.simplefilter("ignore", FutureWarning)
            wn = torch.nn.utils.weight_norm(module)
        wn.weight_g.data, wn.weight_v.data = official[f"{stem}.weight_g"], official[f"{stem}.weight_v"]
        torch.nn.utils.remove_weight_norm(wn)
        torch.testing.assert_close(wn.weight, sd[f"{stem}.weight"])
    back = fold_weight_norm(official)
    assert set(back) == set(sd)
    for k, want in sd.items():
        torch.testing.assert_close(back[k], want)


def test_the_export_source_hash_follows_a_codecs_folder(tmp_path):
    """A kept bench export is rebuilt when a codec's exporter changes: its folder is hashed."""
    import codecport
    from codecport.bench.prepare import export_source_hash

    root = tmp_path / "codecport"
    shutil.copytree(Path(codecport.__file__).parent, root,
                    ignore=shutil.ignore_patterns("__pycache__", "web"))
    before = export_source_hash(root)
    assert export_source_hash(root) == before
    (root / "codecs" / "mimi" / "export.py").write_text("# changed\n", encoding="utf-8")
    assert export_source_hash(root) != before


def test_bench_qwen3tts_streams_its_decoder_and_names_why_qwen_tts_did_not_run(tmp_path_factory, tmp_path):
    """A codec with many codebooks and a decoder stream only: its streams are timed on
    `[codebooks, frames]` pushes, with time to first audio; its official package (qwen-tts,
    run by path in the interpreter given) is listed as skipped, saying it does not import there,
    and nothing of the official layout is written without it."""
    out = tmp_path / "report.json"
    work = bench_folder(tmp_path_factory, tmp_path, "qwen3tts")
    proc = bench("qwen3tts", "--preset", "tiny", "--seconds", SECONDS, "--dir", work, *QUICK, "--runs", "1",
                 "--steps", "3", "--contender", "official", "--official-python", sys.executable,
                 "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = json.loads(out.read_text())["contenders"]
    assert "qwen-tts does not import with" in ran["qwen-tts"]["skipped"]
    assert not (work / "official" / "model.safetensors").exists()
    st = ran["onnx-cpu"]["streaming"]
    assert "encode_step" not in st and st["steps"] == 3 and len(st["decode_step"]["seconds"]) == 3
    assert st["first_audio_ms"] > 0 and "first audio" in proc.stdout
