"""w2v-BERT's input features in numpy (codecs/neucodec/fbank.py) against transformers'
SeamlessM4TFeatureExtractor, called as NeuCodec calls it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import noise
from transformers import SeamlessM4TFeatureExtractor
from transformers.audio_utils import mel_filter_bank

from codecport.codecs.neucodec.fbank import Fbank, mel_filters
from codecport.errors import CodesError


def test_the_filter_bank_is_transformers():
    want = mel_filter_bank(num_frequency_bins=257, num_mel_filters=80, min_frequency=20, max_frequency=8000,
                           sampling_rate=16000, norm=None, mel_scale="kaldi", triangularize_in_mel_space=True)
    np.testing.assert_allclose(mel_filters(), want, atol=1e-7)


@pytest.mark.parametrize("n", [560, 720, 16000, 16320 + 1234, 48000])  # two frames, three (odd), more
def test_features_are_transformers(n):
    audio = noise(n, seed=n)[0]
    # NeuCodec hands the extractor a [1, T] tensor of each clip.
    want = SeamlessM4TFeatureExtractor()(torch.from_numpy(audio)[None], sampling_rate=16000,
                                         return_tensors="np").input_features[0]
    fb = Fbank()
    got = fb.features(audio)
    assert got.shape == want.shape == (fb.frames(n), 160) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_shorter_than_two_frames_is_refused():
    """One frame has no variance: transformers gives NaN features; we say why instead."""
    assert np.isnan(SeamlessM4TFeatureExtractor()(torch.zeros(1, 400).normal_(), sampling_rate=16000,
                                                  return_tensors="np").input_features).any()
    with pytest.raises(CodesError, match="fewer than two 25 ms frames"):
        Fbank().features(np.zeros(559, np.float32))


@pytest.mark.parametrize("pad,extra", [(0, 1), (160, 0)])  # NeuCodec's alignment, XCodec2's
def test_graph_features_are_the_numpy_ones_on_the_masked_clip(pad, extra):
    """codecs/neucodec/ingraph.py's features (what in-graph and browser encoders compute) of a clip
    shorter than the graph: the runtime's within 1e-4 on its frames, zero past them, whatever
    audio lies past the clip."""
    from codecport.codecs.neucodec.ingraph import FbankFeatures

    frames, valid = 25, 17
    x = noise((frames + extra) * 320, seed=4)[0]
    clip = x[:(valid + extra) * 320]
    mask = np.zeros((1, 1, frames), np.float32)
    mask[..., :valid] = 1
    with torch.no_grad():
        got = FbankFeatures(pad, 320, extra)(torch.from_numpy(x[None, None]),
                                             torch.from_numpy(mask)).numpy()[0]
    assert got.shape == (frames, 160)
    np.testing.assert_allclose(got[:valid], Fbank().features(np.pad(clip, pad)), atol=1e-4, rtol=0)
    assert not got[valid:].any()
