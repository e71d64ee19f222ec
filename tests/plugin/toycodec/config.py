"""The toy codec's configuration (no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToyConfig:
    sample_rate: int = 8000  # Hz
    frame_size: int = 80  # samples a code frame (10 ms)
    latent_dim: int = 16  # latent channels
    n_codebooks: int = 2  # residual levels
    codebook_size: int = 64  # codes a level


CONFIG = ToyConfig
PRESETS = {"toy": ToyConfig()}
RELEASES: dict[str, str] = {}
