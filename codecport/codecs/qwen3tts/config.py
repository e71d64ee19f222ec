"""Qwen3-TTS tokenizer's config and presets, torch-free (the CLI and the registry read them).

The encoder is a Mimi (codecs/mimi/config.py) whose attention sees the whole clip: its context
is the official `max_position_embeddings` (8000 positions at 25 Hz, 320 s), past any graph.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from ...errors import ConfigError
from ...models.limits import MAX_PARAMS, check_float, check_int, check_ints
from ..mimi.config import PRESETS as MIMI_PRESETS
from ..mimi.config import MimiConfig

FULL_CONTEXT = 8000  # the encoder's attention: every earlier position of any clip a graph holds


@dataclass(frozen=True)
class Qwen3Config:
    # SEANet, its transformer, the 32 levels of its split RVQ
    encoder: MimiConfig = field(default_factory=lambda: MimiConfig(context=FULL_CONTEXT))
    n_codebooks: int = 16  # levels kept of the encoder's (semantic + acoustic 1..15); the decoder's
    codebook_size: int = 2048
    codebook_dim: int = 512  # the decoder quantizer's output; its rows are half of it
    latent_dim: int = 1024  # pre_conv's output, the transformer's input and output, the upsamplers'
    hidden: int = 512  # the decoder transformer's width
    ffn: int = 1024  # its SwiGLU's
    n_layers: int = 8
    n_heads: int = 16
    head_dim: int = 64  # (16 x 64 = 1024: wider than `hidden`)
    window: int = 72  # keys a query sees, itself included
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    decoder_dim: int = 1536  # the first conv block's channels, halved by each block
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)  # the SnakeBeta conv blocks' strides
    upsampling_ratios: tuple[int, ...] = (2, 2)  # the ConvNeXt upsamplers' strides

    def __post_init__(self):
        check_int("n_codebooks", self.n_codebooks, 1, self.encoder.n_codebooks)
        check_int("codebook_size", self.codebook_size, 2, 1 << 16)
        check_int("codebook_dim", self.codebook_dim, 2, 8192)
        for name in ("latent_dim", "hidden", "ffn", "decoder_dim"):
            check_int(name, getattr(self, name), 1, 1 << 16)
        check_int("n_layers", self.n_layers, 0, 128)
        check_int("n_heads", self.n_heads, 1, 256)
        check_int("head_dim", self.head_dim, 2, 1024)
        check_int("window", self.window, 1, 1 << 14)
        check_float("rope_theta", self.rope_theta, 1.0, 1e12)
        check_float("rms_eps", self.rms_eps, 0.0, 1.0)
        check_ints("upsample_rates", self.upsample_rates, 1, 64, 8)
        check_ints("upsampling_ratios", self.upsampling_ratios, 1, 64, 8)
        if self.codebook_dim % 2 or self.head_dim % 2:
            raise ConfigError("codebook_dim and head_dim must be even (rows are half the codebook "
                              "dim; RoPE rotates pairs)")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            raise ConfigError(f"decoder_dim {self.decoder_dim} does not halve "
                              f"{len(self.upsample_rates)} times")
        if self.frame_size != self.encoder.frame_size or self.sample_rate != self.encoder.sample_rate:
            raise ConfigError(f"the decoder gives {self.frame_size} samples a frame, the encoder takes "
                              f"{self.encoder.frame_size}: the two sides must agree")
        if self.approx_params() > MAX_PARAMS:
            raise ConfigError(f"the config describes a model of about {self.approx_params() / 1e9:.1f} G "
                              "parameters, far past any Qwen3-TTS tokenizer; is this config right?")

    def approx_params(self) -> int:
        """Parameters of both sides, roughly (a bound on absurd configs, not a count)."""
        layer = 4 * self.hidden * self.n_heads * self.head_dim + 3 * self.hidden * self.ffn
        d, blocks = self.decoder_dim, 0
        for r in self.upsample_rates:
            blocks += d * d // 2 * 2 * r + 3 * (d // 2) ** 2 * 8
            d //= 2
        upsample = len(self.upsampling_ratios) * (self.latent_dim ** 2 * (2 + 8))
        return (self.encoder.approx_params() + self.n_layers * layer + blocks + upsample
                + self.n_codebooks * self.codebook_size * self.codebook_dim // 2)

    @property
    def sample_rate(self) -> int:
        return self.encoder.sample_rate

    @property
    def frame_size(self) -> int:
        """Samples per code frame (1920 for the released model: 80 ms at 24 kHz)."""
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.frame_size

    def to_kwargs(self) -> dict:
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items() if k != "encoder"}
        return {**out, "encoder": self.encoder.to_kwargs()}

    @classmethod
    def from_kwargs(cls, kw: dict) -> Qwen3Config:
        known = {f.name for f in fields(cls)} - {"encoder"}
        if not isinstance(kw.get("encoder"), dict):
            raise ConfigError("the config is not Qwen3-TTS tokenizer's (no encoder config)")
        try:
            return cls(encoder=MimiConfig.from_kwargs(kw["encoder"]),
                       **{k: tuple(v) if isinstance(v, list) else v for k, v in kw.items() if k in known})
        except TypeError as e:
            raise ConfigError(f"the config is not Qwen3-TTS tokenizer's ({e})") from e


CONFIG = Qwen3Config
# Released weights: a Hugging Face repo's `save_pretrained` folder (config.json, model.safetensors),
# fetched through huggingface_hub; a Qwen3-TTS model's own copy sits in its `speech_tokenizer/`.
# No checksum is published for them.
RELEASES = {"12hz": ("Qwen/Qwen3-TTS-Tokenizer-12Hz", "")}
PRESETS = {
    "12hz": Qwen3Config(),
    # Same architecture, small enough for tests: Mimi's tiny encoder (24-sample frames) and a
    # decoder of two layers whose window of 8 keys is still shorter than the test clips.
    "tiny": Qwen3Config(
        encoder=replace(MIMI_PRESETS["tiny"], n_codebooks=8, context=FULL_CONTEXT),
        n_codebooks=4, codebook_size=64, codebook_dim=16, latent_dim=32, hidden=16, ffn=32, n_layers=2,
        n_heads=2, head_dim=8, window=8, decoder_dim=32, upsample_rates=(3, 2), upsampling_ratios=(2, 2)),
}
