"""Released weights fetched by name or URL from a local HTTP server into the XDG cache."""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from codecport.codecs.dac.model import PRESETS
from codecport.codecs.dac.weights import load_dac
from codecport.errors import DownloadError


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Base URL of `handler` served on 127.0.0.1 from a daemon thread."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@dataclass
class Server:
    root: Path
    url: str
    hits: list[str] = field(default_factory=list)


def cached_files(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.is_file()]


@contextmanager
def serve_dir(root: Path) -> Iterator[Server]:
    """`root` served on 127.0.0.1, recording the path of every GET."""
    hits: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            hits.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    with serve(Handler) as url:
        yield Server(root, url, hits)


pytestmark = pytest.mark.usefixtures("cache")


@pytest.fixture(scope="module")
def official_pth(tmp_path_factory, tiny_dac) -> Path:
    """The tiny model saved as an official DAC checkpoint: weight-norm pairs and its config."""
    sd = {}
    for key, w in tiny_dac.state_dict().items():
        if key.endswith(".weight") and w.dim() == 3 and "codebook" not in key:
            stem = key[: -len(".weight")]
            sd[stem + ".weight_g"] = w.norm(dim=(1, 2), keepdim=True).clone()
            sd[stem + ".weight_v"] = (w * 2.5).clone()
        else:
            sd[key] = w.clone()
    assert not any(k.endswith(".weight") and v.dim() == 3 for k, v in sd.items())
    path = tmp_path_factory.mktemp("ckpt") / "weights.pth"
    torch.save({"state_dict": sd, "metadata": {"kwargs": PRESETS["tiny"].to_kwargs()}}, path)
    return path


@pytest.fixture
def server(tmp_path, official_pth, monkeypatch) -> Iterator[Server]:
    """Serves the checkpoint as the 44khz release (<base>/0.0.1/weights.pth), counting GETs."""
    root = tmp_path / "served"
    (root / "0.0.1").mkdir(parents=True)
    shutil.copyfile(official_pth, root / "0.0.1" / "weights.pth")
    with serve_dir(root) as srv:
        monkeypatch.setenv("CODECPORT_DAC_BASE_URL", srv.url)
        yield srv


def assert_same_model(model, tiny_dac) -> None:
    assert model.cfg == PRESETS["tiny"]
    got, want = model.state_dict(), tiny_dac.state_dict()
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.allclose(got[k], v, rtol=0, atol=1e-6), k


def test_release_by_name(server, cache, tiny_dac):
    served = (server.root / "0.0.1" / "weights.pth").read_bytes()
    model, sha = load_dac("44khz")
    dest = cache / "codecport" / "dac" / "0.0.1" / "weights.pth"
    assert dest.read_bytes() == served
    assert cached_files(cache) == [dest]  # nothing else, no .part left over
    assert sha == hashlib.sha256(served).hexdigest()
    assert_same_model(model, tiny_dac)
    assert server.hits == ["/0.0.1/weights.pth"]

    model2, sha2 = load_dac("44khz")
    assert server.hits == ["/0.0.1/weights.pth"]  # served from the cache
    assert sha2 == sha
    assert_same_model(model2, tiny_dac)


def test_release_by_url(server, cache, tiny_dac):
    served = (server.root / "0.0.1" / "weights.pth").read_bytes()
    model, sha = load_dac(f"{server.url}/0.0.1/weights.pth")
    files = cached_files(cache)
    assert len(files) == 1 and files[0].name == "weights.pth"
    assert files[0].read_bytes() == served
    assert sha == hashlib.sha256(served).hexdigest()
    assert_same_model(model, tiny_dac)
    load_dac(f"{server.url}/0.0.1/weights.pth")
    assert server.hits == ["/0.0.1/weights.pth"]


def test_not_found(server, cache):
    (server.root / "0.0.1" / "weights.pth").unlink()
    with pytest.raises(DownloadError, match="404"):
        load_dac("44khz")
    assert cached_files(cache) == []


def test_truncated_body(official_pth, cache, monkeypatch):
    body = official_pth.read_bytes()

    class Truncating(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True

        def log_message(self, *args):
            pass

    with serve(Truncating) as url:
        monkeypatch.setenv("CODECPORT_DAC_BASE_URL", url)
        with pytest.raises(DownloadError, match=f"{len(body) // 2} of {len(body)} bytes"):
            load_dac("44khz")
    assert cached_files(cache) == []


def test_a_web_page_served_as_weights_is_not_kept(cache, monkeypatch):
    """A login or error page served with status 200 would be cached as the weights, and every
    later run would reuse it: refused as it arrives, nothing cached."""
    page = b"\n  <!DOCTYPE html><html><body>Sign in</body></html>"

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    with serve(Page) as url, pytest.raises(DownloadError, match="returned a web page, not weights"):
        load_dac(f"{url}/weights.pth")
    assert cached_files(cache) == []


def test_a_damaged_cached_download_says_to_delete_it(server, cache, tiny_dac):
    """A cached `--weights URL` file is reused by every run, so "re-download it" cannot work: the
    error names the cached file to delete; once it is gone, the next run downloads it again."""
    from codecport.errors import CheckpointError

    url = f"{server.url}/0.0.1/weights.pth"
    load_dac(url)
    (cached,) = cached_files(cache)
    cached.write_bytes(cached.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=f"codecport's cached download: delete {cached} and run again"):
        load_dac(url)
    cached.unlink()
    assert_same_model(load_dac(url)[0], tiny_dac)
    assert server.hits == ["/0.0.1/weights.pth"] * 2
