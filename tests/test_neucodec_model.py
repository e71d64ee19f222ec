"""NeuCodec's decoder in torch (codecs/neucodec/model.py) against the official `neucodec` package, on
the released architecture with shared random weights: the official `decode_code` path (FSQ
indices -> `project_out` -> `fc_post_a` -> `CodecDecoderVocos`) gives the same audio."""

from __future__ import annotations

import dataclasses
import functools
import types
from unittest import mock

import numpy as np
import pytest
import torch
from shared_exports import skipped_init
from support import noise, official_neucodec

from codecport.codecs.neucodec.model import PRESETS, NeuCodec, fsq_codes, init_random

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def pair():
    """(ours, the official decoder objects) on the same weights, the released sizes."""
    nc = official_neucodec()
    torch.manual_seed(0)
    with skipped_init():  # both take `init_random`'s weights below
        generator = nc.codec_decoder_vocos.CodecDecoderVocos(hop_length=480).eval()
        fc_post_a = torch.nn.Linear(2048, 1024)
        # the decoder at the released size; the semantic model it never reads, small
        cfg = PRESETS["neucodec"]
        ours = NeuCodec(dataclasses.replace(cfg, semantic=dataclasses.replace(cfg.semantic, layers=1,
                                                                                intermediate=8)))
    official = types.SimpleNamespace(generator=generator, fc_post_a=fc_post_a)
    ours.eval()
    sd = {f"generator.{k}": v for k, v in generator.state_dict().items()}
    sd.update({f"fc_post_a.{k}": v for k, v in fc_post_a.state_dict().items()})
    # The official decoder's state dict, as the official model holds it, loads into ours key for key.
    missing, unexpected = ours.load_state_dict(sd, strict=False)
    decoder_side = [k for k in missing if k.startswith(("generator.", "fc_post_a."))]
    assert not decoder_side and set(unexpected) <= set(NeuCodec.IGNORED), (decoder_side, unexpected)
    # Random init gives constant codes downstream; spread the weights as a trained model's are.
    with torch.no_grad():
        init_random(ours, seed=1)
        # Sharp attention (so positions matter) and some magnitudes past the head's clip at 100.
        for block in ours.generator.backbone.transformers:
            block.att.c_attn.weight.mul_(2)
        ours.generator.head.out.bias[:200].add_(5.0)
        missing, _ = generator.load_state_dict({k[len("generator."):]: v for k, v in ours.state_dict().items()
                                                if k.startswith("generator.")}, strict=False)
        assert {f"generator.{k}" for k in missing} <= set(NeuCodec.IGNORED), missing  # buffers it computes
        fc_post_a.load_state_dict({"weight": ours.fc_post_a.weight, "bias": ours.fc_post_a.bias})
    return ours, official, nc


def test_official_parity_decode_code(pair):
    """The official `decode_code` of 30 frames, and of 17 frames inside a 30-frame window (the
    mask): the clip's samples within 1e-4, the window's past the clip zero."""
    ours, official, nc = pair
    codes = torch.from_numpy(np.random.default_rng(0).integers(0, 65536, (1, 1, 30)))
    mask = torch.zeros(1, 1, 30)
    mask[..., :17] = 1.0
    with torch.no_grad():
        for n, got in ((30, ours.decode(codes)),
                       (17, ours.decode_levels(fsq_codes(codes[:, 0], (4,) * 8), mask))):
            want = nc.NeuCodec.decode_code(official, codes[..., :n])  # the official method, on its own parts
            assert want.shape == (1, 1, n * 480) and got.shape == (1, 1, 30 * 480)
            scale = want.abs().max().item()
            assert scale > 1e-3  # not a silent decoder
            assert (got[..., :n * 480] - want).abs().max().item() <= 1e-4 * max(1.0, scale)
            assert not got[..., n * 480:].any()


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


