"""End to end through the console scripts: export a tiny model, then encode and decode files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from cli_support import invoke
from shared_exports import TINY_CHUNK, TINY_LEN, cli_export, cli_output, shared
from support import noise

BIN = Path(sys.executable).parent
GRAPHS = ("encoder.onnx", "decoder.onnx", "encoder_chunked.onnx", "decoder_chunked.onnx")


def cli(tool: str, *args) -> subprocess.CompletedProcess:
    """The command in this process (cli_support.py); the export above is a real one."""
    proc = invoke(tool, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = shared(tmp_path_factory, "dac-cli", lambda folder: cli_export(
        folder, "dac", "--preset", "tiny", "--len", TINY_LEN, "--chunk-len", TINY_CHUNK, "--seed", 0))
    return out, cli_output(out)


@pytest.fixture(scope="module")
def model_dir(exported) -> Path:
    return exported[0]


def write_wav(path: Path, audio: np.ndarray, sr: int) -> Path:
    sf.write(path, audio.T, sr, subtype="FLOAT")
    return path


def test_export_writes_the_folder(exported):
    out, proc = exported
    assert "RANDOM" in proc.stderr and "RANDOM" not in proc.stdout  # a diagnostic, not a result
    for name in (*GRAPHS, "rvq.npz", "manifest.json"):
        assert name in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted([*GRAPHS, "rvq.npz", "manifest.json"])


def test_info(model_dir):
    out = cli("codec-run", "info", model_dir).stdout
    assert out.startswith(f"{model_dir}: dac tiny, 16000 Hz")
    for name in GRAPHS:
        assert f"{model_dir / name}: {name.split('.')[0].split('_')[0]} " \
            f"{'chunked' if 'chunked' in name else 'fixed'}" in out
    info = json.loads(cli("codec-run", "info", model_dir, "--json").stdout)
    assert info["manifest"]["codec"] == "dac" and info["manifest"]["preset"] == "tiny"
    assert sorted(Path(p).name for p in info["graphs"]) == sorted(GRAPHS)
    assert {g["codec"] for g in info["graphs"].values()} == {"dac"}


@pytest.mark.parametrize("sr", [16000, 22050])
def test_dac_file_round_trip(tmp_path, model_dir, sr):
    x = noise(5000, channels=2)
    wav = write_wav(tmp_path / "in.wav", x, sr)
    enc = cli("codec-run", "encode", wav, "-m", model_dir, "-o", tmp_path / "c.dac")
    assert ("resampling" in enc.stderr) == (sr != 16000) and "resampling" not in enc.stdout
    cli("codec-run", "decode", tmp_path / "c.dac", "-m", model_dir, "-o", tmp_path / "out.wav")
    y, sr_out = sf.read(tmp_path / "out.wav", dtype="float32", always_2d=True)
    assert sr_out == sr
    assert y.shape == (5000, 2)
    assert np.isfinite(y).all()
    assert np.abs(y).max() > 0


def test_npy_codes_shape_and_decode(tmp_path, model_dir):
    wav = write_wav(tmp_path / "in.wav", noise(TINY_LEN), 16000)
    cli("codec-run", "encode", wav, "-m", model_dir, "-o", tmp_path / "all.npy")
    cli("codec-run", "encode", wav, "-m", model_dir, "-o", tmp_path / "two.npy", "--codebooks", 2)
    all_k, two_k = np.load(tmp_path / "all.npy"), np.load(tmp_path / "two.npy")
    assert all_k.shape == (1, 4, 100)
    assert two_k.shape == (1, 2, 100)
    np.testing.assert_array_equal(two_k, all_k[:, :2])  # residual levels are nested

    dec = cli("codec-run", "decode", tmp_path / "two.npy", "-m", model_dir, "-o", tmp_path / "o.wav")
    y, sr = sf.read(tmp_path / "o.wav", dtype="float32", always_2d=True)
    assert (sr, y.shape) == (16000, (598, 1))
    assert np.isfinite(y).all()
    assert "598 samples" in dec.stdout


def test_npy_codes_equal_torch_encode(tmp_path, model_dir, tiny_dac):
    x = noise(TINY_LEN, seed=3)
    # The runtime scales audio peaking above 1 down first; torch encode would not.
    assert np.abs(x).max() < 1
    assert tiny_dac.padding  # the official (exact) mode the encoder.onnx graph was exported in
    wav = write_wav(tmp_path / "in.wav", x, 16000)
    cli("codec-run", "encode", wav, "-m", model_dir, "-o", tmp_path / "c.npy")
    with torch.no_grad():
        want = tiny_dac.encode(torch.from_numpy(x)[None]).numpy()
    assert want.shape == (1, 4, 100)
    np.testing.assert_array_equal(np.load(tmp_path / "c.npy"), want)


def test_whole_mode_gives_the_official_codes_of_the_whole_file(tmp_path, model_dir, tiny_dac):
    """`--mode whole`: a file of 9 windows, its codes those of `DAC.encode` on all of it, and
    `codec-run decode` back to the original length through the same windows."""
    x = noise(9 * TINY_LEN + 11, seed=21)
    wav = write_wav(tmp_path / "in.wav", x, 16000)
    enc = cli("codec-run", "encode", wav, "-m", model_dir, "-o", tmp_path / "c.npz", "--mode", "whole")
    assert "whole clip, overlapping windows" in enc.stdout
    with torch.no_grad():
        want = tiny_dac.encode(torch.from_numpy(x)[None]).numpy()
    z = np.load(tmp_path / "c.npz")
    assert str(z["mode"]) == "whole"
    np.testing.assert_array_equal(z["codes_0"], want)
    cli("codec-run", "decode", tmp_path / "c.npz", "-m", model_dir, "-o", tmp_path / "o.wav")
    y, sr = sf.read(tmp_path / "o.wav", dtype="float32")
    assert sr == 16000 and y.shape == (x.shape[1],)
