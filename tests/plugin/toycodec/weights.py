"""The toy codec's weights: a safetensors file of its state dict (none is released)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from codecport.errors import CheckpointError

from .config import PRESETS
from .model import ToyModel


def load(weights: str, preset: str | None = None, revision: str | None = None) -> tuple[ToyModel, str]:
    from safetensors.torch import load_file

    path = Path(weights)
    if not path.is_file():
        raise CheckpointError(f"{weights}: no such weights file; the toy codec has no released weights")
    model = ToyModel(PRESETS[preset or "toy"])
    model.load_state_dict(load_file(str(path)))
    return model.eval(), hashlib.sha256(path.read_bytes()).hexdigest()
