"""The torch reference model: parity with transformers, official checkpoints, polyphase upsampling."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from support import noise

from codecport.codecs.dac.model import DAC, PRESETS, init_random
from codecport.codecs.dac.weights import load_dac
from codecport.errors import CheckpointError
from codecport.models.layers import UpConv1d


def _randomize_hf(model, seed: int) -> None:
    """Seeded weights with O(1) activations for a transformers DacModel (its init is ~constant)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.copy_(0.5 + 1.5 * torch.rand(p.shape, generator=g))
            elif name.endswith("codebook.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.01 * torch.randn(p.shape, generator=g))
            else:
                transposed = "conv_t1" in name
                fan_in = p.shape[0] * 2 if transposed else p.shape[1] * p.shape[2]
                scale = 0.3 if name.endswith("conv2.weight") and "res_unit" in name else 1.0
                scale = 0.1 if name == "decoder.conv2.weight" else scale
                p.copy_(torch.randn(p.shape, generator=g) * scale / math.sqrt(fan_in))


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    """(transformers DacModel, our model loaded from its saved folder) on shared random weights."""
    cfg = PRESETS["tiny"]
    hc = transformers.DacConfig(
        encoder_hidden_size=cfg.encoder_dim, downsampling_ratios=list(cfg.encoder_rates),
        decoder_hidden_size=cfg.decoder_dim, n_codebooks=cfg.n_codebooks,
        codebook_size=cfg.codebook_size, codebook_dim=cfg.codebook_dim, sampling_rate=cfg.sample_rate)
    hf = transformers.DacModel(hc).eval()
    _randomize_hf(hf, seed=3)
    folder = tmp_path_factory.mktemp("hf_dac")
    hf.save_pretrained(folder)
    ours, _ = load_dac(str(folder))
    assert ours.cfg == cfg
    return hf, ours


def test_transformers_parity_latent_and_audio(hf_pair):
    hf, ours = hf_pair
    x = torch.from_numpy(noise(6 * 200, seed=1))[None]
    with torch.no_grad():
        assert (hf.encoder(x) - ours.encoder(x)).abs().max() <= 1e-5
        codes = ours.encode(x)
        want = hf.decode(audio_codes=codes).audio_values
        got = ours.decode(codes)[:, 0]
    assert want.shape == got.shape
    assert (want - got).abs().max() <= 1e-5


def test_transformers_codes_agree_except_at_sign_slip_ties(hf_pair):
    """transformers flips the sign of |c|^2 in the distance. With unit-norm codebook rows that
    term is the same for every row up to rounding, so the two formulas only part on near-ties.
    Frames where both formulas pick the same rows must give identical codes; elsewhere the
    transformers code must be the slip formula's pick."""
    hf, ours = hf_pair
    x = torch.from_numpy(noise(6 * 400, seed=2))[None]
    with torch.no_grad():
        hf_codes = hf.encode(x).audio_codes[0]
        residual = ours.encoder(x)
        agree = torch.ones(hf_codes.shape[1], dtype=torch.bool)
        for i, q in enumerate(ours.quantizer.quantizers):
            enc = F.normalize(q.in_proj(residual)[0].T, dim=-1)
            cb = F.normalize(q.codebook.weight, dim=-1)
            official = -(enc.pow(2).sum(-1, keepdim=True) - 2 * enc @ cb.T + cb.pow(2).sum(-1))
            slip = -(enc.pow(2).sum(-1, keepdim=True) - 2 * enc @ cb.T) + cb.pow(2).sum(-1)
            pick = official.argmax(-1)
            first_split = agree & (pick != slip.argmax(-1))
            assert (hf_codes[i, first_split] == slip.argmax(-1)[first_split]).all()
            agree &= pick == slip.argmax(-1)
            residual = residual - q.lookup(pick[None])
        ours_codes = ours.encode(x)[0]
    assert agree.float().mean() >= 0.9
    assert torch.equal(ours_codes[:, agree], hf_codes[:, agree])


def _official_state(model: DAC, spelling: str) -> dict[str, torch.Tensor]:
    """The model's weights as the official package saves them: weight-normed convs."""
    sd = {}
    for key, value in model.state_dict().items():
        if key.endswith(".weight") and value.dim() == 3:
            v = value * 2.5  # any scale: g carries the norm
            g = value.flatten(1).norm(dim=1).reshape(-1, 1, 1)
            stem = key[: -len(".weight")]
            if spelling == "legacy":
                sd[stem + ".weight_g"], sd[stem + ".weight_v"] = g, v
            else:
                sd[stem + ".parametrizations.weight.original0"] = g
                sd[stem + ".parametrizations.weight.original1"] = v
        else:
            sd[key] = value
    return sd


@pytest.mark.parametrize("spelling", ["legacy", "parametrizations"])
def test_official_pth_loads_and_matches(tmp_path, tiny_dac, spelling):
    path = tmp_path / "weights.pth"
    torch.save({"state_dict": _official_state(tiny_dac, spelling),
                "metadata": {"kwargs": PRESETS["tiny"].to_kwargs()}}, path)
    loaded, sha = load_dac(str(path))  # config comes from metadata.kwargs, no --variant
    assert loaded.cfg == PRESETS["tiny"] and len(sha) == 64
    for k, v in tiny_dac.state_dict().items():
        assert torch.allclose(loaded.state_dict()[k], v, atol=1e-6), k
    x = torch.from_numpy(noise(600, seed=4))[None]
    with torch.no_grad():
        assert torch.equal(loaded.encode(x), tiny_dac.encode(x))


def test_official_pth_names_bad_shape(tmp_path, tiny_dac):
    sd = _official_state(tiny_dac, "legacy")
    sd["quantizer.quantizers.0.codebook.weight"] = torch.zeros(3, 3)
    path = tmp_path / "weights.pth"
    torch.save({"state_dict": sd, "metadata": {"kwargs": PRESETS["tiny"].to_kwargs()}}, path)
    with pytest.raises(CheckpointError, match=r"quantizer\.quantizers\.0\.codebook\.weight has shape"):
        load_dac(str(path))


@settings(max_examples=25, deadline=None)
@given(stride=st.integers(1, 8), c_in=st.integers(1, 5), c_out=st.integers(1, 5),
       t=st.integers(1, 12), padding=st.booleans(), seed=st.integers(0, 2**16))
def test_polyphase_equals_conv_transpose(stride, c_in, c_out, t, padding, seed):
    torch.manual_seed(seed)
    poly = UpConv1d(c_in, c_out, stride, pad=math.ceil(stride / 2), polyphase=True)
    poly.use_padding = padding
    x = torch.randn(2, c_in, t)
    want = F.conv_transpose1d(x, poly.weight, poly.bias, stride=stride,
                              padding=math.ceil(stride / 2) if padding else 0)
    torch.testing.assert_close(poly(x), want, atol=1e-5, rtol=0)  # also checks the shape


@pytest.mark.parametrize("padding", [True, False])
def test_polyphase_decoder_equals_conv_transpose_decoder(tiny_dac, padding):
    plain = DAC(tiny_dac.cfg, polyphase=False).eval()
    plain.load_state_dict(tiny_dac.state_dict())
    tiny_dac.set_padding(padding)
    plain.set_padding(padding)
    try:
        z = torch.randn(1, tiny_dac.cfg.latent_dim, 80)
        with torch.no_grad():
            assert (tiny_dac.decoder(z) - plain.decoder(z)).abs().max() <= 1e-5
    finally:
        tiny_dac.set_padding(True)


@pytest.mark.parametrize("variant", ["44khz", "24khz"])
def test_decoder_length_matches_official_numbers(variant):
    """Official decoders: 44k gives 512*T samples, 24k/16k lose 8 (odd strides lose one each)."""
    model = DAC(PRESETS[variant])
    t = 3
    with torch.no_grad():
        out = model.decoder(torch.zeros(1, PRESETS[variant].latent_dim, t)).shape[-1]
    hop = PRESETS[variant].hop_length
    assert out == (hop * t if variant == "44khz" else hop * t - 8)


def test_chunked_lengths_match_a_real_run(tiny_dac):
    """`output_length` (the official `get_output_length`) is what padding-off encode+decode gives."""
    tiny_dac.set_padding(False)
    try:
        for n in (1200, 3000, 4321):
            with torch.no_grad():
                y = tiny_dac.decode(tiny_dac.encode(torch.zeros(1, 1, n)))
            assert y.shape[-1] == tiny_dac.output_length(n + (-n % tiny_dac.cfg.hop_length))
    finally:
        tiny_dac.set_padding(True)


def test_random_init_is_seeded_and_informative():
    a = init_random(DAC(PRESETS["tiny"]), 5)
    b = init_random(DAC(PRESETS["tiny"]), 5)
    assert all(torch.equal(x, y)
               for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    x = torch.from_numpy(noise(600))[None]
    with torch.no_grad():
        y = a.decode(a.encode(x))
    assert 0.01 < y.std() < 0.9  # neither constant nor a saturated tanh
