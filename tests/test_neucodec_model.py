"""NeuCodec's decoder in torch (models/neucodec.py) against the official `neucodec` package, on
the released architecture with shared random weights: the official `decode_code` path (FSQ
indices -> `project_out` -> `fc_post_a` -> `CodecDecoderVocos`) gives the same audio."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from conftest import official_neucodec

from codecport.models.neucodec import PRESETS, NeuCodec, fsq_codes, init_random


@pytest.fixture(scope="module")
def pair():
    """(ours, the official decoder objects) on the same weights, the released sizes."""
    nc = official_neucodec()
    torch.manual_seed(0)
    generator = nc.codec_decoder_vocos.CodecDecoderVocos(hop_length=480).eval()
    fc_post_a = torch.nn.Linear(2048, 1024)
    official = types.SimpleNamespace(generator=generator, fc_post_a=fc_post_a)
    ours = init_random(NeuCodec(PRESETS["neucodec"]), seed=1).eval()
    sd = {f"generator.{k}": v for k, v in generator.state_dict().items()}
    sd.update({f"fc_post_a.{k}": v for k, v in fc_post_a.state_dict().items()})
    # The official state dict, as the official model holds it, loads into ours key for key.
    missing, unexpected = ours.load_state_dict(sd, strict=False)
    assert not missing and set(unexpected) <= set(NeuCodec.IGNORED), (missing, unexpected)
    # Random init gives constant codes downstream; spread the weights as a trained model's are.
    with torch.no_grad():
        init_random(ours, seed=1)
        # Sharp attention (so positions matter) and some magnitudes past the head's clip at 100.
        for block in ours.generator.backbone.transformers:
            block.att.c_attn.weight.mul_(2)
        ours.generator.head.out.bias[:200].add_(5.0)
        generator.load_state_dict({k[len("generator."):]: v for k, v in ours.state_dict().items()
                                   if k.startswith("generator.")}, strict=False)
        fc_post_a.load_state_dict({"weight": ours.fc_post_a.weight, "bias": ours.fc_post_a.bias})
    return ours, official, nc


def test_decode_is_the_official_decode_code(pair):
    ours, official, nc = pair
    codes = torch.from_numpy(np.random.default_rng(0).integers(0, 65536, (1, 1, 30)))
    with torch.no_grad():
        want = nc.NeuCodec.decode_code(official, codes)  # the official method, on its own parts
        got = ours.decode(codes)
    assert got.shape == want.shape == (1, 1, 30 * 480)
    scale = want.abs().max().item()
    assert scale > 1e-3  # not a silent decoder
    assert (got - want).abs().max().item() <= 1e-4 * max(1.0, scale)


def test_fsq_codes_are_the_official_implicit_codebook(pair):
    _, official, _ = pair
    fsq = official.generator.quantizer.layers[0]
    idx = torch.arange(65536)
    torch.testing.assert_close(fsq_codes(idx, (4,) * 8), fsq.implicit_codebook, atol=0, rtol=0)


def test_the_official_rotary_embedding_changes_no_score(pair):
    """The official rotary embedding turns a head's q and k by the head's index, the same at every
    time step (torchtune reads axis 1 as time; it is given the heads there), so every q.k is what
    it was: why ours leaves it out. Checked on the official module itself."""
    _, official, _ = pair
    rope = official.generator.backbone.transformers[0].att.rotary_embed
    q, k = torch.randn(2, 16, 9, 64), torch.randn(2, 16, 9, 64)
    turned = rope(q) @ rope(k).transpose(-1, -2)
    assert not torch.allclose(rope(q), q, atol=1e-3)  # it does turn them
    torch.testing.assert_close(turned, q @ k.transpose(-1, -2), atol=1e-4, rtol=1e-5)
