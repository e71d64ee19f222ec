"""What the Mimi CLI tests share: the tiny exports (made once a run, through the real console
script), the test clips, cached CLI encodes and the torch references."""

from __future__ import annotations

import functools
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from cli_support import invoke
from shared_exports import cli_export, cli_output, shared
from support import noise

from codecport import registry
from codecport.codecs.mimi.export import rvq_of
from codecport.codecs.mimi.model import PRESETS
from codecport.runtime.audio import read_audio, resample

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
    """The command in this process (cli_support.py): the CLI's contract does not depend on it."""
    return invoke(tool, *args)


def cli(tool: str, *args) -> subprocess.CompletedProcess:
    proc = run(tool, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def assert_one_line_error(proc: subprocess.CompletedProcess, out: Path, usage: bool = False) -> str:
    """The failure contract; returns the error line. `usage`: a usage error (exit 2)."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    if usage:
        assert proc.returncode == 2 and lines == lines[-1:] and lines[-1].startswith("error:"), proc.stderr
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
FIXED_ONLY_LEN = int(registry.get("mimi").smoke[-1])  # samples of the smoke export's fixed graphs
EXPORTS = {  # name -> codec-export arguments (all random-init, seed 0)
    # The main folder: fixed graphs of 960 samples (40 frames) and 2-frame step graphs.
    "main": ("mimi", "--preset", "tiny", "--len", FIXED_LEN, "--step-frames", STEP_FRAMES),
    "in_graph": ("mimi", "--preset", "tiny", "--len", FIXED_LEN, "--step-frames", STEP_FRAMES,
                 "--in-graph-quantizer", "--codebooks", 3),
}


@pytest.fixture(scope="session")
def exports(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """Every folder the tests use, exported through the CLI once a run (shared_exports.py)."""
    done = {}
    for name, args in EXPORTS.items():
        folder = shared(tmp_path_factory, f"mimi-cli-{name}",
                        lambda out, a=args: cli_export(out, *a, "--seed", 0))
        done[name] = folder, cli_output(folder)
    return done


@pytest.fixture(scope="session")
def model_dir(exports) -> Path:
    return exports["main"][0]


@pytest.fixture(scope="session")
def fixed_only(smoke_exports, tmp_path_factory) -> Path:
    """The smoke export (fixed graphs of FIXED_ONLY_LEN samples) without its step graphs: a folder
    exported before codec-export always wrote them."""
    folder = tmp_path_factory.mktemp("mimi_fixed_only")
    for name in ("encoder.onnx", "decoder.onnx", "rvq.npz", "manifest.json"):
        shutil.copy(smoke_exports["mimi"] / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def in_graph(exports) -> Path:
    return exports["in_graph"][0]


@pytest.fixture(scope="session")
def dac_dir(smoke_exports) -> Path:
    """Any DAC folder: the tests give it to Mimi's commands, which must refuse it."""
    return smoke_exports["dac"]


@pytest.fixture(scope="session")
def clips(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mimi_clips")
    return {name: write_wav(root / f"{name}.wav", noise(n, channels=ch, seed=seed), sr)
            for name, (n, sr, ch, seed) in CLIPS.items()}


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
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
