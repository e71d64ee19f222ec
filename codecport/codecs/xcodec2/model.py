"""XCodec2 in torch: NeuCodec's model (codecs/neucodec/model.py), which is XCodec2's with other sizes.
The official `XCodec2Model`'s state dict loads into it key for key (its weight-norm
parametrizations folded); its config (codecs/xcodec2/config.py) lines the two encoder paths up
as XCodec2 does."""

from __future__ import annotations

from ..neucodec.model import NeuCodec, init_random

MODEL = NeuCodec
__all__ = ["MODEL", "NeuCodec", "init_random"]
