"""NeuCodec's config and presets, torch-free."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ConfigError
from .w2vbert_config import W2vBertConfig


@dataclass(frozen=True)
class NeuCodecConfig:
    sample_rate: int = 24000  # decoder output
    input_rate: int = 16000  # encoder input
    hop: int = 480  # output samples a frame (320 input samples)
    hidden: int = 1024  # backbone width
    depth: int = 12  # transformer blocks
    heads: int = 16
    vq_dim: int = 2048  # the quantizer's projection width
    levels: tuple[int, ...] = (4,) * 8  # FSQ levels: 65 536 codes
    groups: int = 32  # GroupNorm groups of the ResNet blocks
    # The acoustic encoder (CodecEncoder): channels after the stem, doubled by each stride.
    enc_channels: int = 48
    enc_strides: tuple[int, ...] = (2, 2, 4, 4, 5)  # their product: input samples a frame
    semantic: W2vBertConfig = W2vBertConfig()  # noqa: RUF009 (frozen, so shared safely); the semantic model: w2v-BERT 2.0's first 16 layers
    # How the two paths line up. NeuCodec computes the fbank features of the padded clip as it
    # is: 400-sample windows every 160, stacked in pairs, give a row fewer than the acoustic
    # encoder's frames, which are cut to them (one acoustic frame extra). XCodec2 pads the
    # features' input by 160 samples each side, and the two paths agree.
    fbank_pad: int = 0  # zeros each side of the padded clip before the fbank features
    acoustic_extra: int = 1  # acoustic frames past the codes' (the padded clip's last)

    @property
    def semantic_dim(self) -> int:
        """w2v-BERT's width, the SemanticEncoder's in and out."""
        return self.semantic.hidden

    @property
    def codebook_size(self) -> int:
        return int(np.prod(self.levels))

    n_codebooks = 1  # one FSQ codebook (what `codec-export --in-graph-quantizer` puts in the graphs)

    def to_kwargs(self) -> dict:
        """The config as JSON-ready fields (the bench writes it beside its weights)."""
        return asdict(self)

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> NeuCodecConfig:
        """The config `to_kwargs` wrote; a key it does not have is refused."""
        if not isinstance(kwargs, dict) or not isinstance(kwargs.get("semantic", {}), dict):
            raise ConfigError("the config is not a JSON object of NeuCodec settings")
        for fields, given in ((cls.__dataclass_fields__, kwargs),
                              (W2vBertConfig.__dataclass_fields__, kwargs.get("semantic", {}))):
            unknown = sorted(set(given) - set(fields))
            if unknown:
                raise ConfigError(f"config key {unknown[0]!r} is not one of NeuCodec's")
        out = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}
        if "semantic" in out:
            out["semantic"] = W2vBertConfig(**out["semantic"])
        return cls(**out)


CONFIG = NeuCodecConfig

PRESETS = {
    "neucodec": NeuCodecConfig(),
    # Not a released model: small enough for unit tests. Still 320 input samples a frame (the
    # semantic path's fbank rows come every 320 samples) and 50 frames a second, at 8 kHz out.
    "tiny": NeuCodecConfig(sample_rate=8000, hop=160, hidden=64, depth=2, heads=4, vq_dim=32, levels=(4, 4, 4),
                           groups=8, enc_channels=2, enc_strides=(4, 8, 10),
                           semantic=W2vBertConfig(hidden=16, layers=2, heads=2, intermediate=32, kernel=5, left=4,
                                                  right=2)),
}

# Released names (each a preset) -> the Hugging Face repo of the official `pytorch_model.bin`.
RELEASES = {"neucodec": "neuphonic/neucodec"}
WEIGHTS_FILE = "pytorch_model.bin"
# The official model builds its semantic model from this repo rather than from its own file.
SEMANTIC_REPO = "facebook/w2v-bert-2.0"
SEMANTIC_FILE = "model.safetensors"
