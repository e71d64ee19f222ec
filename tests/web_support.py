"""The browser harness: Debian's Chromium driven by Playwright, pages served by codecport's own
`WebServer` on 127.0.0.1, tiny DAC and Mimi web exports (made once a session).

Chromium and onnxruntime-web come from `scripts/test.sh` (apt's chromium, `npm ci`); where
either is missing the tests fail saying so, rather than skip.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from codecport.bench.browser import CHROMIUM, CHROMIUM_ARGS
from codecport.codecs.dac.export import export_dac
from codecport.codecs.mimi.export import export_mimi
from codecport.export.builds import Build

ROOT = Path(__file__).resolve().parents[1]
ORT_WEB = ROOT / "node_modules" / "onnxruntime-web" / "dist"
ARTIFACTS = Path(os.environ.get("CODECPORT_ARTIFACTS", ROOT / "out" / "test-artifacts"))
# codecport's own flags, plus WebGPU on SwiftShader (the one flag), the fake microphone for the
# live loop, and audio allowed to start without a gesture.
ARGS = [*CHROMIUM_ARGS, "--enable-unsafe-webgpu", "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream", "--autoplay-policy=no-user-gesture-required"]
DAC_WEB_LEN = 1200  # 200 frames of the tiny DAC (hop 6); longer clips take the chunked graphs
MIMI_WEB_LEN = 2400  # 100 frames of the tiny Mimi (24-sample frames); longer ones stream
MIMI_WEB_STEP = 2  # frames a step: partial steps wait in the stream's buffer


def need_browser() -> None:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (scripts/test.sh does), or set "
                    "CODECPORT_CHROMIUM")
    if not (ORT_WEB / "ort.all.min.mjs").is_file():
        pytest.fail(f"{ORT_WEB} is missing: run npm ci in the checkout (scripts/test.sh does)")


class Remote:
    """A Playwright object that lives on the browser's thread: each of its methods runs there."""

    def __init__(self, obj, call):
        self._obj, self._call = obj, call

    def __getattr__(self, name: str):
        if name.startswith("_"):  # this object's own, before __init__ set them (copy, pickle)
            raise AttributeError(name)
        attr = self._call(getattr, self._obj, name)
        return (lambda *args, **kwargs: self._call(attr, *args, **kwargs)) if callable(attr) else attr


class Browser:
    """Chromium through Playwright's sync API, all of it on a thread of its own.

    The sync API runs an asyncio loop on the thread that starts it and leaves it marked running
    between calls, for as long as Playwright runs: on the main thread, every later test of the
    worker would find a loop running, under which `asyncio.run` refuses to start. Its event
    handlers and routes run on that thread too, while a call waits."""

    def __init__(self):
        from playwright.sync_api import sync_playwright

        self._pool = ThreadPoolExecutor(1, thread_name_prefix="playwright")
        self._playwright = self._call(lambda: sync_playwright().start())
        try:
            self._browser = self._call(self._playwright.chromium.launch, executable_path=CHROMIUM, args=ARGS)
        except BaseException:
            self.close()
            raise

    def _call(self, fn, *args, **kwargs):
        return self._pool.submit(fn, *args, **kwargs).result()

    def new_page(self) -> Remote:
        return Remote(self._call(self._browser.new_page), self._call)

    def close(self) -> None:
        try:
            if getattr(self, "_browser", None) is not None:
                self._call(self._browser.close)
        finally:
            self._call(self._playwright.stop)
            self._pool.shutdown()


@pytest.fixture(scope="session")
def browser():
    need_browser()
    b = Browser()
    yield b
    b.close()


@pytest.fixture(scope="session")
def dac_web(tmp_path_factory, tiny_dac):
    out = tmp_path_factory.mktemp("dac_web") / "model"
    export_dac(tiny_dac, out, DAC_WEB_LEN, preset="tiny", weights="random-init seed 0", weights_sha256="none",
               in_graph_codebooks=tiny_dac.cfg.n_codebooks, build=Build("web"))
    return out


@pytest.fixture(scope="session")
def mimi_web(tmp_path_factory, tiny_mimi):
    out = tmp_path_factory.mktemp("mimi_web") / "model"
    export_mimi(tiny_mimi, out, MIMI_WEB_LEN, MIMI_WEB_STEP, preset="tiny", weights="random-init seed 0",
                weights_sha256="none", in_graph_codebooks=tiny_mimi.cfg.n_codebooks, build=Build("web"))
    return out


@contextlib.contextmanager
def served(folder: Path):
    """`WebServer` for `folder` on a free port, stopped on exit."""
    from codecport.serve.web import WebServer

    server = WebServer(folder, ORT_WEB, 0).start()
    try:
        yield server
    finally:
        server.stop()


class Page:
    """A page of the demo, with the console errors and page errors it raised."""

    def __init__(self, browser, url: str, wait: bool = True, timeout_s: float = 120):
        self.page = browser.new_page()
        self.problems: list[str] = []
        self.page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.set_default_timeout(timeout_s * 1000)
        self.page.goto(url)
        if wait:
            self.page.wait_for_function("document.body.dataset.state !== 'loading'")

    @property
    def state(self) -> str:
        return self.page.evaluate("document.body.dataset.state")

    def error(self) -> str:
        return self.page.inner_text("#error")

    def run(self, script: str, arg=None):
        return self.page.evaluate(script, arg)

    def close(self) -> None:
        self.page.close()


