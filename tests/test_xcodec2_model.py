"""XCodec2 in torch (NeuCodec's model on XCodec2's config, codecs/xcodec2/model.py) against the official
`xcodec2` package, on the released architecture with shared random weights: the official
`XCodec2Model`'s state dict loads key for key, and `encode_code` / `decode_code` give the same
codes and audio, on a clip alone and on a shorter clip inside a longer window (the mask)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from shared_exports import skipped_init
from support import noise
from test_neucodec_model import masked_window

from codecport.codecs.neucodec.fbank import Fbank
from codecport.codecs.neucodec.fsq import Fsq
from codecport.codecs.neucodec.model import fsq_codes
from codecport.codecs.xcodec2.config import PRESETS
from codecport.codecs.xcodec2.facts import build_official, import_official
from codecport.codecs.xcodec2.model import MODEL
from codecport.codecs.xcodec2.weights import XCODEC2
from codecport.models.checkpoint import fold_weight_norm, unfold_weight_norm

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def pair():
    """(ours, the official model) on the same weights: the released sizes, w2v-BERT's 16 layers
    with a narrow feed-forward (its width is not XCodec2's to choose; 128 keeps the test small)."""
    torch.manual_seed(0)
    official = build_official(import_official(), semantic_layers=16, intermediate=128)
    cfg = PRESETS["xcodec2"]
    with skipped_init():  # every weight is the official's, loaded next
        ours = MODEL(dataclasses.replace(cfg, semantic=dataclasses.replace(cfg.semantic,
                                                                           intermediate=128))).eval()
    # The official keys, every one (weight norm folded, SnakeBeta's `bias` read as its beta).
    sd = fold_weight_norm(XCODEC2.to_ours({k: v for k, v in official.state_dict().items()
                                           if not ours.unused(k)}))
    ours.load_state_dict(sd, strict=True)
    with torch.no_grad():  # spread the latent over every FSQ level (random init gives one code)
        ours.fc_prior.weight.mul_(30)
        ours.generator.quantizer.project_in.weight.mul_(3)
        for p in ours.semantic_model.parameters():  # and make the semantic path matter
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
        for block in ours.generator.backbone.transformers:  # sharp attention: positions matter
            block.att.c_attn.weight.mul_(2)
        back = dict(ours.state_dict())
        back.update(unfold_weight_norm({k: v for k, v in back.items() if k.startswith("CodecEnc.")}))
        # torch's weight norm reads `weight_g`/`weight_v` into its parametrization.
        missing, _ = official.load_state_dict(XCODEC2.to_official(back), strict=False)
    assert all(ours.unused(k) for k in missing), missing
    return ours, official


def _prepared(audio: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(16 kHz audio padded as the official `encode_code` pads it, its fbank features in numpy: of
    that clip with 160 zeros each side, as XCodec2 computes them)."""
    x = torch.from_numpy(audio)[None]
    padded = torch.nn.functional.pad(x, (0, 320 - x.shape[-1] % 320))
    return padded, torch.from_numpy(Fbank().features(np.pad(padded[0, 0].numpy(), 160)))[None]


def test_official_parity_encode_code(pair):
    """fbank in numpy -> ours -> FSQ in numpy: the official `encode_code`'s codes, every one, a
    code for every padded frame (`n // 320 + 1`)."""
    ours, official = pair
    fsq = Fsq(PRESETS["xcodec2"].levels)
    long, short = noise(24000 + 123, seed=3), noise(9000, seed=4)
    with torch.no_grad():
        for audio in (long, short):
            want = official.encode_code(torch.from_numpy(audio)).numpy()  # [1, T] -> [1, 1, F]
            got = fsq.indices(ours.encode_latent(*_prepared(audio)).numpy())
            assert want.shape == (1, 1, audio.shape[-1] // 320 + 1)
            assert len(np.unique(want)) > 10  # codes that vary
            np.testing.assert_array_equal(got[:, None], want)
        # The short clip in the long clip's window (the mask), the rest other audio: the short
        # clip's own codes (`want`, the last of the loop).
        *window, frames = masked_window(_prepared, short, long)
        got = fsq.indices(ours.encode_latent(*window).numpy())
    np.testing.assert_array_equal(got[:, None, :frames], want)


def test_official_parity_decode_code(pair):
    """The official `decode_code` of 30 frames, and of 17 inside a 30-frame window (the mask):
    16 kHz audio, 320 samples a frame, within 1e-4."""
    ours, official = pair
    codes = torch.from_numpy(np.random.default_rng(0).integers(0, 65536, (1, 1, 30)))
    mask = torch.zeros(1, 1, 30)
    mask[..., :17] = 1.0
    with torch.no_grad():
        for n, got in ((30, ours.decode(codes)),
                       (17, ours.decode_levels(fsq_codes(codes[:, 0], (4,) * 8), mask))):
            want = official.decode_code(codes[..., :n].int())
            assert want.shape == (1, 1, n * 320) and got.shape == (1, 1, 30 * 320)
            scale = want.abs().max().item()
            assert scale > 1e-3
            assert (got[..., :n * 320] - want).abs().max().item() <= 1e-4 * max(1.0, scale)
            assert not got[..., n * 320:].any()
