"""The browser: `--target web` folders, `codecport.mjs` in headless Chromium against the Python
runtime, the demo page, and `codec-run web` as a real server."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest
import soundfile as sf
from shared_exports import copy_folder
from web_support import (
    ARTIFACTS,
    DAC_WEB_LEN,
    DECODE,
    DECODE_FILE,
    LOAD_ENCODE,
    MIMI_WEB_LEN,
    ORT_WEB,
    ROUND_TRIP,
    Page,
    clip,
    distilled_web_folder,
    mount,
    same_fields,
    served,
    web_folder,
    webgpu_page,
)

import codecport
from codecport.export.check import check
from codecport.export.web import WEBGPU_OPS
from codecport.serve.web import ISOLATION

CODEC_RUN = [sys.executable, "-c", "from codecport.cli import run_cli; run_cli()"]
CODEC_EXPORT = [sys.executable, "-c", "from codecport.cli import export_cli; export_cli()"]
# Clip lengths per codec: one through the fixed graphs, one through the chunked / step graphs.
LENGTHS = {"dac": (DAC_WEB_LEN - 4, 2 * DAC_WEB_LEN + 301), "mimi": (MIMI_WEB_LEN - 100, MIMI_WEB_LEN + 1057)}

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def folders(dac_web, mimi_web):
    return {"dac": dac_web, "mimi": mimi_web}


# ---- the export -------------------------------------------------------------------------
@pytest.mark.parametrize("codec", ["dac", "mimi"])
def test_web_folder_is_what_the_module_reads(folders, codec):
    """No rvq.npz; every graph's manifest entry repeats its file's metadata, inputs and outputs;
    the codes are gathered as int32; the Python runtime runs the same folder."""
    folder = folders[codec]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert not (folder / "rvq.npz").exists()
    assert manifest["quantizer"] == "graph" and manifest["target"] == "web" and \
        manifest["precision"] == "fp32"
    assert set(manifest["graphs"]) == {n for n, f in manifest["files"].items() if f.endswith(".onnx")}
    for name, facts in manifest["graphs"].items():
        model = onnx.load(str(folder / facts["file"]))
        assert facts["metadata"] == {p.key: p.value for p in model.metadata_props}
        assert [v["name"] for v in facts["inputs"]] == [v.name for v in model.graph.input]
        assert [v["shape"] for v in facts["outputs"]] == [[d.dim_value for d in v.type.tensor_type.shape.dim]
                                                          for v in model.graph.output]
        dev = json.loads(facts["metadata"]["deviation"])  # the rewrite is measured, and exact
        assert dev.get("code_agreement_pct", 100.0) == 100.0 and dev.get("max_abs_err", 0.0) == 0.0
        inferred = onnx.shape_inference.infer_shapes(model)
        types = {v.name: v.type.tensor_type.elem_type
                 for v in [*inferred.graph.value_info, *inferred.graph.input]}
        consts = {i.name for i in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Gather":
                assert all(types.get(i) != onnx.TensorProto.INT64
                           for i in node.input[:2] if i not in consts), name
    c = codecport.load(folder)
    assert c.rvq is None and c.n_codebooks == int(manifest["n_codebooks"])


def test_web_target_refusals(tmp_path, tiny_export):
    r = subprocess.run([*CODEC_EXPORT, "snac", "--preset", "tiny", "--random-init", "--target", "web", "-o",
                        str(tmp_path / "s")], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "no browser runtime yet" in r.stderr and "Traceback" not in r.stderr
    # A numpy-quantizer folder cannot be served: the browser reads no rvq.npz.
    r = subprocess.run([*CODEC_RUN, "web", "-m", str(tiny_export), "--port", "0", "--ort-web", str(ORT_WEB)],
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 1 and "--target web" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = subprocess.run([*CODEC_RUN, "web", "-m", str(tmp_path / "none"), "--port", "0"], capture_output=True,
                       text=True, check=False, timeout=60)
    assert r.returncode == 1 and "no such model folder" in r.stderr


def test_web_target_refuses_missing_ort_web(tmp_path, dac_web):
    r = subprocess.run([*CODEC_RUN, "web", "-m", str(dac_web), "--port", "0", "--ort-web", str(tmp_path)],
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 1 and "npm install onnxruntime-web" in r.stderr


def test_check_gives_web_verdicts(folders):
    """wasm takes every graph whole; on WebGPU only int64 work (the codes) is left to the CPU, and
    in DAC's decoder, after the int32 rewrite, that is the one cast of its input."""
    for codec in ("dac", "mimi"):
        for r in check(folders[codec]):
            assert r["eps"]["wasm"]["full"], r["file"]
            gpu = r["eps"]["webgpu"]
            assert all("int64" in why for why in gpu["reasons"].values()), gpu
    decoder = next(r for r in check(folders["dac"]) if r["file"].endswith("/decoder.onnx"))
    gpu = decoder["eps"]["webgpu"]
    assert set(gpu["reasons"]) == {"Cast"} and gpu["nodes"] - gpu["supported"] == 1, gpu


