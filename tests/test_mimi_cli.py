"""Mimi through the real console scripts: export a tiny model, encode and decode files against the
torch reference, and bad input (one `error:` line, exit != 0, nothing written)."""

from __future__ import annotations

import functools
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import noise

from codecport.export.mimi import rvq_of
from codecport.models.mimi import PRESETS
from codecport.runtime.audio import read_audio, resample

BIN = Path(sys.executable).parent
CFG = PRESETS["tiny"]
FRAME = CFG.frame_size  # 24 samples per code frame
SR = CFG.sample_rate  # 24000
K = CFG.n_codebooks  # 4: fewer than Moshi's 8, so all of them is the default
FIXED_LEN = 960  # samples of the main export's fixed graphs (40 frames)
STEP_FRAMES = 2  # code frames per streaming step
GRAPHS = ("encoder.onnx", "decoder.onnx", "encoder_step.onnx", "decoder_step.onnx")
# name -> (samples, sample rate, channels, seed). "short" fits the fixed graph; "long" (2 s at
# 16 kHz: 2000 frames, 4000 transformer positions) goes through the step graphs, past the window.
# The seeds give clips without near-ties between codebook rows (see `min_margin`): ONNX Runtime's
# streamed latent differs from torch's whole-clip one by ~1e-6, which can flip a near-tie.
CLIPS = {
    "short": (900, 24000, 1, 1),
    "long": (32000, 16000, 1, 33),
    "short_stereo": (900, 24000, 2, 3),
    "long_stereo": (12000, 16000, 2, 17),
}
MIN_MARGIN = 5e-6  # squared distance between the nearest and next codebook row, at every level


def run(tool: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *map(str, args)], capture_output=True, text=True,
                          check=False, timeout=120)


