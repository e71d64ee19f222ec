"""Bad input to the Mimi CLI, through the real console scripts: one `error:` line, exit != 0,
nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from mimi_cli_support import CFG, FIXED_ONLY_LEN, FRAME, SR, K, assert_one_line_error, cli, run, write_wav
from support import noise


# ---- bad audio in -------------------------------------------------------------------------
@pytest.fixture
def out_dir(tmp_path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


def test_empty_wav(tmp_path, out_dir, model_dir):
    wav = write_wav(tmp_path / "empty.wav", np.zeros((1, 0), np.float32), SR)
    out = out_dir / "c.npz"
    line = assert_one_line_error(run("codec-run", "encode", wav, "-m", model_dir, "-o", out), out)
    assert "no samples" in line


def test_wav_with_nan(tmp_path, out_dir, model_dir):
    x = noise(500)
    x[0, 100] = np.nan
    wav = write_wav(tmp_path / "nan.wav", x, SR)
    assert np.isnan(sf.read(wav, dtype="float32")[0]).any()
    for args in ((), ("--mode", "step")):
        out = out_dir / "c.npy"
        proc = run("codec-run", "encode", wav, "-m", model_dir, "-o", out, *args)
        assert "NaN" in assert_one_line_error(proc, out)


def test_corrupt_wav(tmp_path, out_dir, model_dir):
    wav = tmp_path / "corrupt.wav"
    wav.write_bytes(np.random.default_rng(0).bytes(4000))
    out = out_dir / "c.npy"
    line = assert_one_line_error(run("codec-run", "encode", wav, "-m", model_dir, "-o", out), out)
    assert "cannot read audio" in line


@pytest.mark.parametrize("name", ["c.dac", "c.wav", "c"])
def test_unknown_output_suffix(clips, out_dir, model_dir, name):
    out = out_dir / name
    proc = run("codec-run", "encode", clips["short"], "-m", model_dir, "-o", out)
    assert "Mimi codes are written as .npy, .npz" in assert_one_line_error(proc, out)


@pytest.mark.parametrize("k", [0, K + 1])
def test_codebooks_out_of_range(clips, out_dir, model_dir, k):
    out = out_dir / "c.npy"
    proc = run("codec-run", "encode", clips["short"], "-m", model_dir, "-o", out, "--codebooks", k)
    if k == 0:  # click's IntRange(min=1)
        assert_one_line_error(proc, out, usage=True)
    else:
        assert f"between 1 and {K}, got {k}" in assert_one_line_error(proc, out)


# ---- bad codes in -------------------------------------------------------------------------
@pytest.mark.parametrize("codes, match", [
    (np.full((1, K, 3), CFG.codebook_size), f"[0, {CFG.codebook_size})"),
    (np.full((1, K, 3), -1), f"[0, {CFG.codebook_size})"),
    (np.zeros((1, 1, K, 3), np.int64), "[1, 1, 4, 3]"),
    (np.zeros(5, np.int64), "[5]"),
    (np.zeros((1, K + 1, 3), np.int64), f"codebooks<={K}"),
    (np.zeros((1, K, 0), np.int64), "[1, 4, 0]"),
    (np.zeros((1, K, 3), np.float32), "float32"),
], ids=["too-big", "negative", "4-d", "1-d", "too-many-codebooks", "no-frames", "float"])
@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_bad_codes(tmp_path, out_dir, model_dir, codes, match, suffix):
    path = tmp_path / f"c{suffix}"
    with open(path, "wb") as f:  # through a handle: np.save/np.savez would change the suffix
        if suffix == ".npy":
            np.save(f, codes)
        else:
            np.savez(f, codes=codes, length=np.int64(72), sample_rate=np.int64(SR), codec=np.array("mimi"))
    out = out_dir / "o.wav"
    line = assert_one_line_error(run("codec-run", "decode", path, "-m", model_dir, "-o", out), out)
    assert match in line


def test_npz_of_another_codec(tmp_path, out_dir, model_dir):
    path = tmp_path / "c.npz"
    np.savez(path, codes=np.zeros((1, K, 3), np.int64), length=np.int64(72),
             sample_rate=np.int64(SR), codec=np.array("dac"))
    out = out_dir / "o.wav"
    line = assert_one_line_error(run("codec-run", "decode", path, "-m", model_dir, "-o", out), out)
    assert "dac codes, not mimi" in line


@pytest.mark.parametrize("what", ["garbage", "truncated", "bare-npy", "pickled"])
def test_npz_that_is_not_a_codes_file(tmp_path, out_dir, model_dir, what):
    codes = np.zeros((1, K, 3), np.int64)
    path = tmp_path / "c.npz"
    if what == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(3000))
    elif what == "truncated":
        with open(path, "wb") as f:
            np.savez(f, codes=codes, length=np.int64(72), sample_rate=np.int64(SR), codec=np.array("mimi"))
        path.write_bytes(path.read_bytes()[:200])
    else:
        with open(path, "wb") as f:
            np.save(f, codes if what == "bare-npy" else np.array({"codes": codes}, dtype=object),
                    allow_pickle=what == "pickled")
    out = out_dir / "o.wav"
    line = assert_one_line_error(run("codec-run", "decode", path, "-m", model_dir, "-o", out), out)
    assert "not a codes file" in line


def test_npy_that_is_not_codes(tmp_path, out_dir, model_dir):
    path = tmp_path / "c.npy"
    path.write_bytes(b"not an array at all")
    out = out_dir / "o.wav"
    line = assert_one_line_error(run("codec-run", "decode", path, "-m", model_dir, "-o", out), out)
    assert "not a readable .npy" in line


@pytest.mark.parametrize("length, rate", [(72, 0), (-10, SR)], ids=["rate-0", "negative-length"])
def test_npz_with_impossible_length_or_rate(tmp_path, out_dir, model_dir, length, rate):
    path = tmp_path / "c.npz"
    np.savez(path, codes=np.zeros((1, K, 3), np.int64), length=np.int64(length),
             sample_rate=np.int64(rate), codec=np.array("mimi"))
    out = out_dir / "o.wav"
    assert_one_line_error(run("codec-run", "decode", path, "-m", model_dir, "-o", out), out)


# ---- model folders ------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["encode", "decode"])
def test_step_mode_with_a_dac_folder(tmp_path, out_dir, clips, dac_dir, command):
    if command == "encode":
        src, out = clips["short"], out_dir / "c.npy"
    else:
        src, out = tmp_path / "c.npy", out_dir / "o.wav"
        np.save(src, np.zeros((1, 4, 100), np.int64))
    proc = run("codec-run", command, src, "-m", dac_dir, "-o", out, "--mode", "step")
    assert "DAC has no step mode; its modes are fixed, chunked" in assert_one_line_error(proc, out)


@pytest.mark.parametrize("graph, command", [("encoder.onnx", "encode"), ("decoder.onnx", "decode"),
                                            ("rvq.npz", "encode")])
def test_graph_from_another_export_is_refused(tmp_path, out_dir, clips, model_dir, fixed_only, graph,
                                              command):
    model = tmp_path / "model"
    shutil.copytree(model_dir, model)
    shutil.copyfile(fixed_only / graph, model / graph)
    if command == "encode":
        src, out = clips["short"], out_dir / "c.npy"
    else:
        src, out = tmp_path / "c.npy", out_dir / "o.wav"
        np.save(src, np.zeros((1, K, 3), np.int64))
    line = assert_one_line_error(run("codec-run", command, src, "-m", model, "-o", out), out)
    assert "re-export the folder" in line


def test_fixed_only_folder_refuses_long_input(tmp_path, out_dir, clips, fixed_only):
    ok = out_dir / "fits.npy"  # what fits still works
    write_wav(tmp_path / "fits.wav", noise(FIXED_ONLY_LEN), SR)
    cli("codec-run", "encode", tmp_path / "fits.wav", "-m", fixed_only, "-o", ok)
    assert np.load(ok).shape == (1, K, FIXED_ONLY_LEN // FRAME)
    out = out_dir / "c.npz"
    proc = run("codec-run", "encode", clips["long"], "-m", fixed_only, "-o", out)
    assert "re-export it with codec-export mimi" in assert_one_line_error(proc, out)
    np.save(tmp_path / "long.npy", np.zeros((1, K, FIXED_ONLY_LEN // FRAME + 1), np.int64))
    out = out_dir / "o.wav"
    proc = run("codec-run", "decode", tmp_path / "long.npy", "-m", fixed_only, "-o", out)
    assert "re-export it with codec-export mimi" in assert_one_line_error(proc, out)


@pytest.mark.parametrize("command", ["encode", "decode"])
def test_step_mode_on_fixed_only_folder(tmp_path, out_dir, fixed_only, command):
    if command == "encode":
        src, out = write_wav(tmp_path / "in.wav", noise(50), SR), out_dir / "c.npy"
    else:
        src, out = tmp_path / "c.npy", out_dir / "o.wav"
        np.save(src, np.zeros((1, K, 2), np.int64))
    line = assert_one_line_error(run("codec-run", command, src, "-m", fixed_only, "-o", out,
                                     "--mode", "step"), out)
    assert "step.onnx" in line and "re-export" in line
    assert "longer than" not in line and "more than" not in line


# ---- codec-export mimi --------------------------------------------------------------------
@pytest.mark.parametrize("args, match", [
    (("--len", 96, "--codebooks", 2), "--in-graph-quantizer"),
    (("--len", 0), "--len"),
    (("--frames", 0), "--frames"),
    (("--streaming",), "--streaming"),  # step graphs are always written now: no such option
], ids=["codebooks-without-in-graph", "len-0", "frames-0", "streaming-is-gone"])
def test_export_usage_errors(tmp_path, args, match):
    out = tmp_path / "exported"
    proc = run("codec-export", "mimi", "--preset", "tiny", "--random-init", *args, "-o", out)
    assert match in assert_one_line_error(proc, out, usage=True)


def test_export_too_many_in_graph_codebooks(tmp_path):
    out = tmp_path / "exported"
    proc = run("codec-export", "mimi", "--preset", "tiny", "--random-init", "--len", 96,
               "--in-graph-quantizer", "--codebooks", K + 1, "-o", out)
    assert f"between 1 and {K}" in assert_one_line_error(proc, out)


@pytest.mark.parametrize("weights", ["pth", "missing"])
def test_export_bad_weights(tmp_path, weights):
    if weights == "pth":
        path = tmp_path / "mimi.pth"
        torch.save({"state_dict": {"x": torch.zeros(1)}}, path)
    else:
        path = tmp_path / "nowhere.safetensors"
    out = tmp_path / "exported"
    proc = run("codec-export", "mimi", "--preset", "tiny", "--len", 96, "--weights", path, "-o", out)
    line = assert_one_line_error(proc, out)
    assert str(path) in line
    assert ("safetensors" if weights == "pth" else "no such file") in line
