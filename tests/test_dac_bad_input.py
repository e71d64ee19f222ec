"""Bad input through the real console scripts: one `error:` line, exit != 0, nothing written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import soundfile as sf
import torch
from cli_support import invoke
from shared_exports import TINY_CHUNK
from support import noise

from codecport.codecs.dac.export import export_dac
from codecport.codecs.dac.model import PRESETS

BIN = Path(sys.executable).parent


def cli(tool: str, *args) -> subprocess.CompletedProcess:
    """The command in this process (cli_support.py): the CLI's contract does not depend on it."""
    return invoke(tool, *args)


def assert_one_line_error(proc: subprocess.CompletedProcess, out: Path) -> str:
    """The failure contract; returns the error line for case-specific checks."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error:"), proc.stderr
    assert not out.exists()
    if out.parent.is_dir():
        assert not list(out.parent.glob(".*.part"))
    return lines[-1]


class RunsShell:
    """Unpickling this runs a shell command: the payload of a malicious file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def out_dir(tmp_path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


@pytest.fixture(scope="module")
def geometry(tiny_export) -> dict:
    return json.loads((tiny_export / "manifest.json").read_text())["geometry"]


def save_codes(path: Path, codes: np.ndarray) -> Path:
    np.save(path, codes, allow_pickle=False)
    return path


def valid_codes(tmp_path: Path, frames: int = 100) -> Path:
    return save_codes(tmp_path / "codes.npy", np.zeros((1, 4, frames), dtype=np.int64))


def save_dac(path: Path, obj) -> Path:
    # Through a handle: np.save would append .npy to a path ending in .dac.
    with open(path, "wb") as f:
        np.save(f, obj, allow_pickle=True)
    return path


def official_metadata() -> dict:
    return {"input_db": np.array([-20.0], dtype=np.float32), "original_length": 600,
            "sample_rate": 16000, "chunk_length": 100, "channels": 1, "padding": True,
            "dac_version": "1.0.0"}


# ---- audio in ----------------------------------------------------------------------------
def test_empty_wav(tmp_path, out_dir, tiny_export):
    wav = tmp_path / "empty.wav"
    sf.write(wav, np.zeros((0, 1), dtype=np.float32), 16000, subtype="FLOAT")
    out = out_dir / "c.dac"
    line = assert_one_line_error(cli("codec-run", "encode", wav, "-m", tiny_export, "-o", out), out)
    assert "no samples" in line


def test_corrupt_wav(tmp_path, out_dir, tiny_export):
    wav = tmp_path / "corrupt.wav"
    wav.write_bytes(np.random.default_rng(0).bytes(4000))
    out = out_dir / "c.dac"
    line = assert_one_line_error(cli("codec-run", "encode", wav, "-m", tiny_export, "-o", out), out)
    assert "cannot read audio" in line


def test_wav_with_nan(tmp_path, out_dir, tiny_export):
    x = noise(600).T.copy()
    x[100, 0] = np.nan
    wav = tmp_path / "nan.wav"
    sf.write(wav, x, 16000, subtype="FLOAT")
    assert np.isnan(sf.read(wav, dtype="float32")[0]).any()
    out = out_dir / "c.npy"
    line = assert_one_line_error(cli("codec-run", "encode", wav, "-m", tiny_export, "-o", out), out)
    assert "NaN" in line


# ---- codes in ----------------------------------------------------------------------------
def test_codes_of_wrong_ndim(tmp_path, out_dir, tiny_export):
    codes = save_codes(tmp_path / "c.npy", np.zeros((1, 1, 4, 100), dtype=np.int64))
    out = out_dir / "out.wav"
    line = assert_one_line_error(cli("codec-run", "decode", codes, "-m", tiny_export, "-o", out), out)
    assert "[1, 1, 4, 100]" in line


@pytest.mark.parametrize("value", [PRESETS["tiny"].codebook_size, -1])
def test_codes_out_of_range(tmp_path, out_dir, tiny_export, value):
    codes = np.zeros((1, 4, 100), dtype=np.int64)
    codes[0, 2, 50] = value
    path = save_codes(tmp_path / "c.npy", codes)
    out = out_dir / "out.wav"
    line = assert_one_line_error(cli("codec-run", "decode", path, "-m", tiny_export, "-o", out), out)
    assert f"[0, {PRESETS['tiny'].codebook_size})" in line


def test_codes_of_float_dtype(tmp_path, out_dir, tiny_export):
    path = save_codes(tmp_path / "c.npy", np.zeros((1, 4, 100), dtype=np.float32))
    out = out_dir / "out.wav"
    line = assert_one_line_error(cli("codec-run", "decode", path, "-m", tiny_export, "-o", out), out)
    assert "float32" in line


def test_codes_of_unusable_length(tmp_path, out_dir, tiny_export, geometry):
    frames = geometry["chunk_frames"] + 1
    assert frames != geometry["frames"] and frames % geometry["chunk_frames"]
    path = valid_codes(tmp_path, frames)
    out = out_dir / "out.wav"
    line = assert_one_line_error(cli("codec-run", "decode", path, "-m", tiny_export, "-o", out), out)
    assert str(frames) in line and str(geometry["chunk_frames"]) in line


def test_dac_file_with_code_running_pickle(tmp_path, out_dir, tiny_export):
    marker = tmp_path / "SOMEFILE"
    path = save_dac(tmp_path / "evil.dac", {"codes": np.zeros((1, 4, 100), dtype=np.uint16),
                                            "metadata": {**official_metadata(),
                                                         "padding": RunsShell(marker)}})
    out = out_dir / "out.wav"
    assert_one_line_error(cli("codec-run", "decode", path, "-m", tiny_export, "-o", out), out)
    assert not marker.exists()
    # The file really is dangerous: the official reader's np.load(allow_pickle=True) runs it.
    np.load(path, allow_pickle=True)
    assert marker.exists()


def test_dac_file_with_wrong_metadata_key(tmp_path, out_dir, tiny_export):
    meta = official_metadata()
    meta["dac_verison"] = meta.pop("dac_version")
    path = save_dac(tmp_path / "c.dac", {"codes": np.zeros((1, 4, 100), dtype=np.uint16),
                                         "metadata": meta})
    out = out_dir / "out.wav"
    line = assert_one_line_error(cli("codec-run", "decode", path, "-m", tiny_export, "-o", out), out)
    assert "dac_verison" in line


def test_valid_dac_file_decodes(tmp_path, out_dir, tiny_export):
    # Control for the two cases above: the same dict with the official keys is accepted.
    path = save_dac(tmp_path / "c.dac", {"codes": np.zeros((1, 4, 100), dtype=np.uint16),
                                         "metadata": official_metadata()})
    out = out_dir / "out.wav"
    proc = cli("codec-run", "decode", path, "-m", tiny_export, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert sf.info(out).frames == 600


# ---- model folders -----------------------------------------------------------------------
def test_decoder_of_another_length(tmp_path, out_dir, tiny_export, tiny_dac):
    other = tmp_path / "other"
    export_dac(tiny_dac, other, 1200, TINY_CHUNK, preset="tiny", weights="random-init seed 0",
               weights_sha256="none")
    model = tmp_path / "model"
    shutil.copytree(tiny_export, model)
    shutil.copyfile(other / "decoder.onnx", model / "decoder.onnx")
    out = out_dir / "out.wav"
    proc = cli("codec-run", "decode", valid_codes(tmp_path), "-m", model, "-o", out)
    line = assert_one_line_error(proc, out)
    assert "decoder.onnx" in line


def test_encoder_of_random_bytes(tmp_path, out_dir, tiny_export):
    model = tmp_path / "model"
    shutil.copytree(tiny_export, model)
    (model / "encoder.onnx").write_bytes(np.random.default_rng(0).bytes(5000))
    wav = tmp_path / "in.wav"
    sf.write(wav, noise(600).T, 16000, subtype="FLOAT")
    out = out_dir / "c.dac"
    line = assert_one_line_error(cli("codec-run", "encode", wav, "-m", model, "-o", out), out)
    assert "encoder.onnx" in line


def test_missing_model_folder(tmp_path, out_dir):
    out = out_dir / "out.wav"
    proc = cli("codec-run", "decode", valid_codes(tmp_path), "-m", tmp_path / "nowhere", "-o", out)
    line = assert_one_line_error(proc, out)
    assert "nowhere" in line


# ---- providers ---------------------------------------------------------------------------
def test_unavailable_provider_names_what_to_install(tmp_path, out_dir, tiny_export):
    assert "CUDAExecutionProvider" not in ort.get_available_providers(), \
        "this test needs an onnxruntime without CUDA"
    out = out_dir / "out.wav"
    proc = cli("codec-run", "decode", valid_codes(tmp_path), "-m", tiny_export, "-o", out,
               "--provider", "cuda")
    line = assert_one_line_error(proc, out)
    assert "onnxruntime-gpu" in line and "--fallback cpu" in line


def test_unavailable_provider_with_fallback(tmp_path, out_dir, tiny_export):
    out = out_dir / "out.wav"
    proc = cli("codec-run", "decode", valid_codes(tmp_path), "-m", tiny_export, "-o", out,
               "--provider", "cuda", "--fallback", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "CPUExecutionProvider" in proc.stdout
    assert sf.info(out).frames == 598


# ---- codec-export checkpoints ------------------------------------------------------------
def test_export_refuses_code_running_checkpoint(tmp_path):
    marker = tmp_path / "PWNED"
    pth = tmp_path / "some.pth"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "payload": RunsShell(marker)}, pth)
    out = tmp_path / "exported"
    proc = cli("codec-export", "dac", "--preset", "tiny", "--len", 600, "--weights", pth, "-o", out)
    line = assert_one_line_error(proc, out)
    assert "refused" in line
    assert not marker.exists()
    torch.load(pth, weights_only=False)  # control: the file does run code when trusted
    assert marker.exists()


def test_export_names_missing_key(tmp_path, tiny_dac):
    sd = dict(tiny_dac.state_dict())
    dropped = "decoder.model.1.block.1.weight"
    del sd[dropped]
    pth = tmp_path / "X.pth"
    torch.save({"state_dict": sd, "metadata": {"kwargs": PRESETS["tiny"].to_kwargs()}}, pth)
    out = tmp_path / "exported"
    proc = cli("codec-export", "dac", "--preset", "tiny", "--len", 600, "--weights", pth, "-o", out)
    line = assert_one_line_error(proc, out)
    assert dropped in line


# ---- codec-export --target / --precision -----------------------------------------------------
@pytest.mark.parametrize("args,says", [
    (["--target", "dml", "--precision", "int8"], "--target dml takes --precision fp32 or fp16"),
    (["--target", "coreml", "--precision", "int8"], "--target coreml takes"),
    (["--precision", "fp16", "--calibration", "{wav}"], "--calibration only applies to --precision int8"),
])
def test_export_refuses_what_a_target_cannot_take(tmp_path, args, says):
    wav = tmp_path / "c.wav"
    sf.write(wav, noise(4000).T, 16000)
    out = tmp_path / "out"
    proc = cli("codec-export", "dac", "--preset", "tiny", "--random-init", "--len", 600, "-o", out,
               *[a.format(wav=wav) for a in args])
    assert says in assert_one_line_error(proc, out)


def test_export_int8_calibrated_on_a_corrupt_file(tmp_path):
    bad = tmp_path / "calib.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    out = tmp_path / "out"
    proc = cli("codec-export", "dac", "--preset", "tiny", "--random-init", "--len", 600, "-o", out,
               "--precision", "int8", "--calibration", bad)
    assert "cannot read audio" in assert_one_line_error(proc, out)


def test_export_mobile_int8_and_run_it(tmp_path):
    """The CLI path end to end: the variant folder, its report, and codec-run on it."""
    out = tmp_path / "mobile"
    proc = cli("codec-export", "mimi", "--preset", "tiny", "--random-init", "--len", 960,
               "--frames", 2, "--target", "mobile", "--precision", "int8", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "target mobile, precision int8; deviation from fp32" in proc.stdout
    assert "encoder_step.onnx" in proc.stdout and "% equal" in proc.stdout and "SNR" in proc.stdout
    assert "required_operators_and_types.config" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == "mobile" and manifest["precision"] == "int8"
    assert set(manifest["deviation"]) == {"encoder", "decoder", "encoder_step", "decoder_step"}
    wav = tmp_path / "in.wav"
    sf.write(wav, noise(24000 // 2).T, 24000)
    codes = tmp_path / "codes.npz"
    proc = cli("codec-run", "encode", wav, "-m", out, "-o", codes)
    assert proc.returncode == 0, proc.stderr
    proc = cli("codec-run", "decode", codes, "-m", out, "-o", tmp_path / "out.wav")
    assert proc.returncode == 0, proc.stderr
    audio, sr = sf.read(tmp_path / "out.wav")
    assert sr == 24000 and len(audio) == 24000 // 2 and np.isfinite(audio).all()


def test_windows_option_on_the_command_line(tmp_path, out_dir, tiny_export, geometry):
    """`--provider-option parallel=N` (or its old name `windows`) reaches the runtime: a bad value
    is a one-line error, and one window at a time writes the same audio as the default."""
    size = int(json.loads((tiny_export / "manifest.json").read_text())["codebook_size"])
    codes = save_codes(tmp_path / "codes.npy", np.random.default_rng(0).integers(
        0, size, (1, 4, 3 * geometry["chunk_frames"])))
    out = out_dir / "out.wav"
    line = assert_one_line_error(cli("codec-run", "decode", codes, "-m", tiny_export, "-o", out,
                                     "--provider-option", "windows=0"), out)
    assert "option parallel must be auto or a whole number" in line
    one, auto = out_dir / "one.wav", out_dir / "auto.wav"
    for path, extra in ((one, ["--provider-option", "parallel=1"]), (auto, [])):
        proc = cli("codec-run", "decode", codes, "-m", tiny_export, "-o", path, *extra)
        assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(sf.read(one)[0], sf.read(auto)[0])
