"""The distilled NeuCodec in the browser (`--preset tiny-distill --target web`) on wasm against the
Python runtime. Apart from test_web_windows.py so that the test processes share the browser's
work (each file runs whole in one process); its WebGPU run is test_web.py's, in the one page that
runs every codec on WebGPU, whose compiled kernels it shares."""

from __future__ import annotations

import numpy as np
import pytest
from web_support import DECODE, ROUND_TRIP, Page, clip, distilled_web_folder, served

import codecport
from codecport.export.check import check

pytestmark = pytest.mark.browser


def test_the_distilled_encoder_in_the_browser(browser, tmp_path_factory):
    """The distilled NeuCodec (`--preset tiny-distill --target web`: DistilHuBERT's normalised
    samples and the FSQ in the graph): every node on WebGPU's kernel table in one partition, and
    on wasm the Python runtime's codes, a clip that fits and one through windows, and audio
    within 1e-4 of Python's."""
    folder = distilled_web_folder(tmp_path_factory)
    for r in check(folder):
        assert r["eps"]["wasm"]["full"] and r["eps"]["webgpu"]["partitions"] == 1, \
            (r["file"], r["eps"]["webgpu"])
    py = codecport.load(folder)
    with served(folder) as server:
        page = Page(browser, server.url)
        assert page.state == "ready", page.error()
        for n in (3000, 20001):  # one graph call, and windows
            x = clip(n, seed=n)
            want = py.encode(x, 16000)
            got = page.run(ROUND_TRIP, x.tolist())
            np.testing.assert_array_equal(np.array(got["codes"]).reshape(got["shape"]), want.data[0],
                                          err_msg=f"{n}")
            bare = py.decode(want.data[0])[0][0]
            audio = np.array(page.run(DECODE, [want.data[0].ravel().tolist(), list(want.data[0].shape)]),
                             np.float32)
            assert audio.shape == bare.shape and np.abs(audio - bare).max() < 1e-4, n
        assert page.problems == []
        page.close()
