"""Helpers the test files import: a test signal and the official packages' models.

Kept out of conftest.py: a test file that imports from `conftest` gets whichever conftest pytest
loaded last once a sub-folder has one of its own (pytest removes `conftest` from sys.modules
before it loads each), so nothing imports from it (test_registry.py checks)."""

from __future__ import annotations

import numpy as np


def noise(n: int, channels: int = 1, seed: int = 0, scale: float = 0.3) -> np.ndarray:
    """Audio-like test signal `[channels, n]`: a few sines plus noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    tones = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in rng.uniform(80, 4000, 4))
    x = scale * (0.2 * tones + 0.5 * rng.standard_normal((channels, n)))
    return x.astype(np.float32)


def official_snac(model):
    """The official `snac.SNAC` of `model`'s config holding `model`'s weights (weight norm
    unfolded back into the official parametrisation)."""
    from snac import SNAC as Official

    from codecport.models.checkpoint import unfold_weight_norm

    official = Official(**model.cfg.to_kwargs()).eval()
    official.load_state_dict(unfold_weight_norm(model.state_dict()))
    return official


def official_neucodec():
    """The official `neucodec` package, imported offline (codecs/neucodec/facts.py)."""
    from codecport.codecs.neucodec.facts import import_official

    return import_official()