def webgpu_page(browser, url: str) -> Page:
    """The demo at `url` (its query without `ep`) on WebGPU, one thread, ready; skips the test,
    saying so, where this Chromium gives no WebGPU adapter."""
    page = Page(browser, f"{url}{'&' if '?' in url else '?'}ep=webgpu&threads=1", wait=False)
    if not page.run("async () => !!(navigator.gpu && await navigator.gpu.requestAdapter())"):
        page.close()
        pytest.skip("no WebGPU adapter in this Chromium (navigator.gpu.requestAdapter() gave none)")
    page.page.wait_for_function("document.body.dataset.state !== 'loading'")
    assert page.state == "ready", page.error()
    return page


# The smoke exports' model and length (registry.py), for the browser; NeuCodec's with a shorter
# bucket. XCodec2's has none: buckets are one mechanism of the plans, which NeuCodec's folder
# tests, and two more graphs would be a tenth of test_web_windows.py's cost.
WEB_ARGS = ("--preset", "tiny", "--len", "4000", "--target", "web")
BUCKETS = {"neucodec": ("--buckets", "2000"), "xcodec2": ()}


def web_folder(tmp_path_factory, name: str) -> Path:
    """NeuCodec's or XCodec2's web folder, built once a run (shared_exports.py): test_web.py's
    WebGPU page runs NeuCodec's too."""
    from shared_exports import cli_export, shared

    return shared(tmp_path_factory, f"web-{name}",
                  lambda folder: cli_export(folder, name, *WEB_ARGS, *BUCKETS[name]))


def distilled_web_folder(tmp_path_factory) -> Path:
    """The distilled NeuCodec's web folder, built once a run (shared_exports.py)."""
    from shared_exports import cli_export, shared

    return shared(tmp_path_factory, "web-neucodec-distill", lambda f: cli_export(
        f, "neucodec", "--preset", "tiny-distill", "--len", "4000", "--target", "web"))


def mount(page: Page, name: str, folder: Path) -> str:
    """Export `folder` at /`name`/ on `page`'s own origin (Playwright answers from disk), so one
    page runs several folders: onnxruntime-web compiles a WebGPU kernel once a page, for every
    session, and SwiftShader's compiles are most of what the WebGPU tests cost (a tiny NeuCodec
    encoder's first call 16 s alone, 6 s after the distilled encoder's). Returns the URL path."""
    def answer(route) -> None:
        file = folder / route.request.url.rsplit("/", 1)[1]
        if file.is_file():
            route.fulfill(path=file)
        else:
            route.fulfill(status=404, body="")

    page.page.route(f"**/{name}/*", answer)
    return f"/{name}/"


# Load the folder at a URL on WebGPU, encoder alone, and encode a clip.
LOAD_ENCODE = """async ([url, x]) => {
  const c = await window.demo.load(url, {ort: window.demo.ort, executionProviders: ["webgpu"],
                                         sides: ["encode"]});
  const codes = await c.encode(Float32Array.from(x));
  return {codes: Array.from(codes.data), shape: codes.shape};
}"""


def clip(n: int, seed: int = 0) -> np.ndarray:
    """A test clip: a tone with a moving pitch and some noise, float32 in [-1, 1]."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return (0.4 * np.sin(0.02 * t + 2e-5 * t * t) + 0.05 * rng.standard_normal(n)).astype(np.float32)


# Encode then decode in the page; codes come back as {data, shape} with their fields, audio as a list.
ROUND_TRIP = """async (x) => {
  const c = window.demo.codec;
  const codes = await c.encode(Float32Array.from(x));
  const audio = await c.decode(codes);
  const {data, shape, ...fields} = codes;
  return {codes: Array.from(data), shape, fields, audio: Array.from(audio)};
}"""

DECODE = ("async ([data, shape]) => "
          "Array.from(await window.demo.codec.decode({data: Int32Array.from(data), shape}))")

# A codes file the Python runtime wrote, read and decoded in the page.
DECODE_FILE = """async (bytes) => {
  const { readCodes } = await import("/codecport.mjs");
  const codes = await readCodes(Uint8Array.from(bytes));
  const {data, shape, ...fields} = codes;
  return {fields, shape, audio: Array.from(await window.demo.codec.decode(codes))};
}"""

# Python's Codes fields under the module's names.
JS_FIELDS = {"codec": "codec", "preset": "preset", "export_id": "exportId", "sample_rate": "sampleRate",
             "num_samples": "numSamples", "loudness_db": "loudnessDb", "mode": "mode",
             "chunk_frames": "chunkFrames"}


def same_fields(codes, js: dict) -> None:
    """The module's fields are the Python `Codes`' (the loudness within float rounding)."""
    for py_name, js_name in JS_FIELDS.items():
        want = getattr(codes, py_name)
        got = js.get(js_name)
        if isinstance(want, float):
            assert got is not None and abs(got - want) < 1e-6, (py_name, got, want)
        else:
            assert got == want, (py_name, got, want)


