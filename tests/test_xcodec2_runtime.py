"""XCodec2 on ONNX Runtime (codecs/xcodec2/runtime.py: NeuCodec's runtime on XCodec2's alignment) against
its torch reference on the same weights (the smoke export's seeded tiny model): `n // 320 + 1`
codes for `n` samples, as the official `encode_code` gives, and the reference's codes and audio
on a clip alone at every length below the window; past it, windows each a clip alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import noise

import codecport
from codecport.codecs.neucodec.facts import torch_codes
from codecport.codecs.xcodec2.config import PRESETS
from codecport.codecs.xcodec2.model import MODEL, init_random


@pytest.fixture(scope="module")
def codec(smoke_exports):
    return codecport.load(smoke_exports["xcodec2"])


@pytest.fixture(scope="module")
def reference():
    return init_random(MODEL(PRESETS["tiny"]), seed=0).eval()  # what `--random-init` exports


def _codes(model, x: np.ndarray) -> np.ndarray:
    return np.concatenate([torch_codes(model, torch.from_numpy(row)[None, None], 1)[0] for row in x])


@pytest.mark.parametrize("samples", [1, 319, 320, 3333, 24 * 320 + 319])  # up to the window's 25 frames
def test_a_clip_that_fits_is_the_reference_on_the_clip_alone(codec, reference, samples):
    x = noise(samples, channels=2, seed=samples)
    codes = codec.encode(x, 16000)
    assert codes.mode == "fixed" and codes.data.shape == (2, 1, samples // 320 + 1)
    np.testing.assert_array_equal(codes.data, _codes(reference, x))
    audio, sr = codec.decode(codes.data)
    with torch.no_grad():
        ref = reference.decode(torch.from_numpy(codes.data)).numpy()[:, 0]
    assert sr == 8000 and audio.shape == ref.shape == (2, (samples // 320 + 1) * 160)
    np.testing.assert_allclose(audio, ref, atol=1e-5)
    back, sr = codec.decode(codes)  # with the clip's facts: its rate and length
    assert sr == 16000 and back.shape == x.shape


def test_a_longer_clip_goes_through_windows_each_a_clip_alone(codec, reference):
    window, overlap, hop = codec.frames, codec.overlap, 320
    step = window - overlap
    x = noise(3 * window * hop + 77, seed=9)[0]
    codes = codec.encode(x, 16000)
    n = x.size // hop + 1
    assert codes.mode == "windowed" and codes.data.shape == (1, 1, n)
    # Window k is the clip of its first `window - 1` frames alone (the pad makes its last frame).
    for k, start in enumerate(range(0, n - overlap, step)):
        alone = _codes(reference, x[None, start * hop:(start + window - 1) * hop])
        lo = 0 if k == 0 else overlap // 2
        hi = min(step + overlap // 2, n - start)
        np.testing.assert_array_equal(codes.data[..., start + lo:start + hi], alone[..., lo:hi])
