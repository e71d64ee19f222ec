"""The distilled NeuCodec in the browser (`--preset tiny-distill --target web`): on wasm against the
Python runtime, and run on WebGPU. Apart from test_web_windows.py so that the test processes share
the browser's work (each file runs whole in one process)."""

from __future__ import annotations

import numpy as np
import pytest
from shared_exports import cli_export, shared
from web_support import DECODE, ROUND_TRIP, Page, clip, served, webgpu_page

import codecport
from codecport.export.check import check

pytestmark = pytest.mark.browser


def distilled_web_folder(tmp_path_factory):
    return shared(tmp_path_factory, "web-neucodec-distill", lambda f: cli_export(
        f, "neucodec", "--preset", "tiny-distill", "--len", "4000", "--target", "web"))


def test_the_distilled_encoder_in_the_browser(browser, tmp_path_factory):
    """The distilled NeuCodec (`--preset tiny-distill --target web`: DistilHuBERT's normalised
    samples and the FSQ in the graph): every node on WebGPU's kernel table in one partition, and
    on wasm the Python runtime's codes, a clip that fits and one through windows, and audio
    within 1e-4 of Python's."""
    folder = distilled_web_folder(tmp_path_factory)
    for r in check(folder):
        assert r["eps"]["wasm"]["full"] and r["eps"]["webgpu"]["partitions"] == 1, (r["file"], r["eps"]["webgpu"])
    py = codecport.load(folder)
    with served(folder) as server:
        page = Page(browser, server.url)
        assert page.state == "ready", page.error()
        for n in (3000, 20001):  # one graph call, and windows
            x = clip(n, seed=n)
            want = py.encode(x, 16000)
            got = page.run(ROUND_TRIP, x.tolist())
            np.testing.assert_array_equal(np.array(got["codes"]).reshape(got["shape"]), want.data[0], err_msg=f"{n}")
            bare = py.decode(want.data[0])[0][0]
            audio = np.array(page.run(DECODE, [want.data[0].ravel().tolist(), list(want.data[0].shape)]), np.float32)
            assert audio.shape == bare.shape and np.abs(audio - bare).max() < 1e-4, n
        assert page.problems == []
        page.close()


ENCODE = """async (x) => {
  const c = await window.demo.codec.encode(Float32Array.from(x));
  return {codes: Array.from(c.data), shape: c.shape};
}"""


def test_the_distilled_encoder_on_webgpu(browser, tmp_path_factory):
    """The distilled encoder run on WebGPU (SwiftShader here), not only its kernel table's
    verdict: its codes of a clip (its local attention over several of its windows, in one graph
    call) agree with the Python runtime's (FSQ rounds what a GPU's float order moves, so not
    all); skipped, saying so, where no adapter appears. The page opens the encoder alone: the
    decoder is tiny NeuCodec's, which test_web_windows.py runs on WebGPU (each graph's first call
    compiles its shaders, the cost of these tests)."""
    folder = distilled_web_folder(tmp_path_factory)
    py = codecport.load(folder)
    with served(folder) as server:
        page = webgpu_page(browser, f"{server.url}?sides=encode")
        x = clip(3000, seed=5)  # one graph call
        want = py.encode(x, 16000).data[0]
        got = page.run(ENCODE, x.tolist())
        assert got["shape"] == list(want.shape)
        agree = (np.array(got["codes"]).reshape(got["shape"]) == want).mean()
        assert agree > 0.9, agree
        assert page.problems == []
        page.close()
