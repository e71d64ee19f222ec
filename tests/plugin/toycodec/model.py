"""The toy codec in torch: the reference its graphs are traced from and validated against."""

from __future__ import annotations

import torch
from torch import nn

from .config import ToyConfig


class ToyModel(nn.Module):
    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.cfg = cfg
        self.analysis = nn.Linear(cfg.frame_size, cfg.latent_dim)
        self.codebooks = nn.Parameter(torch.zeros(cfg.n_codebooks, cfg.codebook_size, cfg.latent_dim))
        self.now = nn.Linear(cfg.latent_dim, cfg.frame_size)
        self.before = nn.Linear(cfg.latent_dim, cfg.frame_size, bias=False)

    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """audio `[B, 1, frames * frame_size]` -> codes `[B, K, frames]` (int64)."""
        b = audio.shape[0]
        r = torch.tanh(self.analysis(audio.reshape(b, -1, self.cfg.frame_size)))  # [B, T, D]
        codes = []
        for cb in self.codebooks:
            # |r - c|^2 without the |r|^2 every row shares: the first index wins a tie (ArgMin).
            dist = (cb * cb).sum(-1) - 2 * r @ cb.T
            idx = dist.argmin(-1)
            codes.append(idx)
            r = r - cb[idx]
        return torch.stack(codes, 1)

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        """codes `[B, K, T]` -> the sum of their rows `[B, T, D]`."""
        return sum(cb[codes[:, k]] for k, cb in enumerate(self.codebooks))

    def synthesize(self, z: torch.Tensor, z_before: torch.Tensor) -> torch.Tensor:
        """Latents `[B, T, D]` after `z_before` `[B, 1, D]` -> audio `[B, 1, T * frame_size]`."""
        previous = torch.cat([z_before, z[:, :-1]], 1)
        y = self.now(z) + self.before(previous)
        return y.reshape(z.shape[0], 1, -1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        z = self.latent(codes)
        return self.synthesize(z, torch.zeros_like(z[:, :1]))


def init_random(model: ToyModel, seed: int) -> ToyModel:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.ndim == 3 else 0.1))
    return model


MODEL = ToyModel
