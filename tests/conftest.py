"""Shared fixtures: tiny seeded DAC, Mimi and SNAC models; their exported folders are built once
a run for every worker (shared_exports.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from codecport.codecs.dac.model import DAC, PRESETS, init_random
from codecport.codecs.mimi.model import PRESETS as MIMI_PRESETS
from codecport.codecs.mimi.model import MimiModel
from codecport.codecs.mimi.model import init_random as mimi_init_random

pytest.register_assert_rewrite("shared_exports")  # a plugin (below) this file also imports from

# E402: imported after the line above, which must come first for its asserts to be rewritten.
from shared_exports import (  # noqa: E402, F401 (the constants the test files import from here)
    MIMI_TINY_FRAMES,
    MIMI_TINY_STEP,
    SMOKE_BATCH,
    SNAC_TINY_LEN,
    TINY_CHUNK,
    TINY_LEN,
)

# The exports every worker shares, the Mimi CLI tests' fixtures (shared by two test modules), and
# the browser harness (Chromium, the tiny web exports).
pytest_plugins = ["shared_exports", "mimi_cli_support", "web_support"]

# The files that take longest, in the order a worker should start them (scripts/test.sh passes
# --no-loadscope-reorder so xdist keeps it): one begun last would leave the others idle while it
# runs alone. The durations a run prints at its end show when this goes stale.
LONGEST_FIRST = ["test_ray.py", "test_web.py", "test_web_windows.py", "test_web_distill.py",
                 "test_bench.py", "test_mimi_export.py", "test_tokenize.py", "test_bench_apps.py",
                 "test_tokenize_job.py", "test_rustymimi.py", "test_api.py", "test_builds.py",
                 "test_serve.py", "test_dac_export.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def no_event_loop_left_running():
    """A test that leaves an asyncio loop running on the main thread fails itself, rather than the
    later tests of its worker, whose asyncio.run refuses to start under it (Playwright's sync API
    leaves its loop marked running between calls: web_support.py drives it on a thread)."""
    yield
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    pytest.fail(f"the test left an event loop running on the main thread: {loop!r}")


@pytest.fixture(scope="session")
def tiny_dac() -> DAC:
    return init_random(DAC(PRESETS["tiny"]), seed=0).eval()


@pytest.fixture(scope="session")
def tiny_mimi() -> MimiModel:
    return mimi_init_random(MimiModel(MIMI_PRESETS["tiny"]), seed=0).eval()


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


@pytest.fixture(scope="session")
def tiny_snac():
    from codecport.codecs.snac.model import PRESETS as SNAC_PRESETS
    from codecport.codecs.snac.model import SNAC
    from codecport.codecs.snac.model import init_random as snac_init_random

    return snac_init_random(SNAC(SNAC_PRESETS["tiny"]), seed=0).eval()


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


@pytest.fixture(scope="session")
def tiny_snac_official(tiny_snac):
    return official_snac(tiny_snac)
