"""w2v-BERT 2.0's layers (codecs/neucodec/w2vbert.py) against transformers' `Wav2Vec2BertModel` on shared
random weights: the same hidden state for windows shorter and longer than the distances its
attention tells apart, and a shorter clip inside a window (the mask) as the clip alone."""

from __future__ import annotations

import pytest
import torch

from codecport.codecs.neucodec.w2vbert import W2vBert, W2vBertConfig, relative_bias


@pytest.fixture(scope="module")
def pair():
    from transformers import Wav2Vec2BertConfig, Wav2Vec2BertModel

    ref_cfg = Wav2Vec2BertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                 intermediate_size=48, conv_depthwise_kernel_size=5,
                                 left_max_position_embeddings=6, right_max_position_embeddings=3,
                                 output_hidden_states=True)
    torch.manual_seed(0)
    ref = Wav2Vec2BertModel(ref_cfg).eval()
    with torch.no_grad():  # transformers' init leaves biases zero and norms one: spread them
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    ours = W2vBert(W2vBertConfig(hidden=32, layers=2, heads=4, intermediate=48, kernel=5, left=6,
                                 right=3)).eval()
    ours.load_state_dict({k: v for k, v in ref.state_dict().items() if not ours.unused(k)}, strict=True)
    return ours, ref


@pytest.mark.parametrize("frames", [1, 2, 5, 40])
def test_transformers_parity_hidden_state(pair, frames):
    ours, ref = pair
    x = torch.randn(1, frames, 160, generator=torch.Generator().manual_seed(frames))
    with torch.no_grad():
        want = ref(x).hidden_states[2]  # the output of the second layer, as NeuCodec reads the 16th
        got = ours(x)
    assert want.abs().max() > 0.5
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    # and not by accident: a third layer changes it
    assert (ref(x).hidden_states[3] - want).abs().max() > 1e-2


def test_a_shorter_clip_in_a_window_is_the_clip_alone(pair):
    ours, ref = pair
    g = torch.Generator().manual_seed(1)
    clip, rest = torch.randn(1, 23, 160, generator=g), torch.randn(1, 17, 160, generator=g)
    mask = torch.cat([torch.ones(1, 1, 23), torch.zeros(1, 1, 17)], -1)
    with torch.no_grad():
        want = ref(clip).hidden_states[2]
        got = ours(torch.cat([clip, rest], 1), mask)
        unmasked = ours(torch.cat([clip, rest], 1))
    torch.testing.assert_close(got[:, :23], want, atol=2e-5, rtol=1e-5)
    assert (unmasked[:, :23] - want).abs().max() > 1e-3  # the mask is what makes it so


def test_the_skew_is_the_clamped_lookup():
    q, table = torch.randn(2, 3, 11, 4), torch.randn(6 + 3 + 1, 4)
    d = (torch.arange(11)[None] - torch.arange(11)[:, None]).clamp(-6, 3) + 6
    want = torch.einsum("bhld,lrd->bhlr", q, table[d])
    torch.testing.assert_close(relative_bias(q, table, 6, 3), want)
