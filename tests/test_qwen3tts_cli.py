"""Qwen3-TTS tokenizer through the real console scripts on the tiny smoke export: encode files of
any rate to `[channels, 16, frames]` codes (the official `[frames, 16]` transposed), decode every
codes layout the docs name back to 24 kHz, and `info`."""

from __future__ import annotations

import json

import numpy as np
import soundfile as sf
import torch
from cli_support import process
from support import noise

import codecport
from codecport.codecs.qwen3tts.model import PRESETS, Qwen3Model, init_random

HOP = PRESETS["tiny"].frame_size


def _torch_codes(x: np.ndarray) -> np.ndarray:
    model = init_random(Qwen3Model(PRESETS["tiny"]), 0).eval()
    with torch.no_grad():
        return model.encode(torch.from_numpy(x)[None]).numpy()[0]


def test_encode_then_decode_every_layout(smoke_exports, tmp_path):
    folder = smoke_exports["qwen3tts"]
    x = noise(300, seed=3)
    sf.write(tmp_path / "clip.wav", x[0], 24000, subtype="FLOAT")
    r = process("codec-run", "encode", tmp_path / "clip.wav", "-m", folder, "-o", tmp_path / "codes.npy")
    assert r.returncode == 0 and "[fixed graph]" in r.stdout, r.stderr
    codes = np.load(tmp_path / "codes.npy")
    assert codes.shape == (1, 4, -(-300 // HOP)) and codes.dtype == np.int64
    np.testing.assert_array_equal(codes[0], _torch_codes(x))
    want, _ = codecport.load(folder).decode(codes)
    for name, array in (("three.npy", codes), ("two.npy", codes[0])):
        np.save(tmp_path / name, array)
        out = tmp_path / f"{name}.wav"
        r = process("codec-run", "decode", tmp_path / name, "-m", folder, "-o", out)
        assert r.returncode == 0, r.stderr
        y, sr = sf.read(out, dtype="float32", always_2d=True)
        assert sr == 24000 and y.shape == (codes.shape[2] * HOP, 1)
        assert np.abs(y[:, 0] - want[0]).max() < 2 ** -14  # 16-bit PCM
    r = process("codec-run", "encode", tmp_path / "clip.wav", "-m", folder, "-o", tmp_path / "codes.npz")
    r = process("codec-run", "decode", tmp_path / "codes.npz", "-m", folder, "-o", tmp_path / "back.wav")
    assert r.returncode == 0, r.stderr
    y, sr = sf.read(tmp_path / "back.wav", dtype="float32")
    assert sr == 24000 and y.shape == (300,)  # the npz keeps the clip's length and rate


def test_another_rate_is_resampled_to_24khz(smoke_exports, tmp_path):
    sf.write(tmp_path / "clip16.wav", noise(160, seed=4)[0], 16000, subtype="FLOAT")
    r = process("codec-run", "encode", tmp_path / "clip16.wav", "-m", smoke_exports["qwen3tts"],
                "-o", tmp_path / "c.npz", "-v")
    assert r.returncode == 0 and "resampling 16000 Hz -> 24000 Hz" in r.stderr, r.stderr
    z = np.load(tmp_path / "c.npz")
    assert int(z["sample_rate"]) == 16000 and z["codes_0"].shape == (1, 4, 240 // HOP)


def test_info(smoke_exports):
    r = process("codec-run", "info", smoke_exports["qwen3tts"], "--json")
    info = json.loads(r.stdout)
    assert info["manifest"]["codec"] == "qwen3tts" and info["manifest"]["preset"] == "tiny"
    assert {g["mode"] for g in info["graphs"].values()} >= {"fixed", "step"}