def cli(tool: str, *args) -> subprocess.CompletedProcess:
    proc = run(tool, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def assert_one_line_error(proc: subprocess.CompletedProcess, out: Path, usage: bool = False) -> str:
    """The failure contract; returns the error line. `usage`: click's own `Error:` (exit 2)."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    if usage:
        assert proc.returncode == 2 and lines and lines[-1].startswith("Error:"), proc.stderr
    else:
        assert lines and lines[-1].startswith("error:"), proc.stderr
    assert not out.exists()
    if out.parent.is_dir():
        assert not list(out.parent.glob(".*.part"))
    return lines[-1]


def write_wav(path: Path, audio: np.ndarray, sr: int) -> Path:
    sf.write(path, audio.T, sr, subtype="FLOAT")
    return path


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """`([channels, samples], sr)`, checking the decoder wrote float WAV (compared at 1e-4)."""
    assert sf.info(path).subtype == "FLOAT"
    y, sr = sf.read(path, dtype="float32", always_2d=True)
    return y.T, sr


def frames_of(n: int, sr: int) -> int:
    return math.ceil(round(n * SR / sr) / FRAME)


# ---- module fixtures: exports, clips, cached CLI encodes and torch references -------------
EXPORTS = {  # name -> codec-export arguments (all random-init, seed 0)
    # The main folder: fixed graphs of 960 samples (40 frames) and 2-frame step graphs.
    "main": ("mimi", "--variant", "tiny", "--len", FIXED_LEN, "--streaming", "--frames", STEP_FRAMES),
    # Fixed graphs of 96 samples (4 frames), no step graphs.
    "fixed_only": ("mimi", "--variant", "tiny", "--len", 96),
    "in_graph": ("mimi", "--variant", "tiny", "--len", FIXED_LEN, "--streaming", "--frames",
                 STEP_FRAMES, "--in-graph-quantizer", "--codebooks", 3),
    "dac": ("dac", "--variant", "tiny", "--len", 600),
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Every folder the tests use, exported through the CLI by processes run side by side (one
    thread each: on 2 cores that takes about half the time of one after the other)."""
    root = tmp_path_factory.mktemp("mimi_cli")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = {name: subprocess.Popen([str(BIN / "codec-export"), *map(str, args), "--random-init",
                                     "--seed", "0", "-o", str(root / name)], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, args in EXPORTS.items()}
    done = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=300)
            done[name] = root / name, subprocess.CompletedProcess(proc.args, proc.returncode, stdout,
                                                                  stderr)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for name, (_, proc) in done.items():
        assert proc.returncode == 0, f"export {name}: {proc.stdout}{proc.stderr}"
    return done


@pytest.fixture(scope="module")
def model_dir(exports) -> Path:
    return exports["main"][0]


@pytest.fixture(scope="module")
def fixed_only(exports) -> Path:
    return exports["fixed_only"][0]


@pytest.fixture(scope="module")
def in_graph(exports) -> Path:
    return exports["in_graph"][0]


@pytest.fixture(scope="module")
def dac_dir(exports) -> Path:
    return exports["dac"][0]


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mimi_clips")
    return {name: write_wav(root / f"{name}.wav", noise(n, channels=ch, seed=seed), sr)
            for name, (n, sr, ch, seed) in CLIPS.items()}


@pytest.fixture(scope="module")
def encode(tmp_path_factory):
    """`encode(wav, model, *args)` -> (codes, stdout) of `codec-run encode ... -o X.npy`, run once."""
    root = tmp_path_factory.mktemp("mimi_codes")

    @functools.cache
    def run_once(wav: Path, model: Path, *args) -> tuple[np.ndarray, str]:
        out = root / f"{len(list(root.iterdir()))}.npy"
        proc = cli("codec-run", "encode", wav, "-m", model, "-o", out, *args)
        assert f"wrote {out}" in proc.stdout
        return np.load(out), proc.stdout

    return run_once


def at_24k(wav: Path) -> np.ndarray:
    """The file as the CLI reads and resamples it: `[C, N']` at 24 kHz."""
    audio, sr = read_audio(wav)
    return resample(audio, sr, SR)


@pytest.fixture(scope="module")
def torch_codes(tiny_mimi):
    """moshi's procedure on the CLI's weights (tiny_mimi is init_random(tiny, seed=0), as
    `--random-init --seed 0`): zero-pad to whole frames, encode each channel."""
    rvq = rvq_of(tiny_mimi)

    @functools.cache
    def ref(wav: Path) -> np.ndarray:
        x = torch.from_numpy(at_24k(wav))[:, None]
        with torch.no_grad():
            latent = tiny_mimi.encode_latent(tiny_mimi.pad(x))
            codes = tiny_mimi.quantizer.encode(latent, K).numpy()  # = tiny_mimi.encode(pad(x))
        margin = min_margin(rvq, latent.numpy())
        assert margin > MIN_MARGIN, f"{wav.name} has a near-tie ({margin:.2g}); pick another seed"
        return codes

    return ref


def min_margin(rvq, latent: np.ndarray) -> float:
    """Smallest gap between the nearest and the next codebook row over all frames and levels."""
    margin = np.inf
    for z in latent:
        for group, levels in (("semantic", range(rvq.n_semantic)),
                              ("acoustic", range(rvq.n_semantic, rvq.n_codebooks))):
            r = (rvq.a[f"{group}_in_proj"] @ z).T  # [T, D]
            for i in levels:
                dist = ((r[:, None] - rvq.codebook[i][None]) ** 2).sum(-1)  # [T, N]
                two = np.sort(dist, axis=-1)[:, :2]
                margin = min(margin, float((two[:, 1] - two[:, 0]).min()))
                r = r - rvq.codebook[i][dist.argmin(-1)]
    return margin


@pytest.fixture(scope="module")
def torch_audio(tiny_mimi):
    """torch decode `[C, T * 24]` of codes `[C, k, T]` (cached: the long clip takes a second)."""
    cache: dict[tuple, np.ndarray] = {}

    def ref(codes: np.ndarray) -> np.ndarray:
        key = (codes.shape, codes.tobytes())
        if key not in cache:
            with torch.no_grad():
                cache[key] = tiny_mimi.decode(torch.from_numpy(np.ascontiguousarray(codes)))[:, 0].numpy()
        return cache[key]

    return ref


# ---- export and info ----------------------------------------------------------------------
def test_export_writes_the_folder(exports):
    out, proc = exports["main"]
    assert "RANDOM weights (seed 0)" in proc.stdout
    assert f"fixed graphs : {FIXED_LEN} samples" in proc.stdout
    assert f"step graphs  : {STEP_FRAMES * FRAME} samples <-> {STEP_FRAMES} frames" in proc.stdout
    validated = [ln.split()[0] for ln in proc.stdout.splitlines() if "validated vs torch" in ln]
    assert sorted(validated) == sorted(GRAPHS)
    for name in ("rvq.npz", "manifest.json"):
        assert name in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted([*GRAPHS, "rvq.npz", "manifest.json"])


def test_info_says_mimi(model_dir):
    out = cli("codec-run", "info", model_dir).stdout
    for name in GRAPHS:
        assert f"{model_dir / name}:" in out
    assert out.count('"codec": "mimi"') == len(GRAPHS)
    assert '"variant": "tiny"' in out and '"quantizer": "numpy"' in out


# ---- encode -------------------------------------------------------------------------------
@pytest.mark.parametrize("clip, mode", [("short", "fixed graph"), ("long", "streaming step graphs")])
def test_codes_equal_torch_encode(clips, model_dir, encode, torch_codes, clip, mode):
    n, sr, _, _ = CLIPS[clip]
    codes, stdout = encode(clips[clip], model_dir)
    assert codes.shape == (1, K, frames_of(n, sr)) and codes.dtype == np.int64
    assert (f"resampling {sr} Hz -> {SR} Hz" in stdout) == (sr != SR)
    assert f"[{mode}]" in stdout
    want = torch_codes(clips[clip])
    np.testing.assert_array_equal(codes, want)
    assert len(np.unique(codes)) > 20  # spread-out codes: the comparison means something


@pytest.mark.parametrize("clip", ["short", "long"])
def test_streaming_flag_gives_the_same_codes(clips, model_dir, encode, clip):
    codes, _ = encode(clips[clip], model_dir)
    streamed, stdout = encode(clips[clip], model_dir, "--streaming")
    assert "[streaming step graphs]" in stdout
    np.testing.assert_array_equal(streamed, codes)


@pytest.mark.parametrize("clip", ["short", "long"])
def test_fewer_codebooks_are_a_prefix(clips, model_dir, encode, clip):
    codes, _ = encode(clips[clip], model_dir)
    two, stdout = encode(clips[clip], model_dir, "--codebooks", 2)
    assert two.shape == (1, 2, codes.shape[2])
    assert f"codes [1, 2, {codes.shape[2]}]" in stdout
    np.testing.assert_array_equal(two, codes[:, :2])


@pytest.mark.parametrize("clip", ["short_stereo", "long_stereo"])
def test_stereo_channels_are_encoded_alone(tmp_path, clips, model_dir, encode, clip):
    n, sr, _, _ = CLIPS[clip]
    codes, stdout = encode(clips[clip], model_dir)
    assert codes.shape == (2, K, frames_of(n, sr))
    assert f"2 ch x {n} samples @ {sr} Hz" in stdout
    audio, _ = read_audio(clips[clip])
    for c in range(2):
        mono, _ = encode(write_wav(tmp_path / f"ch{c}.wav", audio[c:c + 1], sr), model_dir)
        np.testing.assert_array_equal(codes[c:c + 1], mono)
    assert not np.array_equal(codes[0], codes[1])


# ---- decode -------------------------------------------------------------------------------
@pytest.mark.parametrize("clip", ["short", "long"])
@pytest.mark.parametrize("streaming", [False, True])
def test_npy_decode_equals_torch_decode(tmp_path, clips, model_dir, encode, torch_audio, clip, streaming):
    codes, _ = encode(clips[clip], model_dir)
    np.save(tmp_path / "c.npy", codes)
    out = tmp_path / "out.wav"
    proc = cli("codec-run", "decode", tmp_path / "c.npy", "-m", model_dir, "-o", out,
               *(["--streaming"] if streaming else []))
    y, sr = read_wav(out)
    n = codes.shape[2] * FRAME
    assert (sr, y.shape) == (SR, (1, n))
    assert f"1 ch x {n} samples @ {SR} Hz" in proc.stdout
    ref = torch_audio(codes)
    assert np.abs(ref).max() > 1e-2  # audio-scale output, not near-silence
    assert np.abs(y - np.clip(ref, -1, 1)).max() <= 1e-4


def test_fewer_codebooks_decode_equals_torch(tmp_path, clips, model_dir, encode, torch_audio):
    two, _ = encode(clips["short"], model_dir, "--codebooks", 2)
    np.save(tmp_path / "two.npy", two)
    cli("codec-run", "decode", tmp_path / "two.npy", "-m", model_dir, "-o", tmp_path / "o.wav")
    y, _ = read_wav(tmp_path / "o.wav")
    assert np.abs(y - np.clip(torch_audio(two), -1, 1)).max() <= 1e-4


@pytest.mark.parametrize("clip", ["short", "long", "long_stereo"])
def test_npz_round_trip_gives_the_original_length_and_rate(tmp_path, clips, model_dir, encode,
                                                           torch_audio, clip):
    n, sr, ch, _ = CLIPS[clip]
    npz = tmp_path / "c.npz"
    cli("codec-run", "encode", clips[clip], "-m", model_dir, "-o", npz)
    with np.load(npz, allow_pickle=False) as z:
        assert str(z["codec"]) == "mimi" and (int(z["length"]), int(z["sample_rate"])) == (n, sr)
        codes = z["codes"]
    np.testing.assert_array_equal(codes, encode(clips[clip], model_dir)[0])

    out = tmp_path / "out.wav"
    proc = cli("codec-run", "decode", npz, "-m", model_dir, "-o", out)
    assert f"{ch} ch x {n} samples @ {sr} Hz" in proc.stdout
    y, sr_out = read_wav(out)
    assert (sr_out, y.shape) == (sr, (ch, n))
    # What the CLI does: decode at 24 kHz, resample back, trim to the original length.
    want = np.clip(resample(torch_audio(codes), SR, sr)[:, :n], -1, 1)
    assert np.abs(y - want).max() <= 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz", "out.wav"]  # no .part left


# ---- in-graph quantizer -------------------------------------------------------------------
def test_in_graph_quantizer_export(exports):
    out, proc = exports["in_graph"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*GRAPHS, "manifest.json"])  # no rvq.npz
    assert sum("codes identical" in ln for ln in proc.stdout.splitlines()) == 2
    info = cli("codec-run", "info", out).stdout
    assert info.count('"quantizer": "graph"') == info.count('"n_codebooks": "3"') == len(GRAPHS)


