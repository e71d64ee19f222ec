"""NeuCodec and XCodec2 in the browser: `--target web` folders whose graphs hold w2v-BERT's fbank
features and the FSQ (codecs/neucodec/ingraph.py), and codecport.mjs's masked and windowed plans
(codecport-windows.mjs), against the Python runtime on the same folder and on the numpy-quantizer
smoke export of the same weights. Their WebGPU run is test_web.py's, in the one page that runs
every codec on WebGPU (a second WebGPU page in one Chromium cost some 20 s more on SwiftShader)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from web_support import BUCKETS, DECODE, ROUND_TRIP, Page, clip, same_fields, served, web_folder

import codecport
from codecport.export.check import check

pytestmark = pytest.mark.browser

# A clip through the bucket's graphs (NeuCodec's; XCodec2's masked main graphs), one through the
# main graphs, two through windows (the last an odd length: 10000.5 samples at the tiny
# NeuCodec's 8 kHz, which Python rounds to even).
LENGTHS = (3000, 7900, 8320, 20001)


@pytest.fixture(scope="module", params=["neucodec", "xcodec2"])
def web(request, tmp_path_factory):
    return request.param, web_folder(tmp_path_factory, request.param)


def test_folder_runs_whole_everywhere_and_as_the_numpy_folder(web, smoke_exports):
    """The plans state the masked graphs (shortest first) and the windows; no graph has an op a
    browser lacks (WebGPU has no Round, Mod or int64; nobody has an ISTFT); WebGPU takes every
    node in one partition. The Python runtime gives, on the same folder, the numpy-quantizer
    folder's codes and audio."""
    name, folder = web
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["quantizer"] == "graph" and manifest["input_rate"] == "16000"
    plans = manifest["plans"]
    bucket = [("encoder_f13", "fixed", "masked")] if BUCKETS[name] else []
    assert [(p["graph"], p["mode"], p.get("fits")) for p in plans["encode"]] == \
        [*bucket, ("encoder", "fixed", "masked"), ("encoder", "windowed", None)]
    assert plans["decode"][-1]["overlap"] == 6 and plans["encode"][0]["clip_frames"] == \
        [320, 0 if name == "neucodec" else 320]
    for facts in manifest["graphs"].values():
        model = onnx.load(str(folder / facts["file"]))
        ops = {n.op_type for n in model.graph.node}
        assert not ops & {"Round", "Mod", "DFT", "STFT", "ConvTranspose", "Gather"}, (facts["file"], ops)
    for r in check(folder):
        assert r["eps"]["wasm"]["full"], r["file"]
        gpu = r["eps"]["webgpu"]
        assert gpu["supported"] == gpu["nodes"] and gpu["partitions"] == 1 and not gpu["reasons"], \
            (r["file"], gpu)
    ours, numpy_folder = codecport.load(folder), codecport.load(smoke_exports[name])
    for n in LENGTHS[::3]:  # the bucket's graphs and the windows
        x = clip(n, seed=n)
        want = numpy_folder.encode(x, 16000)
        got = ours.encode(x, 16000)
        assert got.mode == want.mode
        np.testing.assert_array_equal(got.data, want.data)
        a, b = ours.decode(want.data)[0], numpy_folder.decode(want.data)[0]
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-5


DECODE_STREAM = """async ([data, sizes]) => {
  const c = window.demo.codec, d = c.decoderStream(), out = [];
  let at = 0, i = 0;
  while (at < data.length) {  // pieces of uneven sizes, as an LLM emits them
    const part = Int32Array.from(data.slice(at, at + sizes[i++ % sizes.length]));
    at += part.length;
    out.push(...await d.push({data: part, shape: [1, part.length]}));
  }
  out.push(...await d.flush());
  let refused = null;
  try { c.encoderStream(); } catch (e) { refused = e.message; }
  return {audio: out, latency: d.latency.frames, stepFrames: d.stepFrames, streams: c.streams, refused};
}"""


def test_browser_equals_python_on_wasm(browser, web):
    """Codes equal the Python runtime's, fields included, through the bucket, the main graphs and
    the windows; the audio of bare codes within 1e-4 of Python's; the decoder stream, fed uneven
    pieces, gives that audio too; the original length comes back at the output rate."""
    _, folder = web
    py = codecport.load(folder)
    with served(folder) as server:
        page = Page(browser, server.url)
        assert page.state == "ready", page.error()
        assert py.input_rate == 16000 != py.sample_rate  # the page says both rates
        assert "16000 Hz in" in page.page.inner_text("#facts")
        for n in LENGTHS:
            x = clip(n, seed=n)
            want = py.encode(x, 16000)
            got = page.run(ROUND_TRIP, x.tolist())
            np.testing.assert_array_equal(np.array(got["codes"]).reshape(got["shape"]), want.data[0],
                                          err_msg=f"{n}")
            same_fields(want, got["fields"])
            assert len(got["audio"]) == round(n * py.sample_rate / 16000)  # Python's rounding, halves to even
            bare = py.decode(want.data[0])[0][0]
            audio = np.array(page.run(DECODE, [want.data[0].ravel().tolist(), list(want.data[0].shape)]),
                             np.float32)
            assert audio.shape == bare.shape and np.abs(audio - bare).max() < 1e-4, n
        stream = py.decoder_stream()
        got = page.run(DECODE_STREAM, [want.data[0].ravel().tolist(), [1, 3, 7, 2]])
        assert page.problems == []
        page.close()
    assert np.abs(np.array(got["audio"], np.float32) - bare).max() < 1e-4
    assert got["latency"] == stream.latency.frames and got["stepFrames"] == stream.step_frames
    assert got["streams"] == ["decoder"] and "no encoder stream" in got["refused"]


SIDES = """async ([url, sides]) => {
  const out = {};
  try {
    const c = await window.demo.load(url, {ort: window.demo.ort, sides});
    Object.assign(out, {present: c.present, streams: c.streams});
    out.audio = (await c.decode({data: Int32Array.from([1, 2]), shape: [1, 2]})).length;
    try { await c.encode(new Float32Array(4000)); } catch (e) { out.encode = e.message; }
  } catch (e) { out.error = e.message; }
  return out;
}"""


def test_browser_refuses_a_clip_under_a_frame_and_bad_codes(browser, web):
    name, folder = web
    with served(folder) as server:
        page = Page(browser, server.url)
        short = page.run("async () => { try { await window.demo.codec.encode(new Float32Array(100)); } "
                         "catch (e) { return e.message; } }")
        bad = page.run("async () => { try { await window.demo.codec.decode({data: Int32Array.from([70000]), "
                       "shape: [1, 1]}); } catch (e) { return e.message; } }")
        decode_only = page.run(SIDES, [server.url + "model/", ["decode"]])
        wrong_side = page.run(SIDES, [server.url + "model/", ["listen"]])
        page.close()
    # A page that decodes only opens no encoder (one whose encoder is past what wasm32 loads).
    assert decode_only["present"] == ["decoder_f13"] * bool(BUCKETS[name]) + ["decoder"] and \
        decode_only["audio"] == 2 * codecport.load(folder).frame_size
    assert decode_only["streams"] == ["decoder"] and 'with "encode" among them' in decode_only["encode"]
    assert "takes [\"encode\"], [\"decode\"] or both" in wrong_side["error"]
    if name == "neucodec":  # XCodec2's official pad makes a frame of any clip
        assert "under one frame" in short, short
    else:
        assert short is None
    assert "codes must be integers in [0, 64)" in bad, bad