# ---- the encoder side ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def official_whole():
    """The official NeuCodec, built offline: w2v-BERT 2.0 from a config (its 1024 width and the
    16 layers whose last hidden state NeuCodec reads; a narrow feed-forward keeps it small) and
    transformers' feature extractor, on shared random weights with ours, semantic model included.
    The encoder at the released size; of the decoder, which `encode_code` reads only for its
    quantizer, one transformer block of 12 (the released decoder: `pair`)."""
    from codecport.codecs.neucodec.facts import offline
    from codecport.models.checkpoint import fold_weight_norm, unfold_weight_norm

    nc = official_neucodec()
    torch.manual_seed(0)
    one_block = functools.partial(nc.codec_decoder_vocos.CodecDecoderVocos, depth=1)
    with mock.patch.object(nc.model, "CodecDecoderVocos", one_block):
        official = offline(nc.model, lambda: nc.NeuCodec(24000, 480), semantic_layers=16, intermediate=128)
    assert len(official.generator.backbone.transformers) == 1
    cfg = PRESETS["neucodec"]
    with skipped_init():  # every weight is the official's, loaded next
        ours = NeuCodec(dataclasses.replace(cfg, depth=1, semantic=dataclasses.replace(cfg.semantic,
                                                                                       intermediate=128))).eval()
    sd = fold_weight_norm({k: v for k, v in official.state_dict().items() if not ours.unused(k)})
    ours.load_state_dict(sd, strict=True)  # the official keys, every one
    with torch.no_grad():  # spread the latent over every FSQ level (random init gives one code)
        ours.fc_prior.weight.mul_(30)
        ours.generator.quantizer.project_in.weight.mul_(3)
        for p in ours.semantic_model.parameters():  # and make the semantic path matter
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
        back = dict(ours.state_dict())
        back = {**unfold_weight_norm({k: v for k, v in back.items() if k.startswith("CodecEnc.")}),
                **{k: v for k, v in back.items() if not k.startswith("CodecEnc.")}}
        missing, _ = official.load_state_dict(back, strict=False)
    assert all(ours.unused(k) for k in missing), missing
    return ours, official


def test_the_acoustic_encoder_is_the_official_one(official_whole):
    ours, official = official_whole
    x = torch.from_numpy(noise(16000 + 320 - 16000 % 320, seed=2))[None]
    with torch.no_grad():
        want = official.CodecEnc(x)
        got = ours.CodecEnc(x)
    assert got.shape == want.shape == (1, 50 + 1, 1024)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def _prepared(audio: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(16 kHz audio padded as the official `_prepare_audio` pads it, its fbank features (numpy))."""
    from codecport.codecs.neucodec.fbank import Fbank

    x = torch.from_numpy(audio)[None]
    padded = torch.nn.functional.pad(x, (0, 320 - x.shape[-1] % 320))
    return padded, torch.from_numpy(Fbank().features(padded[0, 0].numpy()))[None]


def masked_window(prepared, short: np.ndarray, long: np.ndarray):
    """(audio, features, mask, frames): `short`'s padded audio and features at the start of
    `long`'s, the rest of the window `long`'s, the mask marking `short`'s `frames`."""
    padded, feats = prepared(short)
    frames = feats.shape[1]
    audio, window_feats = prepared(long)
    audio[..., :padded.shape[-1]] = padded
    window_feats[:, :frames] = feats
    mask = torch.zeros(1, 1, window_feats.shape[1])
    mask[..., :frames] = 1.0
    return audio, window_feats, mask, frames


def test_official_parity_encode_code(official_whole):
    """fbank in numpy (codecs/neucodec/fbank.py) -> ours (w2v-BERT's layers included) -> FSQ in numpy
    (codecs/neucodec/fsq.py): the official `encode_code`'s codes, every one, on a clip alone and on a
    shorter clip inside a longer window (the mask)."""
    from codecport.codecs.neucodec.fsq import Fsq

    ours, official = official_whole
    fsq = Fsq(PRESETS["neucodec"].levels)
    long, short = noise(24000 + 123, seed=3), noise(9000, seed=4)  # 1.5 s and a bit, 0.56 s at 16 kHz
    with torch.no_grad():
        for audio in (long, short):
            want = official.encode_code(torch.from_numpy(audio)[None]).numpy()  # [1, 1, F]
            got = fsq.indices(ours.encode_latent(*_prepared(audio)).numpy())
            assert len(np.unique(want)) > 10  # codes that vary
            np.testing.assert_array_equal(got[:, None], want)
        # The short clip in the long clip's window, the rest of the window other audio: the
        # short clip's own codes (`want`, the last of the loop).
        *window, frames = masked_window(_prepared, short, long)
        got = fsq.indices(ours.encode_latent(*window).numpy())
    np.testing.assert_array_equal(got[:, None, :frames], want)
