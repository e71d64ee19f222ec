"""`codec-run web`: the browser runtime served on 127.0.0.1, with a demo page.

Routes: `/` the demo page, `/codecport.mjs` the module, `/model/` the export folder (its files
only), `/ort/` onnxruntime-web's `dist`. Every response is cross-origin isolated (COOP/COEP,
CORP same-origin), which multi-threaded WASM needs (SharedArrayBuffer), and uncached, so a
re-export shows on reload. Nothing else is served: no listing, no path outside the folders.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import ClassVar
from urllib.parse import unquote, urlsplit

from ..errors import CodecportError, ModelFileError
from ..runtime.folder import read_manifest
from .access import host_allowed, hosts

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
ORT_WEB_ENV = "CODECPORT_ORT_WEB"
TYPES = {".html": "text/html; charset=utf-8", ".mjs": "text/javascript", ".js": "text/javascript",
         ".wasm": "application/wasm", ".json": "application/json", ".onnx": "application/octet-stream",
         ".map": "application/json", ".txt": "text/plain; charset=utf-8"}
ISOLATION = {"Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
             "Cross-Origin-Resource-Policy": "same-origin", "Cache-Control": "no-store"}
# The bundles the page imports: wasm alone, or with WebGPU (JSEP), each with its own .wasm.
ORT_ENTRIES = ("ort.wasm.min.mjs", "ort.all.min.mjs")
BLOCK = 1 << 16  # bytes a file is sent in


def web_asset(name: str) -> Path:
    """A file of the package's browser runtime (`codecport.mjs`, `index.html`)."""
    return Path(str(resources.files("codecport") / "web" / name))


def find_ort_web(given: str | Path | None) -> Path:
    """onnxruntime-web's `dist` folder: `given`, else `$CODECPORT_ORT_WEB`, else
    `node_modules/onnxruntime-web/dist` in the working folder or beside the package's source."""
    candidates = [Path(given)] if given else []
    if not given and os.environ.get(ORT_WEB_ENV):
        candidates.append(Path(os.environ[ORT_WEB_ENV]))
    if not candidates:
        here = Path(__file__).resolve().parents[2]
        candidates = [Path.cwd() / "node_modules" / "onnxruntime-web",
                      here / "node_modules" / "onnxruntime-web"]
    for c in candidates:
        for d in (c, c / "dist"):
            if all((d / e).is_file() for e in ORT_ENTRIES) and any(d.glob("*.wasm")):
                return d.resolve()
    where = given or os.environ.get(ORT_WEB_ENV) or "node_modules/onnxruntime-web"
    raise CodecportError(f"{where}: no onnxruntime-web here ({' and '.join(ORT_ENTRIES)} and their .wasm "
                         "files); run `npm install onnxruntime-web` (or `npm ci` in a codecport checkout), "
                         "or pass --ort-web DIR pointing at its dist folder")


def check_web_folder(folder: Path) -> dict:
    """The manifest of a folder the browser can run, or `ModelFileError` saying what to do."""
    from .. import registry

    spec = registry.codec_of_folder(folder)
    manifest = read_manifest(folder)
    if manifest is None or manifest.get("quantizer") != "graph" or \
            not isinstance(manifest.get("graphs"), dict):
        raise ModelFileError(f"{folder}: not a web export (the browser reads no rvq.npz and no ONNX "
                             f"metadata); re-export it with codec-export {spec.name} --target web")
    for name, facts in manifest["graphs"].items():
        file = facts.get("file") if isinstance(facts, dict) else None
        if not isinstance(file, str) or not (folder / file).is_file():
            raise ModelFileError(f"{folder}: {name}'s file {file} is missing; copy the whole export folder")
    return manifest