def test_webgpu_table_is_the_installed_ort_web():
    """WEBGPU_OPS is onnxruntime-web's own JSEP kernel table, read from the installed dist."""
    text = (ORT_WEB / "ort.all.mjs").read_text()
    start = text.index("WEBGPU_OP_RESOLVE_RULES = ")
    table = text[start:text.index("]);", start)]
    assert set(re.findall(r'\["(\w+)",', table)) == WEBGPU_OPS


def test_the_browser_leaves_no_event_loop_running_on_this_thread(browser, dac_web):
    """Playwright's sync API marks its loop running on the thread that drives it, between its
    calls too: driven from the main thread, every later test of the worker found a loop running
    there, under which asyncio.run refuses to start."""
    with served(dac_web) as server:
        page = Page(browser, server.url)
        assert page.state == "ready", page.error()
        with pytest.raises(RuntimeError, match="no running event loop"):
            asyncio.get_running_loop()
        assert asyncio.run(asyncio.sleep(0, "ran")) == "ran"
        page.close()


# ---- codecport.mjs against the Python runtime ---------------------------------------------
# One WASM thread and two (the demo's default on two cores), each on one codec: the thread count
# is onnxruntime-web's, the same for every graph, and each page costs seconds of Chromium's CPU.
@pytest.mark.parametrize("codec,threads", [("dac", 1), ("mimi", 2)])
def test_browser_equals_python_on_wasm(browser, folders, codec, threads):
    """Codes equal the Python runtime's, fields included (original length and rate, DAC's
    loudness, the mode), and their decode equals Python's within 1e-4 (the length and loudness
    restored), on clips through the fixed graphs and through the chunked (DAC) or step (Mimi)
    graphs, on 1 and 2 WASM threads."""
    folder = folders[codec]
    py = codecport.load(folder)
    with served(folder) as server:
        page = Page(browser, f"{server.url}?threads={threads}")
        assert page.state == "ready", page.error()
        facts = page.page.inner_text("#facts")
        assert f"wasm, {threads} thread(s), cross-origin isolated: true" in facts
        # not the WebGPU build's, twice the size
        assert _wasm_fetched(page) == ["ort-wasm-simd-threaded.wasm"]
        for n in LENGTHS[codec]:
            x = clip(n, seed=n)
            want = py.encode(x, py.sample_rate)
            audio, _ = py.decode(want)
            got = page.run(ROUND_TRIP, x.tolist())
            codes = np.array(got["codes"]).reshape(got["shape"])
            np.testing.assert_array_equal(codes, want.data[0], err_msg=f"{codec} {n} samples")
            same_fields(want, got["fields"])
            b = np.array(got["audio"], np.float32)
            assert b.shape == audio[0].shape == (n,)
            assert np.abs(b - audio[0]).max() < 1e-4
        assert page.problems == []
        page.close()


