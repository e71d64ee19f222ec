"""Mimi's config and its presets, torch-free (the CLI and the registry read them).

Every config is bounded when it is made: a `config.json` that asks for a model of absurd size is
refused before a single layer is built.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from ...errors import ConfigError
from ...models.limits import MAX_PARAMS, check_float, check_int, check_ints


@dataclass(frozen=True)
class MimiConfig:
    sample_rate: int = 24000  # Hz, mono
    n_filters: int = 64  # SEANet channels after the first conv
    ratios: tuple[int, ...] = (8, 6, 5, 4)  # decoder upsampling strides (encoder: reversed)
    dimension: int = 512  # SEANet latent channels = transformer width
    kernel_size: int = 7  # first SEANet conv
    last_kernel_size: int = 3  # last SEANet conv
    residual_kernel_size: int = 3  # first conv of each residual block
    compress: int = 2  # residual block hidden channels = dim / compress
    n_heads: int = 8
    n_layers: int = 8  # per transformer (encoder side and decoder side)
    ffn: int = 2048  # transformer feed-forward width
    context: int = 250  # attention window, in SEANet frames (25 Hz for the preset)
    max_period: float = 10000.0  # RoPE
    downsample_stride: int = 2  # SEANet frame rate -> code frame rate
    n_codebooks: int = 32  # 1 semantic + the rest acoustic
    n_semantic: int = 1
    codebook_size: int = 2048
    codebook_dim: int = 256

    def __post_init__(self):
        check_int("sample_rate", self.sample_rate, 1_000, 1_000_000)
        check_int("n_filters", self.n_filters, 1, 1024)
        check_ints("ratios", self.ratios, 1, 64, 8)
        check_int("dimension", self.dimension, 1, 8192)
        for name in ("kernel_size", "last_kernel_size", "residual_kernel_size"):
            check_int(name, getattr(self, name), 1, 64)
        check_int("compress", self.compress, 1, 64)
        check_int("n_heads", self.n_heads, 1, 256)
        check_int("n_layers", self.n_layers, 0, 128)
        check_int("ffn", self.ffn, 1, 1 << 16)
        check_int("context", self.context, 1, 1 << 16)
        check_float("max_period", self.max_period, 1.0, 1e12)
        check_int("downsample_stride", self.downsample_stride, 1, 16)
        check_int("n_codebooks", self.n_codebooks, 1, 256)
        check_int("n_semantic", self.n_semantic, 0, self.n_codebooks)
        check_int("codebook_size", self.codebook_size, 2, 1 << 16)
        check_int("codebook_dim", self.codebook_dim, 1, 4096)
        if self.dimension % self.n_heads or (self.dimension // self.n_heads) % 2:
            raise ConfigError(f"dimension {self.dimension} does not split into {self.n_heads} heads "
                              "of an even size (RoPE rotates pairs)")
        if self.n_filters * 2 ** len(self.ratios) > 1 << 16:
            raise ConfigError(f"n_filters {self.n_filters} doubled {len(self.ratios)} times is past "
                              "any Mimi model; is this config right?")
        if self.approx_params() > MAX_PARAMS:
            raise ConfigError(f"the config describes a model of about {self.approx_params() / 1e9:.1f} G "
                              "parameters, far past any Mimi model; is this config right?")

    def approx_params(self) -> int:
        """Parameters of the convs, transformers and codebooks, within a few percent."""
        seanet, d = 2 * self.kernel_size * self.n_filters, self.n_filters
        for r in self.ratios:
            h = d // self.compress
            seanet += 2 * (self.residual_kernel_size * d * h + h * d) + 2 * d * 2 * d * 2 * r
            d *= 2
        seanet = 2 * seanet + (self.kernel_size + self.last_kernel_size) * d * self.dimension
        layer = 4 * self.dimension ** 2 + 2 * self.dimension * self.ffn
        rvq = (self.n_codebooks * self.codebook_size * self.codebook_dim
               + 4 * self.dimension * self.codebook_dim)
        return seanet + 2 * self.n_layers * layer + 8 * self.dimension ** 2 + rvq

    @property
    def hop(self) -> int:
        """Samples per SEANet frame (960 for the preset)."""
        return math.prod(self.ratios)

    @property
    def frame_size(self) -> int:
        """Samples per code frame (1920 for the preset: 80 ms at 24 kHz)."""
        return self.hop * self.downsample_stride

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.frame_size

    def to_kwargs(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_kwargs(cls, kw: dict) -> MimiConfig:
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in kw.items() if k in known})
        except TypeError as e:
            raise ConfigError(f"the config is not Mimi's ({e})") from e


CONFIG = MimiConfig
# Released weights: name -> (Hugging Face repo, file), fetched through huggingface_hub (a mirror
# or test server: HF_ENDPOINT). No checksum is published for them.
RELEASES = {"mimi": ("kyutai/moshiko-pytorch-bf16", "tokenizer-e351c8d8-checkpoint125.safetensors")}
PRESETS = {
    "mimi": MimiConfig(),
    # Same architecture, small enough for tests: 24-sample frames, 16-dim transformer.
    "tiny": MimiConfig(n_filters=4, ratios=(4, 3), dimension=16, n_heads=2, n_layers=2, ffn=32,
                       n_codebooks=4, codebook_size=64, codebook_dim=8),
}
