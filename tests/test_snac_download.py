"""SNAC's released weights by name through huggingface_hub, from a local server that answers as
the Hub does (HF_ENDPOINT on 127.0.0.1): both files of the official layout, from one revision,
into the shared Hugging Face cache; each load in a process of its own, as `codec-export` runs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import official_snac
from test_mimi_download import COMMITS, hub

from codecport.codecs.snac.config import RELEASES

REPO = RELEASES["24khz"]
LOAD = """
import json, sys
from codecport.errors import CodecportError
from codecport.codecs.snac.weights import load
try:
    model, sha = load(sys.argv[1], revision=sys.argv[2] or None)
except CodecportError as e:
    print(json.dumps({"error": str(e)}))
else:
    print(json.dumps({"sha": sha, "cfg": model.cfg.to_kwargs(),
                      "sum": float(sum(v.double().sum() for v in model.state_dict().values()))}))
"""


def _load(weights: str, env: dict, revision: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", LOAD, weights, revision], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def release(tiny_snac) -> dict[str, dict[str, bytes]]:
    """The tiny model in the official layout as revision main; v1 holds doubled weights."""
    out = {}
    for rev, scale in (("main", 1.0), ("v1", 2.0)):
        buf = io.BytesIO()
        sd = official_snac(tiny_snac).state_dict()
        torch.save({k: v * scale if v.is_floating_point() and "inv_freq" not in k else v
                    for k, v in sd.items()}, buf)
        out[rev] = {"pytorch_model.bin": buf.getvalue(),
                    "config.json": json.dumps(tiny_snac.cfg.to_kwargs()).encode()}
    return out


@pytest.fixture
def env(tmp_path) -> dict:
    out = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and not k.startswith("HF_")}
    return {**out, "HF_HOME": str(tmp_path / "hf"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}


def test_release_by_name_fetches_both_files_into_the_shared_cache(release, env, tiny_snac):
    with hub(release, repo=REPO) as h:
        env = {**env, "HF_ENDPOINT": h.url}
        got = _load("24khz", env)
        assert got["sha"] == hashlib.sha256(release["main"]["pytorch_model.bin"]).hexdigest()
        assert got["cfg"] == tiny_snac.cfg.to_kwargs()  # the config is the file's, not the preset's
        assert got["sum"] == \
            pytest.approx(float(sum(v.double().sum() for v in tiny_snac.state_dict().values())))
        assert sorted(h.gets) == [f"/{REPO}/resolve/main/config.json",
                                  f"/{REPO}/resolve/main/pytorch_model.bin"]
        snap = sorted(Path(env["HF_HOME"]).rglob("snapshots/*/pytorch_model.bin"))
        assert len(snap) == 1 and COMMITS["main"] in str(snap[0])
        assert _load("24khz", env)["sha"] == got["sha"] and len(h.gets) == 2  # the cache answers
        v1 = _load("24khz", env, revision="v1")
        assert v1["sha"] == hashlib.sha256(release["v1"]["pytorch_model.bin"]).hexdigest() != got["sha"]


def test_a_repo_without_its_config_says_so(release, env):
    with hub({"main": {"pytorch_model.bin": release["main"]["pytorch_model.bin"]}}, repo=REPO) as h:
        got = _load("24khz", {**env, "HF_ENDPOINT": h.url})
        assert "cannot fetch config.json" in got["error"] and REPO in got["error"]
    got = _load("24khz", {**env, "HF_HUB_OFFLINE": "1"})
    assert "HF_HUB_OFFLINE is set" in got["error"]
