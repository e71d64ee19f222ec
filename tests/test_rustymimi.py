"""Our Mimi graphs against Kyutai's Rust Mimi (rustymimi, built on candle): an implementation
independent of ours, of moshi's torch code and of transformers.

rustymimi builds the released Mimi's config whatever its file holds, so these tests use that
config with seeded random weights, saved in moshi's safetensors format (moshi's key names are
ours). It has its own streaming path, which the step graphs are checked against step by step.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from shared_exports import ONE_THREAD, skipped_init
from support import noise

from codecport.codecs.mimi.export import export_mimi
from codecport.codecs.mimi.model import PRESETS, MimiModel
from codecport.codecs.mimi.runtime import MimiCodec

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sys.version_info >= (3, 14),
                                reason="rustymimi publishes no wheel for Python 3.14 yet"),
              pytest.mark.usefixtures("torch_one_thread")]

FRAMES = 20  # 1.6 s: 40 transformer positions, well inside the 250-position window
LONG = 140  # 11.2 s: 280 positions, past it
K = 8  # Moshi's codebooks, rustymimi's default


@pytest.fixture(scope="module")
def released(released_mimi):
    """(moshi-format weights file, exported folder) of the released config, random weights,
    shared with the other tests of the released config (shared_exports.py); its fixed graphs
    take clips up to 2 s, which a causal codec pads without changing the frames before."""
    return released_mimi


@pytest.fixture
def tokenizer(released):
    import rustymimi

    return rustymimi.Tokenizer(str(released[0]), num_codebooks=K)


@pytest.fixture(scope="module")
def clip(released) -> np.ndarray:
    return noise(FRAMES * MimiCodec(released[1]).frame_size, seed=4)


@pytest.fixture(scope="module")
def past_the_window(released) -> tuple[np.ndarray, np.ndarray]:
    """(LONG frames of audio, rustymimi's codes for it): the two tests past the window read the
    same clip's codes, encoded once."""
    import rustymimi

    clip = noise(LONG * PRESETS["mimi"].frame_size, seed=4)
    codes = rustymimi.Tokenizer(str(released[0]), num_codebooks=K).encode(clip[None]).astype(np.int64)
    assert codes.shape == (1, K, LONG)
    return clip, codes


def test_fixed_graphs_equal_rustymimi(released, tokenizer, clip):
    codec = MimiCodec(released[1], options=ONE_THREAD)
    theirs = tokenizer.encode(clip[None]).astype(np.int64)
    assert theirs.shape == (1, K, FRAMES)
    # Exact: a code that differs means a different latent (or a near-tie the seed avoids).
    np.testing.assert_array_equal(codec.encode(clip, codec.sample_rate).data, theirs)
    np.testing.assert_allclose(codec.decode(theirs)[0], tokenizer.decode(theirs.astype(np.uint32))[0],
                               atol=1e-4)


def test_step_graphs_equal_rustymimi_streaming(released, tokenizer, clip):
    """One 80 ms frame at a time through both streaming paths, state carried by each."""
    stream = MimiCodec(released[1], options=ONE_THREAD).stream()
    assert stream.step_samples == clip.shape[1] // FRAMES
    codes, ours, theirs = [], [], []
    for i in range(FRAMES):
        frame = clip[:, i * stream.step_samples:(i + 1) * stream.step_samples]
        c = stream.encode_step(frame)
        np.testing.assert_array_equal(c, tokenizer.encode_step(frame[None])[0].astype(np.int64),
                                      err_msg=f"step {i}")
        codes.append(c)
    tokenizer.reset()
    for c in codes:
        ours.append(stream.decode_step(c[None]))
        theirs.append(tokenizer.decode_step(np.ascontiguousarray(c[None].astype(np.uint32)))[0, 0])
    np.testing.assert_allclose(np.concatenate(ours), np.concatenate(theirs), atol=1e-4)


def test_past_the_window_rustymimi_attends_to_one_more_position(released, past_the_window):
    """moshi (and transformers, and our graphs) let a query see keys 0..249 positions back;
    candle also keeps the key 250 back (candle-nn's rotating KV cache masks a key only when
    `pos_cache + context < pos_src`). The two official implementations part after 250
    transformer positions (10 s), and rustymimi then equals our model with a context of 251."""
    clip, theirs = past_the_window
    theirs = theirs[0]
    sd = load_file(str(released[0]))
    ours = {}
    for context in (250, 251):
        with skipped_init():  # every weight is loaded next
            model = MimiModel(replace(PRESETS["mimi"], context=context)).eval()
        model.load_state_dict(sd)
        with torch.no_grad():
            ours[context] = model.encode(torch.from_numpy(clip)[None], K)[0].numpy()
    same = (ours[250] == theirs).all(axis=0)
    assert same[:125].all()  # the first 250 positions see the same keys
    assert not same.all()
    np.testing.assert_array_equal(ours[251], theirs)


@pytest.fixture(scope="module")
def rusty_window(released, tmp_path_factory):
    """The released config's step graphs exported with `--attention rustymimi`. (Its fixed graphs
    for LONG frames took a minute and a half to export; that they equal the step graphs and the
    torch model with one key more is test_mimi_export's `test_rustymimi_window`.)"""
    with skipped_init():  # every weight is loaded next
        model = MimiModel(PRESETS["mimi"]).eval()
    model.load_state_dict(load_file(str(released[0])))
    out = tmp_path_factory.mktemp("rustymimi-window") / "onnx"
    export_mimi(model, out, None, 1, preset="mimi", weights="random-init seed 3", weights_sha256="none",
                attention="rustymimi")
    return out


def test_rustymimi_window_equals_rustymimi_past_the_window(rusty_window, tokenizer, past_the_window):
    """`--attention rustymimi` step graphs give rustymimi's codes past 250 positions, where the
    default ones part from it (the test above), streamed frame by frame; and its audio for them.
    (rustymimi's own streaming equals its whole clip.)"""
    codec = MimiCodec(rusty_window, options=ONE_THREAD)
    clip, theirs = past_the_window
    np.testing.assert_array_equal(codec.encode(clip, codec.sample_rate, mode="step").data, theirs)
    audio = tokenizer.decode(theirs.astype(np.uint32))[0]
    np.testing.assert_allclose(codec.decode(theirs, mode="step")[0], audio, atol=1e-4)
