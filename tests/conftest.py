"""Shared fixtures: tiny seeded DAC and Mimi models and their exported folders (built once)."""

from __future__ import annotations

import numpy as np
import pytest

from codecport.export.dac import export_dac
from codecport.export.mimi import export_mimi
from codecport.models.dac import DAC, PRESETS, init_random
from codecport.models.mimi import PRESETS as MIMI_PRESETS
from codecport.models.mimi import MimiModel
from codecport.models.mimi import init_random as mimi_init_random

# The Mimi CLI tests' fixtures (exports made once a session), shared by two test modules, and the
# browser harness (Chromium, the tiny web exports).
pytest_plugins = ["mimi_cli_support", "web_support"]

TINY_LEN = 600  # samples of the tiny exact graphs (100 frames of hop 6)
TINY_CHUNK = 3000  # window of the tiny chunked graphs
MIMI_TINY_FRAMES = 40  # code frames of the tiny Mimi fixed graphs (24-sample frames)
MIMI_TINY_STEP = 2  # code frames per step of the tiny Mimi step graphs


@pytest.fixture(scope="session")
def tiny_dac() -> DAC:
    return init_random(DAC(PRESETS["tiny"]), seed=0).eval()


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory, tiny_dac):
    """Folder written by the exporter for the tiny model (numpy quantizer)."""
    out = tmp_path_factory.mktemp("tiny_export")
    export_dac(tiny_dac, out, TINY_LEN, TINY_CHUNK, preset="tiny", weights="random-init seed 0",
               weights_sha256="none")
    return out


@pytest.fixture(scope="session")
def tiny_mimi() -> MimiModel:
    return mimi_init_random(MimiModel(MIMI_PRESETS["tiny"]), seed=0).eval()


@pytest.fixture(scope="session")
def tiny_mimi_export(tmp_path_factory, tiny_mimi):
    """Folder with the tiny Mimi's fixed-length and step graphs (numpy quantizer)."""
    out = tmp_path_factory.mktemp("tiny_mimi_export")
    export_mimi(tiny_mimi, out, MIMI_TINY_FRAMES * tiny_mimi.cfg.frame_size, MIMI_TINY_STEP,
                preset="tiny", weights="random-init seed 0", weights_sha256="none")
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """`$XDG_CACHE_HOME` in tmp_path, and no proxy between urllib and a local test server."""
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    return xdg


def noise(n: int, channels: int = 1, seed: int = 0, scale: float = 0.3) -> np.ndarray:
    """Audio-like test signal `[channels, n]`: a few sines plus noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000
    tones = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in rng.uniform(80, 4000, 4))
    x = scale * (0.2 * tones + 0.5 * rng.standard_normal((channels, n)))
    return x.astype(np.float32)


SMOKE_BATCH = 4  # rows of the smoke exports' batched encoders


@pytest.fixture(scope="session")
def smoke_exports(tmp_path_factory) -> dict:
    """Every registered codec exported through the real `codec-export`, with its registration's
    small `smoke` arguments, batched encoders (`--batch 4`, for codecs that have them) and seeded
    random weights: name -> folder."""
    import subprocess
    import sys
    from pathlib import Path

    from codecport import registry

    root = tmp_path_factory.mktemp("smoke")
    out = {}
    for spec in registry.codecs():
        folder = root / spec.name
        batch = ["--batch", str(SMOKE_BATCH)] if spec.runtime.batchable else []
        proc = subprocess.run([str(Path(sys.executable).parent / "codec-export"), spec.name, *spec.smoke,
                               *batch, "--random-init", "-o", str(folder)],
                              capture_output=True, text=True,
                              timeout=600, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out[spec.name] = folder
    return out


SNAC_TINY_LEN = 720  # samples of the tiny SNAC window graphs: 120 frames, 64 kept a window


@pytest.fixture(scope="session")
def tiny_snac():
    from codecport.models.snac import PRESETS as SNAC_PRESETS
    from codecport.models.snac import SNAC
    from codecport.models.snac import init_random as snac_init_random

    return snac_init_random(SNAC(SNAC_PRESETS["tiny"]), seed=0).eval()


def official_snac(model):
    """The official `snac.SNAC` of `model`'s config holding `model`'s weights (weight norm
    unfolded back into the official parametrisation)."""
    from snac import SNAC as Official

    from codecport.models.checkpoint import unfold_weight_norm

    official = Official(**model.cfg.to_kwargs()).eval()
    official.load_state_dict(unfold_weight_norm(model.state_dict()))
    return official


@pytest.fixture(scope="session")
def tiny_snac_official(tiny_snac):
    return official_snac(tiny_snac)


@pytest.fixture(scope="session")
def tiny_snac_export(tmp_path_factory, tiny_snac):
    from codecport.export.snac import export_snac

    out = tmp_path_factory.mktemp("tiny_snac_export")
    export_snac(tiny_snac, out, SNAC_TINY_LEN, preset="tiny", weights="random-init seed 0",
                weights_sha256="none")
    return out
