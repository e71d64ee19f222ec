"""`codec-run` on an XCodec2 export: audio at any rate in (resampled to 16 kHz), codes written with
the original rate and length, audio back at that rate and length; info says XCodec2's rates."""

from __future__ import annotations

import numpy as np
import soundfile as sf
from cli_support import invoke
from support import noise

import codecport


def test_encode_then_decode_through_the_cli(smoke_exports, tmp_path):
    model, wav = smoke_exports["xcodec2"], tmp_path / "in.wav"
    sf.write(wav, noise(int(0.3 * 44100), channels=2, seed=12).T, 44100, subtype="FLOAT")
    proc = invoke("codec-run", "encode", wav, "-m", model, "-o", tmp_path / "c.npz")
    assert proc.returncode == 0, proc.stderr
    assert "resampling 44100 Hz -> 16000 Hz" in proc.stderr and "[fixed graph]" in proc.stdout
    codes = codecport.load_codes(tmp_path / "c.npz")
    assert codes.data.shape == (2, 1, int(0.3 * 16000) // 320 + 1) and codes.codec == "xcodec2"
    np.testing.assert_array_equal(codes.data, codecport.load(model).encode(*codecport.read_audio(wav)).data)
    proc = invoke("codec-run", "decode", tmp_path / "c.npz", "-m", model, "-o", tmp_path / "d.wav")
    assert proc.returncode == 0, proc.stderr
    y, sr = sf.read(tmp_path / "d.wav", dtype="float32", always_2d=True)
    assert sr == 44100 and y.shape == (int(0.3 * 44100), 2) and np.abs(y).max() > 1e-3


def test_info_says_both_rates(smoke_exports):
    proc = invoke("codec-run", "info", smoke_exports["xcodec2"])
    assert proc.returncode == 0, proc.stderr
    assert "xcodec2 tiny, 8000 Hz (encodes 16000 Hz), 50 frames/s, 1 codebooks of 64" in proc.stdout
