"""The distilled NeuCodec's encoder geometry (codecs/neucodec/distill.py), torch-free.

`neuphonic/distill-neucodec` keeps NeuCodec's decoder and replaces both encoder paths: the
semantic model is DistilHuBERT (`ntu-spml/distilhubert`: HuBERT's conv feature encoder and two
transformer layers, on the raw 16 kHz samples of the padded clip with 160 zeros each side), and
the acoustic encoder is `DistillCodecEncoder` (a conv stem of trend pools, ConvNeXt-like units
with Snake and GRN, three 4x downsamplings to 250 Hz, then causal local-attention layers, a 5x
compression to 50 Hz and more of them). The sizes here are the official constructors' defaults
(`neucodec/codec_encoder_distill.py`); what the weights cannot show (HuBERT's heads, the feature
extractor's normalisation) is read from distilhubert's own config files when the weights are
fetched (codecs/neucodec/weights.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HubertConfig:
    hidden: int = 768
    layers: int = 2
    heads: int = 12
    intermediate: int = 3072
    conv_dim: int = 512  # the conv feature encoder's channels
    conv_kernels: tuple[int, ...] = (10, 3, 3, 3, 3, 2, 2)
    conv_strides: tuple[int, ...] = (5, 2, 2, 2, 2, 2, 2)
    pos_kernel: int = 128  # the convolutional position embedding (even: its last output is dropped)
    pos_groups: int = 16
    eps: float = 1e-5
    proj_norm: bool = True  # `feat_proj_layer_norm`: a LayerNorm before the feature projection
    # The feature extractor's `do_normalize`: zero mean, unit variance over the padded clip.
    normalize: bool = True


@dataclass(frozen=True)
class DistillConfig:
    hubert: HubertConfig = HubertConfig()  # frozen, so shared safely
    dims: tuple[int, ...] = (32, 64, 128, 256)  # the conv encoder's widths; its strides are the
    depths: tuple[int, ...] = (1, 1, 1, 2)  # config's `enc_strides` but the last (the compression)
    feature: int = 512  # the local transformers' width
    pool_kernels: tuple[int, ...] = (1, 5, 11, 21, 45)  # the stem's trend pools, 4 channels each
    window: int = 300  # local attention window, in code frames (5x that before the compression)
    depth: int = 5  # local transformer layers: 2 before the compression, the rest after
    heads: int = 6
    semantic_hidden: int = 1024  # the SemanticEncoder's inner width