@pytest.mark.parametrize("clip", ["short", "long"])
def test_in_graph_quantizer_encode_decode(tmp_path, clips, in_graph, encode, torch_codes, torch_audio,
                                          clip):
    codes, _ = encode(clips[clip], in_graph)  # default: all 3 the graphs hold
    assert codes.shape == (1, 3, frames_of(*CLIPS[clip][:2]))
    # Residual levels are nested: torch's codes with 3 levels are the first 3 of all 4.
    np.testing.assert_array_equal(codes, torch_codes(clips[clip])[:, :3])
    if clip == "short":
        streamed, stdout = encode(clips[clip], in_graph, "--streaming")
        assert "[streaming step graphs]" in stdout
        np.testing.assert_array_equal(streamed, codes)

    np.save(tmp_path / "c.npy", codes)
    cli("codec-run", "decode", tmp_path / "c.npy", "-m", in_graph, "-o", tmp_path / "o.wav")
    y, sr = read_wav(tmp_path / "o.wav")
    assert (sr, y.shape) == (SR, (1, codes.shape[2] * FRAME))
    assert np.abs(y - np.clip(torch_audio(codes), -1, 1)).max() <= 1e-4


def test_in_graph_quantizer_refuses_other_codebook_counts(tmp_path, clips, in_graph):
    out = tmp_path / "c.npy"
    proc = run("codec-run", "encode", clips["short"], "-m", in_graph, "-o", out, "--codebooks", 4)
    assert "between 1 and 3, got 4" in assert_one_line_error(proc, out)
    np.save(tmp_path / "two.npy", np.zeros((1, 2, 5), np.int64))
    out = tmp_path / "o.wav"
    proc = run("codec-run", "decode", tmp_path / "two.npy", "-m", in_graph, "-o", out)
    assert "exactly 3 codebooks, got 2" in assert_one_line_error(proc, out)


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
    for args in ((), ("--streaming",)):
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
    assert ".npy or .npz" in assert_one_line_error(proc, out)


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


