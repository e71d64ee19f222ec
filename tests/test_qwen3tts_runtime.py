"""Qwen3-TTS tokenizer on ONNX Runtime (the tiny preset's smoke export, seeded random weights)
against our torch reference: codes identical for any clip the encoder holds, the whole clip's
audio from the fixed decoder and from the step graph, the decoder stream exact in any split, and
the official chunking where asked for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import noise

import codecport
from codecport.codecs.qwen3tts.model import PRESETS, Qwen3Model, init_random
from codecport.codecs.qwen3tts.runtime import CHUNK, CONTEXT, windows
from codecport.errors import CodecportError, CodesError

HOP = PRESETS["tiny"].frame_size
LEN = 480  # the smoke export's --len (codecs/qwen3tts/spec.py)


@pytest.fixture(scope="module")
def model():
    return init_random(Qwen3Model(PRESETS["tiny"]), 0).eval()


@pytest.fixture(scope="module")
def codec(smoke_exports):
    return codecport.load(smoke_exports["qwen3tts"])


def torch_decode(model, codes: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.decode(torch.from_numpy(codes)[None]).numpy()[0, 0]


@pytest.mark.parametrize("n", [1, HOP - 1, HOP, 7 * HOP + 5, LEN - 1, LEN])
def test_codes_equal_torch_for_any_clip_the_encoder_holds(codec, model, n):
    x = noise(n, seed=n)
    codes = codec.encode(x, 24000)
    with torch.no_grad():
        want = model.encode(torch.from_numpy(x)[None]).numpy()
    assert codes.mode == "fixed" and codes.data.shape == (1, 4, -(-n // HOP))
    np.testing.assert_array_equal(codes.data[0], want[0])


def test_a_clip_past_the_encoder_goes_through_overlapping_windows(codec, model, caplog):
    """Past the fixed encoder (whose attention sees the whole clip) no window is exact: the first
    window is the clip's own start, each next one the torch encode of its own audio, keeping the
    frames after its half-window of context; the fixed mode refuses, saying what to do."""
    n = 3 * LEN + 100
    x = noise(n, seed=9)
    codes = codec.encode(x, 24000)
    frames, width = -(-n // HOP), LEN // HOP
    assert codes.mode == "windowed" and codes.data.shape == (1, 4, frames)
    assert "not the official codes exactly" in caplog.text
    padded = np.pad(x, ((0, 0), (0, 4 * LEN)))
    for start, (a, b) in zip(*windows(frames, width)):
        cut = padded[:, start * HOP:min(start * HOP + LEN, n)]
        with torch.no_grad():
            want = model.encode(torch.from_numpy(cut)[None]).numpy()[0]
        np.testing.assert_array_equal(codes.data[0][:, a:b], want[:, a - start:b - start])
    with pytest.raises(CodesError, match="export with a longer --len, or use the windowed mode"):
        codec.encode(x, 24000, mode="fixed")


def test_windows_cover_every_frame_once():
    starts, keeps = windows(45, 20)
    assert starts == [0, 10, 20, 30] and keeps == [(0, 20), (20, 30), (30, 40), (40, 45)]
    assert windows(7, 20) == ([0], [(0, 7)])


def test_no_encoder_stream(codec):
    assert codec.streams == ("decoder",)
    with pytest.raises(CodecportError, match="no encoder stream"):
        codec.encoder_stream()


@pytest.mark.parametrize("frames", [1, LEN // HOP, LEN // HOP + 1, 3 * LEN // HOP + 7])
def test_decode_is_the_whole_clips_audio(codec, model, frames):
    codes = np.random.default_rng(frames).integers(0, 64, (4, frames))
    want = torch_decode(model, codes)
    audio, sr = codec.decode(codes[None])
    assert sr == 24000 and audio.shape == (1, frames * HOP)
    np.testing.assert_allclose(audio[0], want, rtol=0, atol=1e-5)
    step, _ = codec.decode(codes[None], mode="step")
    np.testing.assert_allclose(step[0], want, rtol=0, atol=1e-5)


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=8).filter(any))
def test_the_stream_in_any_split_is_the_whole_clip(codec, model, sizes):
    total = sum(sizes)
    codes = np.random.default_rng(total).integers(0, 64, (4, total))
    s = codec.decoder_stream()
    pieces, at = [], 0
    for n in sizes:
        pieces.append(s.push(codes[:, at:at + n]))
        at += n
    pieces.append(s.flush())
    got = np.concatenate(pieces)
    assert got.shape == (total * HOP,)
    np.testing.assert_allclose(got, torch_decode(model, codes), rtol=0, atol=1e-5)


def test_chunked_needs_a_decoder_of_the_officials_chunk(codec):
    with pytest.raises(CodesError, match=f"--len {(CHUNK + CONTEXT) * HOP}"):
        codec.decode(np.zeros((1, 4, 3), np.int64), mode="chunked")
