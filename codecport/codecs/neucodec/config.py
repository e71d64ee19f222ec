"""NeuCodec's config and presets, torch-free."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from ...errors import ConfigError
from .distill_config import DistillConfig, HubertConfig
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
    # The distilled variant's encoder (codecs/neucodec/distill_config.py): DistilHuBERT on the raw padded
    # clip (`fbank_pad` zeros each side) instead of w2v-BERT on fbank features, and
    # DistillCodecEncoder, whose strides are `enc_strides` (the last its compression).
    distill: DistillConfig | None = None

    @property
    def semantic_dim(self) -> int:
        """The semantic model's width, the SemanticEncoder's in and out."""
        return self.distill.hubert.hidden if self.distill else self.semantic.hidden

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
        distill = kwargs.get("distill") or {}
        if not isinstance(distill, dict) or not isinstance(distill.get("hubert", {}), dict):
            raise ConfigError("the config's distill settings are not a JSON object")
        for fields, given in ((cls.__dataclass_fields__, kwargs),
                              (W2vBertConfig.__dataclass_fields__, kwargs.get("semantic", {})),
                              (DistillConfig.__dataclass_fields__, distill),
                              (HubertConfig.__dataclass_fields__, distill.get("hubert", {}))):
            unknown = sorted(set(given) - set(fields))
            if unknown:
                raise ConfigError(f"config key {unknown[0]!r} is not one of NeuCodec's")
        tuples = lambda d: {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        out = tuples(kwargs)
        if "semantic" in out:
            out["semantic"] = W2vBertConfig(**out["semantic"])
        if distill:
            hubert = HubertConfig(**tuples(distill.get("hubert", {})))
            out["distill"] = DistillConfig(**{**tuples(distill), "hubert": hubert})
        return cls(**out)


CONFIG = NeuCodecConfig

PRESETS = {
    "neucodec": NeuCodecConfig(),
    # Not a released model: small enough for unit tests. Still 320 input samples a frame (the
    # semantic path's fbank rows come every 320 samples) and 50 frames a second, at 8 kHz out.
    "tiny": NeuCodecConfig(sample_rate=8000, hop=160, hidden=64, depth=2, heads=4, vq_dim=32,
                           levels=(4, 4, 4), groups=8, enc_channels=2, enc_strides=(4, 8, 10),
                           semantic=W2vBertConfig(hidden=16, layers=2, heads=2, intermediate=32, kernel=5,
                                                  left=4, right=2)),
    # neuphonic/distill-neucodec: NeuCodec's decoder, the distilled encoder (DistilHuBERT and
    # DistillCodecEncoder), both paths lined up as XCodec2's are.
    "distill": NeuCodecConfig(enc_strides=(4, 4, 4, 5), fbank_pad=160, acoustic_extra=0,
                              distill=DistillConfig()),
}
# Not a released model: the tiny decoder with a tiny distilled encoder, whose 4-frame attention
# windows make a 25-frame graph hold several.
PRESETS["tiny-distill"] = replace(
    PRESETS["tiny"], enc_strides=(4, 4, 4, 5), fbank_pad=160, acoustic_extra=0, distill=DistillConfig(
        hubert=HubertConfig(hidden=16, layers=1, heads=2, intermediate=32, conv_dim=8, pos_kernel=8,
                            pos_groups=2),
        dims=(4, 8, 8, 8), feature=16, window=4, depth=3, heads=2, semantic_hidden=16))

# Released names (each a preset) -> the Hugging Face repo of the official `pytorch_model.bin`.
RELEASES = {"neucodec": "neuphonic/neucodec", "distill": "neuphonic/distill-neucodec"}
WEIGHTS_FILE = "pytorch_model.bin"
# The official model builds its semantic model from this repo rather than from its own file.
SEMANTIC_REPO = "facebook/w2v-bert-2.0"
SEMANTIC_FILE = "model.safetensors"
# The distilled variant's semantic model, and the configs of it the official reads through
# transformers (its heads, its feature extractor's normalisation), which its weights do not show.
DISTILL_REPO = "ntu-spml/distilhubert"
DISTILL_CONFIGS = ("config.json", "preprocessor_config.json")