class _Handler(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, Path]] = {}  # URL prefix -> folder (resolved)
    files: ClassVar[dict[str, Path]] = {}  # exact URL -> file
    hosts: ClassVar[frozenset[str]] = frozenset()  # Host headers this server answers to

    def log_message(self, fmt, *args) -> None:
        log.info("%s %s", self.address_string(), fmt % args)

    def _resolve(self, path: str) -> Path | None:
        if path in self.files:
            return self.files[path]
        for prefix, root in self.routes.items():
            if path.startswith(prefix):
                name = path[len(prefix):]
                # One file directly inside the folder: no "..", no subfolders, no dotfiles, and no
                # link out of it (the folder is a user's; what it links to elsewhere is not served).
                if name and "/" not in name and "\\" not in name and not name.startswith("."):
                    f = root / name
                    try:
                        if f.is_file() and f.resolve().parent == root:
                            return f
                    except OSError:  # a name past the file system's bound: no such file here
                        return None
        return None

    def _head(self, status: int, ctype: str, length: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(length))
        for k, v in ISOLATION.items():
            self.send_header(k, v)
        self.end_headers()

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self._reply(status, ctype, len(body), io.BytesIO(body))

    def _reply(self, status: int, ctype: str, length: int, body) -> None:
        """Headers, then `body` (a file object) a block at a time unless the request is a HEAD."""
        self._head(status, ctype, length)
        if self.command != "HEAD":
            try:
                shutil.copyfileobj(body, self.wfile, BLOCK)
            except (BrokenPipeError, ConnectionResetError):
                log.info("client went away during %s", self.path)

    def do_GET(self) -> None:
        # A page of another site can reach 127.0.0.1 through a name it controls (DNS rebinding):
        # its requests carry that name as their Host, which this server does not answer.
        if not host_allowed(self.headers.get("Host"), self.hosts):
            self._send(HTTPStatus.MISDIRECTED_REQUEST,
                       b"this server answers to 127.0.0.1 and localhost only\n",
                       TYPES[".txt"])
            return
        path = unquote(urlsplit(self.path).path)
        f = self._resolve(path)
        if f is None:
            self._send(HTTPStatus.NOT_FOUND, f"{path}: not found\n".encode(), TYPES[".txt"])
            return
        try:
            handle = open(f, "rb")  # noqa: SIM115 (closed below, after the headers and the copy)
        except OSError as e:
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, f"{path}: {e.strerror}\n".encode(), TYPES[".txt"])
            return
        with handle:
            # Streamed a block at a time: a graph of hundreds of MB never sits in memory.
            self._reply(HTTPStatus.OK, TYPES.get(f.suffix, "application/octet-stream"),
                        os.fstat(handle.fileno()).st_size, handle)

    do_HEAD = do_GET


class WebServer:
    """The demo server for `model_dir` on 127.0.0.1:`port` (0: any free port); `url` once
    started. `serve_forever()` blocks; `start()` serves from a thread (tests), `stop()` ends it."""

    def __init__(self, model_dir: str | Path, ort_web: str | Path | None = None, port: int = 8000):
        self.model_dir = Path(model_dir)
        self.manifest = check_web_folder(self.model_dir)
        self.ort_dir = find_ort_web(ort_web)
        assets = web_asset("index.html").parent
        handler = type("Handler", (_Handler,), {
            "routes": {"/model/": self.model_dir.resolve(), "/ort/": self.ort_dir},
            "files": {"/": assets / "index.html", "/index.html": assets / "index.html",
                      **{f"/{m.name}": m for m in sorted(assets.glob("*.mjs"))}}})
        try:
            self.httpd = ThreadingHTTPServer((HOST, port), handler)
        except OSError as e:
            raise CodecportError(f"cannot listen on {HOST}:{port} ({e.strerror}); pass another --port "
                                 "(0 picks a free one)") from e
        self.httpd.daemon_threads = True
        bound = self.httpd.server_address[1]
        handler.hosts = hosts(HOST, bound)
        self.url = f"http://{HOST}:{bound}/"
        self._thread: threading.Thread | None = None

    def serve_forever(self) -> None:
        try:
            self.httpd.serve_forever()
        finally:
            self.httpd.server_close()

    def start(self) -> WebServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="codecport-web", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()
