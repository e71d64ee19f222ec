"""`codec-run` on a NeuCodec export: audio at any rate in (resampled to the 16 kHz the encoder
takes), `[channels, frames]` codes in `.npz` with the original rate and length, audio back at that
rate and length; the windowed mode for a clip past the graphs, said in the summary; info."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from cli_support import invoke
from support import noise

import codecport


def run(*args):
    """`codec-run ARGS` in this process (cli_support.py)."""
    return invoke("codec-run", *args)


@pytest.fixture(scope="module")
def wav(tmp_path_factory):
    path = tmp_path_factory.mktemp("neucodec_cli") / "in.wav"
    sf.write(path, noise(int(0.3 * 22050), channels=2, seed=12).T, 22050, subtype="FLOAT")
    return path


def test_encode_resamples_to_16k_and_keeps_the_original_rate_and_length(smoke_exports, wav, tmp_path):
    model = smoke_exports["neucodec"]
    out = tmp_path / "c.npz"
    proc = run("encode", wav, "-m", model, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "resampling 22050 Hz -> 16000 Hz" in proc.stderr and "[fixed graph]" in proc.stdout
    z = np.load(out)
    assert int(z["sample_rate"]) == 22050 and int(z["num_samples"]) == int(0.3 * 22050)
    codes = codecport.load(model).encode(*codecport.read_audio(wav))
    assert codes.data.shape == (2, 1, int(0.3 * 16000) // 320)
    np.testing.assert_array_equal(codecport.load_codes(out).data, codes.data)
    dec = tmp_path / "d.wav"
    proc = run("decode", out, "-m", model, "-o", dec)
    assert proc.returncode == 0, proc.stderr
    y, sr = sf.read(dec, dtype="float32", always_2d=True)
    assert sr == 22050 and y.shape == (int(0.3 * 22050), 2) and np.abs(y).max() > 1e-3
    want, _ = codecport.load(model).decode(codes)
    np.testing.assert_allclose(y.T, want, atol=1e-5)


def test_a_clip_past_the_graphs_is_windowed_or_refused(smoke_exports, tmp_path):
    model, long = smoke_exports["neucodec"], tmp_path / "long.wav"
    sf.write(long, noise(40000, seed=3)[0], 16000, subtype="FLOAT")  # 2.5 s; the graphs hold 0.5 s
    proc = run("encode", long, "-m", model, "-o", tmp_path / "f.npz", "--mode", "fixed")
    assert proc.returncode == 1 and "re-export with --len 20000 or more" in proc.stderr and \
        not (tmp_path / "f.npz").exists()
    proc = run("encode", long, "-m", model, "-o", tmp_path / "w.npz")
    assert proc.returncode == 0 and "[cross-faded windows, not the whole-clip result]" in proc.stdout
    assert codecport.load_codes(tmp_path / "w.npz").data.shape == (1, 1, 125)
    proc = run("decode", tmp_path / "w.npz", "-m", model, "-o", tmp_path / "w.wav")
    assert proc.returncode == 0, proc.stderr
    y, sr = sf.read(tmp_path / "w.wav", dtype="float32")
    assert sr == 16000 and y.shape == (40000,)


def test_info_says_both_rates(smoke_exports):
    proc = run("info", smoke_exports["neucodec"])
    assert proc.returncode == 0, proc.stderr
    assert "neucodec tiny, 8000 Hz (encodes 16000 Hz), 50 frames/s, 1 codebooks of 64" in proc.stdout
