"""NeuCodec's part of codec-bench: its torch reference (fbank features in numpy, as the runtime
computes them) on the bench's weights."""

from __future__ import annotations

import numpy as np

from .facts import BenchFacts


def torch_codes(model, x, k) -> list[np.ndarray]:
    """Codes `[B, 1, frames]` of the torch reference for 16 kHz audio `x` `[B, 1, T]`: padded as the
    official `_prepare_audio`, fbank features in numpy, the FSQ in numpy."""
    import torch

    from ..runtime.fbank import Fbank
    from ..runtime.fsq import Fsq

    hop = int(np.prod(model.cfg.enc_strides))
    x = torch.nn.functional.pad(x, (0, hop - x.shape[-1] % hop))
    feats = torch.from_numpy(np.stack([Fbank().features(row[0].numpy()) for row in x]))
    with torch.no_grad():
        latent = model.encode_latent(x, feats).numpy()
    return [Fsq(model.cfg.levels).indices(latent)[:, None]]


def torch_encode(model, x, k):
    return torch_codes(model, x, k)[0]


def clip_samples(cfg, seconds: float) -> int:
    """Samples at the output rate of `seconds` of whole frames."""
    return max(2, round(seconds * cfg.sample_rate / cfg.hop)) * cfg.hop


FACTS = BenchFacts(
    # The released model is 630 M parameters; the demo's export stays small.
    demo_preset="tiny", demo_seconds=1.0, clip_samples=clip_samples,
    torch_encode=torch_encode, torch_codes=torch_codes,
)