@pytest.mark.parametrize("what", ["garbage", "truncated", "no-codec-key", "bare-npy", "pickled"])
def test_npz_that_is_not_a_codes_file(tmp_path, out_dir, model_dir, what):
    codes = np.zeros((1, K, 3), np.int64)
    path = tmp_path / "c.npz"
    if what == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(3000))
    elif what == "truncated":
        with open(path, "wb") as f:
            np.savez(f, codes=codes, length=np.int64(72), sample_rate=np.int64(SR), codec=np.array("mimi"))
        path.write_bytes(path.read_bytes()[:200])
    elif what == "no-codec-key":
        np.savez(path, codes=codes, length=np.int64(72), sample_rate=np.int64(SR))
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
def test_streaming_with_a_dac_folder_is_a_usage_error(tmp_path, out_dir, clips, dac_dir, command):
    if command == "encode":
        src, out = clips["short"], out_dir / "c.npy"
    else:
        src, out = tmp_path / "c.npy", out_dir / "o.wav"
        np.save(src, np.zeros((1, 4, 100), np.int64))
    proc = run("codec-run", command, src, "-m", dac_dir, "-o", out, "--streaming")
    assert "--streaming is for Mimi" in assert_one_line_error(proc, out, usage=True)


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
    write_wav(tmp_path / "fits.wav", noise(96), SR)
    cli("codec-run", "encode", tmp_path / "fits.wav", "-m", fixed_only, "-o", ok)
    assert np.load(ok).shape == (1, K, 4)
    out = out_dir / "c.npz"
    proc = run("codec-run", "encode", clips["short"], "-m", fixed_only, "-o", out)
    assert "--streaming" in assert_one_line_error(proc, out)
    np.save(tmp_path / "long.npy", np.zeros((1, K, 5), np.int64))
    out = out_dir / "o.wav"
    proc = run("codec-run", "decode", tmp_path / "long.npy", "-m", fixed_only, "-o", out)
    assert "--streaming" in assert_one_line_error(proc, out)


