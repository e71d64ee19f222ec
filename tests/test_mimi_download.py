"""Mimi's released weights fetched through huggingface_hub from a local server that answers as
the Hub does (HF_ENDPOINT on 127.0.0.1): the shared Hugging Face cache, revisions, HF_TOKEN and
HF_HUB_OFFLINE; and by plain URL into the XDG cache.

huggingface_hub reads its environment when it is imported, so each load runs in a process of
its own, as a user's `codec-export` would.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from codecport.codecs.mimi.config import RELEASES

REPO, FILE = RELEASES["mimi"]
COMMITS = {"main": "a" * 40, "v1": "b" * 40}


@dataclass
class Hub:
    url: str
    files: dict[str, dict[str, bytes]]  # revision -> file name -> its bytes
    gets: list[str] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    drop: bool = False  # stop the body halfway


@contextmanager
def hub(files: dict, repo: str = REPO) -> Iterator[Hub]:
    """`/{repo}/resolve/{revision}/{file}` as the Hub answers it: HEAD with the commit, ETag and
    size, GET with the bytes; anything else 404. `files`: revision -> the bytes of `FILE`, or
    revision -> {file name: bytes} (a repo of several files)."""
    state = Hub("", {rev: f if isinstance(f, dict) else {FILE: f} for rev, f in files.items()})

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: bool) -> None:
            state.auth.append(self.headers.get("Authorization"))
            parts = self.path.split("?")[0].split("/resolve/")
            rev, _, name = parts[1].partition("/") if len(parts) == 2 else ("", "", "")
            if parts[0] != f"/{repo}" or rev not in state.files or name not in state.files[rev]:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.end_headers()
                return
            data = state.files[rev][name]
            self.send_response(200)
            self.send_header("X-Repo-Commit", COMMITS[rev])
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                state.gets.append(self.path)
                self.wfile.write(data[:len(data) // 2] if state.drop else data)
                self.close_connection = state.drop

        def do_HEAD(self):
            self._answer(False)

        def do_GET(self):
            self._answer(True)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


LOAD = """
import json, sys
from codecport.errors import CodecportError
from codecport.codecs.mimi.weights import load
try:
    model, sha = load(sys.argv[1], preset="tiny", revision=sys.argv[2] or None)
except CodecportError as e:
    print(json.dumps({"error": str(e)}))
else:
    print(json.dumps({"sha": sha, "sum": float(sum(v.double().sum() for v in model.state_dict().values()))}))
"""


def load_in_process(weights: str, env: dict, revision: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", LOAD, weights, revision], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def weights(tmp_path_factory, tiny_mimi) -> dict[str, bytes]:
    """The tiny model in moshi's file format as revision main, and a perturbed copy as v1."""
    root = tmp_path_factory.mktemp("mimi_ckpt")
    sd = {k: v.contiguous() for k, v in tiny_mimi.state_dict().items()}
    save_file(sd, root / "main.safetensors")
    save_file({k: v * 2 if v.is_floating_point() else v for k, v in sd.items()}, root / "v1.safetensors")
    return {rev: (root / f"{rev}.safetensors").read_bytes() for rev in ("main", "v1")}


@pytest.fixture
def env(tmp_path) -> dict:
    """A process environment with its own Hugging Face cache and XDG cache, and no proxy."""
    out = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and not k.startswith("HF_")}
    return {**out, "HF_HOME": str(tmp_path / "hf"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}


def model_sum(data: bytes, tmp_path: Path) -> float:
    (tmp_path / "x.safetensors").write_bytes(data)
    return float(sum(v.double().sum() for v in load_file(tmp_path / "x.safetensors").values()))


def snapshots(env: dict) -> list[Path]:
    return sorted(Path(env["HF_HOME"]).rglob(f"snapshots/*/{FILE}"))


def test_release_by_name_lands_in_the_shared_cache(tmp_path, weights, env):
    with hub(weights) as h:
        env = {**env, "HF_ENDPOINT": h.url}
        got = load_in_process("mimi", env)
        assert got["sha"] == hashlib.sha256(weights["main"]).hexdigest()
        assert got["sum"] == pytest.approx(model_sum(weights["main"], tmp_path))
        [snap] = snapshots(env)
        assert COMMITS["main"] in str(snap) and snap.read_bytes() == weights["main"]
        assert h.gets == [f"/{REPO}/resolve/main/{FILE}"]
        assert load_in_process("mimi", env)["sha"] == got["sha"]
        assert len(h.gets) == 1  # the second load came from the cache
    assert not (Path(env["XDG_CACHE_HOME"]) / "codecport").exists()  # Hub files live in its cache


def test_revision_and_token(tmp_path, weights, env):
    with hub(weights) as h:
        env = {**env, "HF_ENDPOINT": h.url, "HF_TOKEN": "hf_test_token"}
        got = load_in_process("mimi", env, revision="v1")
        assert got["sha"] == hashlib.sha256(weights["v1"]).hexdigest()
        assert got["sum"] == pytest.approx(model_sum(weights["v1"], tmp_path))
        assert h.gets == [f"/{REPO}/resolve/v1/{FILE}"]
        assert set(h.auth) == {"Bearer hf_test_token"}
        missing = load_in_process("mimi", env, revision="v9")
        assert "cannot fetch" in missing["error"] and REPO in missing["error"]


def test_offline_uses_the_cache_or_says_why(weights, env):
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    cold = load_in_process("mimi", offline)
    assert "HF_HUB_OFFLINE is set" in cold["error"]
    with hub(weights) as h:
        warm = load_in_process("mimi", {**env, "HF_ENDPOINT": h.url})
        hits = len(h.auth)
        assert load_in_process("mimi", {**offline, "HF_ENDPOINT": h.url})["sha"] == warm["sha"]
        assert len(h.auth) == hits  # offline: not one request


def test_not_found_and_dropped_connection(weights, env):
    with hub({}) as h:
        got = load_in_process("mimi", {**env, "HF_ENDPOINT": h.url})
        assert "cannot fetch" in got["error"] and ("404" in got["error"] or "NotFound" in got["error"])
    with hub(weights) as h:
        h.drop = True
        got = load_in_process("mimi", {**env, "HF_ENDPOINT": h.url})
        assert "cannot fetch" in got["error"]
        assert snapshots(env) == []  # nothing half-written where the loader looks


def test_revision_is_for_released_names(tmp_path, env):
    got = load_in_process(str(tmp_path / "w.safetensors"), env, revision="v1")
    assert "--revision picks a revision of a released name" in got["error"]


def test_release_by_url_goes_to_the_xdg_cache(tmp_path, weights, env):
    from test_download import serve_dir

    root = tmp_path / "served"
    root.mkdir()
    (root / "tiny-mimi.safetensors").write_bytes(weights["main"])
    with serve_dir(root) as srv:
        url = f"{srv.url}/tiny-mimi.safetensors"
        got = load_in_process(url, env)
        assert got["sha"] == hashlib.sha256(weights["main"]).hexdigest()
        assert load_in_process(url, env) == got
        assert srv.hits == ["/tiny-mimi.safetensors"]
    files = [p for p in Path(env["XDG_CACHE_HOME"]).rglob("*") if p.is_file()]
    assert [p.name for p in files] == ["tiny-mimi.safetensors"]
    assert torch.equal(load_file(files[0])["downsample.conv.conv.conv.weight"],
                       load_file(root / "tiny-mimi.safetensors")["downsample.conv.conv.conv.weight"])