@pytest.mark.parametrize("codec", ["dac", "mimi"])
def test_browser_decodes_the_codes_file_python_wrote(browser, folders, codec, tmp_path):
    """The `.npz` `codec-run encode` writes, read in the page with its fields: the same decode
    as the Python runtime's (original length, DAC's loudness). Codes of a clip at another rate
    come back at the model's rate, as long as the original is there."""
    folder = folders[codec]
    py = codecport.load(folder)
    x = clip(LENGTHS[codec][1], seed=21)
    codes = py.encode(x, py.sample_rate)
    codes.save(tmp_path / "c.npz")
    other = py.encode(clip(3 * py.sample_rate // 10, seed=22), 22050)
    other.save(tmp_path / "o.npz")
    with served(folder) as server:
        page = Page(browser, server.url)
        got = page.run(DECODE_FILE, list((tmp_path / "c.npz").read_bytes()))
        moved = page.run(DECODE_FILE, list((tmp_path / "o.npz").read_bytes()))
        assert page.problems == []
        page.close()
    same_fields(codes, got["fields"])
    want, _ = py.decode(codecport.load_codes(tmp_path / "c.npz"))
    audio = np.array(got["audio"], np.float32)
    assert audio.shape == want[0].shape == (len(x),) and np.abs(audio - want[0]).max() < 1e-4
    same_fields(other, moved["fields"])
    assert len(moved["audio"]) == round(other.num_samples * py.sample_rate / 22050)


def _wasm_fetched(page: Page) -> list[str]:
    """The onnxruntime-web .wasm files the page fetched."""
    names = page.run("performance.getEntriesByType('resource').map((e) => e.name)")
    return sorted({n.rsplit("/", 1)[1] for n in names if n.endswith(".wasm")})


# The codec the page's own codecport.mjs runs next (its kernels already compiled stay compiled).
USE = """async (url) => {
  window.demo.codec = await window.demo.load(url, {ort: window.demo.ort, executionProviders: ["webgpu"]});
}"""


ENCODE = """async (x) => {
  const codes = await window.demo.codec.encode(Float32Array.from(x));
  return {codes: Array.from(codes.data), shape: codes.shape};
}"""


def test_browser_on_webgpu(browser, folders, tmp_path_factory):
    """On WebGPU (SwiftShader here), every codec in one page: a second WebGPU page in the same
    Chromium ran NeuCodec's graphs about 20 s slower than a first one. DAC, Mimi and NeuCodec
    (XCodec2's graphs are NeuCodec's ops): the Python codes decode within 1e-3, and the browser's
    own codes agree with Python's. Then the distilled encoder (`--preset tiny-distill`): its codes
    of a clip, its local attention over several of its windows in one graph call, agree with the
    Python runtime's. Skipped, saying so, where no adapter appears."""
    folders = {**folders, "neucodec": web_folder(tmp_path_factory, "neucodec")}
    distilled = distilled_web_folder(tmp_path_factory)
    # DAC's and Mimi's clips through their fixed graphs, NeuCodec's through its main graphs (past
    # its bucket's). NeuCodec's clip is only encoded, its decoder having run in DECODE; DAC's and
    # Mimi's round trips decode too, with the codes' fields (the length, DAC's loudness).
    runs = {"dac": (LENGTHS["dac"][0], ROUND_TRIP), "mimi": (LENGTHS["mimi"][0], ROUND_TRIP),
            "neucodec": (7900, ENCODE)}
    with served(folders["dac"]) as server:
        page = webgpu_page(browser, server.url)
        assert _wasm_fetched(page) == ["ort-wasm-simd-threaded.jsep.wasm"]
        for codec, (n, encode) in runs.items():
            if codec == "neucodec":
                # DAC's and Mimi's sessions warn, rightly, that their int64 work runs on the CPU
                # (test_check_gives_web_verdicts); NeuCodec's and the distilled graphs are WebGPU's
                # whole, so their sessions and calls are to raise nothing.
                assert all("VerifyEachNodeIsAssignedToAnEp" in p for p in page.problems), page.problems
                page.problems.clear()
            if codec != "dac":
                page.run(USE, mount(page, codec, folders[codec]))
            py = codecport.load(folders[codec])
            x = clip(n, seed=3)
            want = py.encode(x, py.input_rate).data[0]
            bare = py.decode(want)[0][0]
            got = np.array(page.run(DECODE, [want.ravel().tolist(), list(want.shape)]), np.float32)
            assert got.shape == bare.shape and np.abs(got - bare).max() < 1e-3, codec
            trip = page.run(encode, x.tolist())
            # SwiftShader's Sin is good to ~2e-4, and FSQ rounds what a GPU's float order moves:
            # either flips near-ties of a random tiny codebook, so not every code agrees.
            agree = (np.array(trip["codes"]).reshape(trip["shape"]) == want).mean()
            assert agree > 0.9, (codec, agree)

        x = clip(3000, seed=5)  # one graph call of the distilled encoder
        want = codecport.load(distilled).encode(x, 16000).data[0]
        got = page.run(LOAD_ENCODE, [mount(page, "distilled", distilled), x.tolist()])
        assert got["shape"] == list(want.shape)
        agree = (np.array(got["codes"]).reshape(got["shape"]) == want).mean()
        assert agree > 0.9, agree
        assert page.problems == []
        page.close()


STREAM = """async ([x, sizes]) => {
  const c = window.demo.codec, e = c.encoderStream(), d = c.decoderStream();
  const parts = [], audio = [];
  let at = 0, i = 0;
  while (at < x.length) {  // pieces of uneven sizes, as a microphone delivers them
    const n = sizes[i++ % sizes.length];
    const codes = await e.push(Float32Array.from(x.slice(at, at + n)));
    at += n;
    parts.push(codes);
    for (let f = 0; f < codes.shape[1]; f++) {  // decoded frame by frame
      const one = {data: Int32Array.from({length: codes.shape[0]},
                                         (_, k) => codes.data[k * codes.shape[1] + f]),
                   shape: [codes.shape[0], 1]};
      audio.push(...await d.push(one));
    }
  }
  const tail = await e.flush();
  parts.push(tail);
  audio.push(...await d.push(tail), ...await d.flush());
  const k = c.nCodebooks, t = parts.reduce((n, p) => n + p.shape[1], 0), codes = [];
  for (let q = 0; q < k; q++)
    for (const p of parts) codes.push(...p.data.slice(q * p.shape[1], (q + 1) * p.shape[1]));
  e.reset();
  const again = await e.push(Float32Array.from(x.slice(0, 2 * e.stepSamples)));
  const whole = await c.encode(Float32Array.from(x));
  return {codes, shape: [k, t], audio, whole: Array.from(whole.data), again: Array.from(again.data),
          wholeAudio: Array.from(await c.decode(whole)), latency: e.latency.frames};
}"""


def test_mimi_stream_in_the_browser_equals_the_whole_clip(browser, mimi_web):
    """The encoder stream on uneven pieces and the decoder stream frame by frame give the whole
    clip's codes and audio, as the Python streams do; reset() starts over."""
    py = codecport.load(mimi_web)
    x = clip(MIMI_WEB_LEN - 200, seed=11)
    with served(mimi_web) as server:
        page = Page(browser, server.url)
        got = page.run(STREAM, [x.tolist(), [37, 100, 5, 301]])
        page.close()
    codes = np.array(got["codes"]).reshape(got["shape"])
    whole = np.array(got["whole"]).reshape(got["shape"])
    np.testing.assert_array_equal(codes, whole)
    np.testing.assert_array_equal(codes, py.encode(x, py.sample_rate).data[0])
    np.testing.assert_array_equal(np.array(got["again"]).reshape(got["shape"][0], -1), codes[:, :2 * 2])
    audio, whole_audio = np.array(got["audio"], np.float32), np.array(got["wholeAudio"], np.float32)
    # The stream gives every frame's samples; the whole decode the clip's own length.
    assert len(whole_audio) == len(x) and np.abs(audio[:len(x)] - whole_audio).max() < 1e-5
    stream = py.decoder_stream()
    ref = np.concatenate([stream.push(codes), stream.flush()])
    assert np.abs(audio - ref).max() < 1e-4 and got["latency"] == stream.latency.frames


# ---- the demo page -----------------------------------------------------------------------
def test_demo_page_encodes_a_dropped_wav(browser, dac_web, tmp_path):
    """Choose a WAV (stereo, another rate): the page encodes, decodes and offers it; the
    screenshot after the decode is kept as a test artifact."""
    wav = tmp_path / "in.wav"
    x = clip(22050, seed=5)
    sf.write(wav, np.stack([x, 0.5 * x], axis=1), 22050)
    with served(dac_web) as server:
        page = Page(browser, server.url)
        page.page.set_input_files("#file", str(wav))
        page.page.wait_for_function("['decoded', 'error'].includes(document.body.dataset.state)")
        assert page.state == "decoded", page.error()
        timings = page.page.inner_text("#timings")
        assert "in.wav: 1.00 s, 2 channel(s) -> mono 16000 Hz" in timings and "RTF" in timings
        n = page.run("window.demo.audio.length")
        assert abs(n - 16000) <= 2 * 6 * 10  # every frame's samples, as the Python decode of bare codes
        assert page.run("document.getElementById('download').href").startswith("blob:")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "web-demo-dac.png"
        page.page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        assert page.problems == []
        page.close()


def test_live_microphone_loop_on_the_fake_device(browser, mimi_web):
    """The live loop runs on Chromium's fake capture device: frames go through encode and
    decode, the per-frame times are shown, and stopping it leaves the page ready."""
    with served(mimi_web) as server:
        page = Page(browser, server.url)
        page.page.click("#live")
        page.page.wait_for_function("window.demo.live && window.demo.live.stats && "
                                    "window.demo.live.stats.frames >= 50")
        stats = page.run("window.demo.live.stats")
        assert stats["p95"] > 0 and stats["frameMs"] == 1.0  # the tiny Mimi's 24-sample frames
        assert "live:" in page.page.inner_text("#live-stats")
        page.page.click("#live")
        page.page.wait_for_function("document.body.dataset.state === 'ready'")
        assert page.problems == []
        page.close()


def test_page_reports_errors_in_the_dom(browser, dac_web, mimi_web, tmp_path):
    """A wrong folder URL, a folder that is not a web export, a missing graph file, a graph of
    another export: each is a one-line error in the page, not a silent failure."""
    with served(dac_web) as server:
        page = Page(browser, f"{server.url}?model=/nope/")
        assert page.state == "error" and "manifest.json: HTTP 404" in page.error()
        page.close()
        page = Page(browser, f"{server.url}?model=/ort/")  # a folder with no manifest
        assert page.state == "error" and "HTTP 404" in page.error()
        page.close()
    broken = copy_folder(dac_web, tmp_path / "broken")
    with served(broken) as server:
        (broken / "encoder.onnx").unlink()  # after the server checked it: a folder copied half
        page = Page(browser, server.url)
        assert page.state == "error" and "encoder.onnx: HTTP 404; the folder is incomplete" in page.error()
        page.close()
        shutil.copy(mimi_web / "encoder.onnx", broken / "encoder.onnx")  # same names, other shapes
        page = Page(browser, server.url)
        assert page.state == "error" and "encoder.onnx does not match its manifest entry (audio is float32 " \
            f"[1,1,{MIMI_WEB_LEN}], the manifest says float32 [1,1,{DAC_WEB_LEN}])" in page.error()
        page.close()
        manifest = json.loads((broken / "manifest.json").read_text())
        manifest["quantizer"] = "numpy"
        (broken / "manifest.json").write_text(json.dumps(manifest))
        page = Page(browser, server.url)
        assert page.state == "error" and "re-export it with codec-export dac --target web" in page.error()
        page.close()


BAD_INPUT = """async () => {
  const c = window.demo.codec, k = c.nCodebooks;
  const tries = {
    nan: () => c.encode(Float32Array.from([0, NaN, 0])),
    loud: () => c.encode(Float32Array.from([0, 1e20, 0])),
    empty: () => c.encode(new Float32Array(0)),
    notFloat: () => c.encode([0.1, 0.2]),
    range: () => c.decode({data: Int32Array.from({length: k * 200}, () => c.codebookSize), shape: [k, 200]}),
    shape: () => c.decode({data: new Int32Array(10), shape: [k, 200]}),
    codebooks: () => c.decode({data: new Int32Array(200), shape: [1, 200]}),
    frames: () => c.decode({data: new Int32Array(k * 7), shape: [k, 7]}),
    stream: () => c.encoderStream(),
  };
  const out = {};
  for (const [name, f] of Object.entries(tries)) {
    try { await f(); out[name] = "no error"; } catch (e) { out[name] = `${e.name}: ${e.message}`; }
  }
  return out;
}"""


def test_module_refuses_bad_input(browser, dac_web):
    with served(dac_web) as server:
        page = Page(browser, server.url)
        out = page.run(BAD_INPUT)
        page.close()
    assert all(v.startswith("CodecportError: ") for v in out.values()), out
    assert "NaN" in out["nan"] and "scale it to [-1, 1]" in out["loud"] and "empty" in out["empty"] and \
        "Float32Array" in out["notFloat"]
    assert "[0, 64)" in out["range"] and "exactly 4 codebooks" in out["codebooks"]
    assert "7 frames are not whole chunks of this model's" in out["frames"]
    assert "dac has no encoder stream: it has no step graphs" in out["stream"]


# ---- codec-run web -----------------------------------------------------------------------
def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_codec_run_web_serves_isolated_and_stops(mimi_web):
    """`codec-run web` as a user runs it: it prints its URL, serves the four routes with
    COOP/COEP, nothing outside them, survives a client that drops mid-request, and stops on
    Ctrl-C."""
    import socket

    proc = subprocess.Popen([*CODEC_RUN, "web", "-m", str(mimi_web), "--port", "0",
                             "--ort-web", str(ORT_WEB)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        url = re.search(r"open (http://127\.0\.0\.1:\d+/)", lines[1]).group(1)
        status, headers, body = _get(url)
        assert status == 200 and b"codecport.mjs" in body
        for k, v in ISOLATION.items():
            assert headers[k] == v
        assert _get(url + "codecport.mjs")[1]["Content-Type"] == "text/javascript"
        assert _get(url + "ort/ort-wasm-simd-threaded.jsep.wasm")[1]["Content-Type"] == "application/wasm"
        assert json.loads(_get(url + "model/manifest.json")[2])["codec"] == "mimi"
        for bad in ("model/../manifest.json", "model/%2e%2e/pyproject.toml", "model/", "ort/../package.json",
                    "etc/passwd", "model/.hidden"):
            assert _get(url + bad)[0] == 404, bad
        host, port = url[7:-1].split(":")
        with socket.create_connection((host, int(port))) as s:  # a client that goes away
            s.sendall(b"GET /model/encoder.onnx HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _get(url + "model/manifest.json")[0] == 200
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in out and "Traceback" not in err


def test_module_names_no_codec_and_has_the_package_version(dac_web, tmp_path, browser):
    """codecport.mjs follows the manifest's plans, so no codec is named in it; a folder exported
    without plans is refused in one line; its version is the package's, and so is its npm
    package.json's."""
    from codecport import registry
    from codecport.serve.web import web_asset

    for module in web_asset("codecport.mjs").parent.glob("*.mjs"):
        for name in registry.names():
            assert f'"{name}"' not in module.read_text(), f"{module.name} names {name}"
    src = web_asset("codecport.mjs").read_text()
    assert re.search(r'export const VERSION = "([^"]+)"', src).group(1) == codecport.__version__
    assert json.loads(web_asset("package.json").read_text())["version"] == codecport.__version__
    old = copy_folder(dac_web, tmp_path / "old")
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["plans"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    with served(old) as server:
        page = Page(browser, server.url)
        assert page.state == "error" and "without the plans codecport.mjs" in page.error()
        page.close()


def test_int8_is_refused_on_webgpu(browser, tmp_path, tiny_mimi):
    """int8 folders gave wrong audio on onnxruntime-web's WebGPU: load() says so instead."""
    from codecport.codecs.mimi.export import export_mimi
    from codecport.export.builds import Build

    out = tmp_path / "int8"
    export_mimi(tiny_mimi, out, None, 1, preset="tiny", weights="random-init seed 0", weights_sha256="none",
                in_graph_codebooks=tiny_mimi.cfg.n_codebooks, build=Build("web", "int8"))
    with served(out) as server:
        page = Page(browser, f"{server.url}?ep=webgpu")
        assert page.state == "error" and \
            "int8 export, which onnxruntime-web's WebGPU runs wrongly" in page.error()
        page.close()
        page = Page(browser, server.url)  # the same folder on wasm runs
        assert page.state == "ready", page.error()
        page.close()


@pytest.mark.bench
def test_codec_bench_web_reports_both_runtimes(tmp_path):
    """`codec-bench web` on the tiny Mimi: the native and the in-page contenders both timed, in
    one report, with the live loop's percentiles and the folder's deviation."""
    out = tmp_path / "web.json"
    r = subprocess.run([sys.executable, "-c", "from codecport.bench.cli import main; main()", "web",
                        "--codec", "mimi", "--preset", "tiny", "--seconds", "0.1", "--precision", "fp32",
                        "--threads", "1", "--runs", "2", "--rounds", "2", "--steps", "5",
                        "--ort-web", str(ORT_WEB), "--dir", str(tmp_path / "work"), "--json", str(out)],
                       capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    entry = report["codecs"]["mimi"]["fp32"]
    assert set(entry["contenders"]) == {"native 1 thread", "wasm 1 thread"}
    for c in entry["contenders"].values():
        assert len(c["decode"]["seconds"]) == 4 and c["decode"]["rtf_median"] > 0
        assert c["stream"]["steps"] == 10 and c["stream"]["both"]["p95_ms"] > 0
    assert entry["deviation"]["encoder"]["code_agreement_pct"] == 100.0
    assert "wasm 1 thread" in r.stdout and "time vs native" in r.stdout and "live encode+decode" in r.stdout
    # --decode-only (the same folder, kept in --dir): the page opens no encoder and decodes the native codes.
    r = subprocess.run([*r.args[:r.args.index("--runs")], "--runs", "1", "--rounds", "1", "--decode-only",
                        "--ort-web", str(ORT_WEB), "--dir", str(tmp_path / "work"), "--json", str(out)],
                       capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    entry = json.loads(out.read_text())["codecs"]["mimi"]["fp32"]
    for c in entry["contenders"].values():
        assert set(c) == {"decode"} and len(c["decode"]["seconds"]) == 1
    assert "decode RTF" in r.stdout and "encode RTF" not in r.stdout


def _get_as(url: str, host: str):
    req = urllib.request.Request(url, headers={"Host": host})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_codec_run_web_answers_its_own_host_serves_no_link_out_and_streams(dac_web, tmp_path):
    """A page of another site reaching 127.0.0.1 through its own name (DNS rebinding) is refused
    by its Host header; a link inside the model folder to a file outside it is not followed; a
    file far larger than the server's memory grows by is served whole, read a block at a time."""
    folder = copy_folder(dac_web, tmp_path / "model")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the web")
    (folder / "leak.txt").symlink_to(secret)
    big = folder / "big.bin"
    with open(big, "wb") as f:  # sparse: 400 MB of zeros that take no disk
        f.truncate(400 << 20)
    proc = subprocess.Popen([*CODEC_RUN, "web", "-m", str(folder), "--port", "0", "--ort-web", str(ORT_WEB)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"open (http://127\.0\.0\.1:(\d+)/)",
                        [proc.stdout.readline(), proc.stdout.readline()][1])
        base, port = url.group(1), url.group(2)
        assert _get_as(base + "model/manifest.json", f"127.0.0.1:{port}")[0] == 200
        assert _get_as(base + "model/manifest.json", f"localhost:{port}")[0] == 200
        status, body = _get_as(base + "model/manifest.json", f"attacker.example:{port}")
        assert status == 421 and b"127.0.0.1 and localhost only" in body
        assert _get(base + "model/leak.txt")[0] == 404
        # past the file system's name bound: no reply before
        assert _get(base + "model/" + "a" * 300)[0] == 404
        status, headers, body = _get(base + "model/big.bin")
        assert status == 200 and len(body) == 400 << 20 and int(headers["Content-Length"]) == 400 << 20
        del body
        status_lines = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        peak_kb = int(next(line for line in status_lines if line.startswith("VmHWM:")).split()[1])
        assert peak_kb < 300 << 10, f"the server held {peak_kb >> 10} MB serving a 400 MB file"
    finally:
        proc.send_signal(signal.SIGTERM)  # as a process manager stops it
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in out
