"""Loading XCodec2 weights: the official `model.safetensors` by released name, a folder, or a
file, through NeuCodec's loader (codecs/neucodec/weights.py): the same keys but SnakeBeta's beta,
w2v-BERT included (fetched from its own repo only when a checkpoint lacks it), never unpickled."""

from __future__ import annotations

from ..neucodec.model import NeuCodec
from ..neucodec.weights import Family
from ..neucodec.weights import load as load_family
from .config import PRESETS, RELEASES, WEIGHTS_FILE

# XCodec2's SnakeBeta calls its beta `bias` (NeuCodec's renamed it); the formula is the same.
XCODEC2 = Family("XCodec2", PRESETS, RELEASES, WEIGHTS_FILE, renames=((".act.bias", ".act.beta"),))


def load(weights: str, preset: str | None = None, revision: str | None = None) -> tuple[NeuCodec, str]:
    """Model with weights loaded (eval mode), and the sha256 of the files read (for export metadata)."""
    return load_family(weights, preset, revision, family=XCODEC2)