@pytest.mark.parametrize("command", ["encode", "decode"])
def test_streaming_flag_on_fixed_only_folder(tmp_path, out_dir, fixed_only, command):
    if command == "encode":
        src, out = write_wav(tmp_path / "in.wav", noise(50), SR), out_dir / "c.npy"
    else:
        src, out = tmp_path / "c.npy", out_dir / "o.wav"
        np.save(src, np.zeros((1, K, 2), np.int64))
    line = assert_one_line_error(run("codec-run", command, src, "-m", fixed_only, "-o", out,
                                     "--streaming"), out)
    assert "--streaming" in line
    assert "longer than" not in line and "more than" not in line


# ---- codec-export mimi --------------------------------------------------------------------
@pytest.mark.parametrize("args, match", [
    ((), "--len"),
    (("--len", 96, "--codebooks", 2), "--in-graph-quantizer"),
    (("--len", 0), "--len"),
    (("--streaming", "--frames", 0), "--frames"),
], ids=["no-len-no-streaming", "codebooks-without-in-graph", "len-0", "frames-0"])
def test_export_usage_errors(tmp_path, args, match):
    out = tmp_path / "exported"
    proc = run("codec-export", "mimi", "--variant", "tiny", "--random-init", *args, "-o", out)
    assert match in assert_one_line_error(proc, out, usage=True)


def test_export_too_many_in_graph_codebooks(tmp_path):
    out = tmp_path / "exported"
    proc = run("codec-export", "mimi", "--variant", "tiny", "--random-init", "--len", 96,
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
    proc = run("codec-export", "mimi", "--variant", "tiny", "--len", 96, "--weights", path, "-o", out)
    line = assert_one_line_error(proc, out)
    assert str(path) in line
    assert ("safetensors" if weights == "pth" else "no such file") in line
