"""Mimi's released weights fetched by name or URL from a local HTTP server into the XDG cache."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_download import Server, cached_files, serve, serve_dir

from codecport.errors import DownloadError
from codecport.models.mimi import PRESETS
from codecport.models.mimi_weights import BASE_URL_ENV, RELEASES, load_mimi

REPO, FILE = RELEASES["mimi"]
RELEASE_PATH = f"/{REPO}/resolve/main/{FILE}"  # Hugging Face's layout under the base URL


pytestmark = pytest.mark.usefixtures("cache")


@pytest.fixture(scope="module")
def official_file(tmp_path_factory, tiny_mimi) -> Path:
    """The tiny model saved as moshi's safetensors file (moshi's key names are ours)."""
    path = tmp_path_factory.mktemp("mimi_ckpt") / FILE
    save_file({k: v.contiguous() for k, v in tiny_mimi.state_dict().items()}, path)
    return path


@pytest.fixture
def server(tmp_path, official_file, monkeypatch) -> Iterator[Server]:
    """Serves the file as the release and as `/tiny-mimi.safetensors`, counting GETs."""
    root = tmp_path / "served"
    (root / RELEASE_PATH[1:]).parent.mkdir(parents=True)
    shutil.copyfile(official_file, root / RELEASE_PATH[1:])
    shutil.copyfile(official_file, root / "tiny-mimi.safetensors")
    with serve_dir(root) as srv:
        monkeypatch.setenv(BASE_URL_ENV, srv.url)
        yield srv


def assert_same_model(model, tiny_mimi) -> None:
    assert model.cfg == PRESETS["tiny"]
    got, want = model.state_dict(), tiny_mimi.state_dict()
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_release_by_name(server, cache, official_file, tiny_mimi):
    served = official_file.read_bytes()
    model, sha = load_mimi("mimi", variant="tiny")
    dest = cache / "codecport" / "mimi" / REPO / FILE
    assert dest.read_bytes() == served
    assert cached_files(cache) == [dest]  # nothing else, no .part left over
    assert sha == hashlib.sha256(served).hexdigest()
    assert_same_model(model, tiny_mimi)
    assert server.hits == [RELEASE_PATH]

    model2, sha2 = load_mimi("mimi", variant="tiny")
    assert server.hits == [RELEASE_PATH]  # served from the cache
    assert sha2 == sha
    assert_same_model(model2, tiny_mimi)


def test_release_by_url(server, cache, official_file, tiny_mimi):
    url = f"{server.url}/tiny-mimi.safetensors"
    model, sha = load_mimi(url, variant="tiny")
    files = cached_files(cache)
    assert len(files) == 1 and files[0].name == "tiny-mimi.safetensors"
    assert files[0].read_bytes() == official_file.read_bytes()
    assert sha == hashlib.sha256(official_file.read_bytes()).hexdigest()
    assert_same_model(model, tiny_mimi)
    load_mimi(url, variant="tiny")
    assert server.hits == ["/tiny-mimi.safetensors"]


def test_not_found(server, cache):
    (server.root / RELEASE_PATH[1:]).unlink()
    with pytest.raises(DownloadError, match="404"):
        load_mimi("mimi", variant="tiny")
    assert cached_files(cache) == []


@pytest.mark.parametrize("when", ["mid-body", "before-reply"])
def test_dropped_connection(official_file, cache, monkeypatch, when):
    """A connection that drops, before or during the body, leaves nothing in the cache."""
    body = official_file.read_bytes()

    class Dropping(BaseHTTPRequestHandler):
        def do_GET(self):
            if when == "mid-body":
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
            self.close_connection = True

        def log_message(self, *args):
            pass

    with serve(Dropping) as url:
        monkeypatch.setenv(BASE_URL_ENV, url)
        match = f"stopped at {len(body) // 2} of {len(body)} bytes" if when == "mid-body" else \
            "cannot download"
        with pytest.raises(DownloadError, match=match):
            load_mimi("mimi", variant="tiny")
    assert cached_files(cache) == []
