"""Shared fixtures: tiny seeded DAC, Mimi and SNAC models; their exported folders are built once
a run for every worker (shared_exports.py)."""

from __future__ import annotations

import asyncio

import pytest
from support import official_snac

from codecport.codecs.dac.model import DAC, PRESETS, init_random
from codecport.codecs.mimi.model import PRESETS as MIMI_PRESETS
from codecport.codecs.mimi.model import MimiModel
from codecport.codecs.mimi.model import init_random as mimi_init_random

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


@pytest.fixture(scope="session")
def tiny_snac():
    from codecport.codecs.snac.model import PRESETS as SNAC_PRESETS
    from codecport.codecs.snac.model import SNAC
    from codecport.codecs.snac.model import init_random as snac_init_random

    return snac_init_random(SNAC(SNAC_PRESETS["tiny"]), seed=0).eval()


@pytest.fixture(scope="session")
def tiny_snac_official(tiny_snac):
    return official_snac(tiny_snac)
