"""w2v-BERT 2.0's geometry (codecs/neucodec/w2vbert.py), torch-free: the codecs that read it name it in their
configs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class W2vBertConfig:
    hidden: int = 1024
    layers: int = 16  # the layers run: NeuCodec and XCodec2 read the 16th hidden state
    heads: int = 16
    intermediate: int = 4096
    kernel: int = 31  # the conformer's causal depthwise conv
    left: int = 64  # relative distances the attention tells apart, behind and ahead
    right: int = 8
    features: int = 160  # stacked fbank features (codecs/neucodec/fbank.py)
    eps: float = 1e-5
