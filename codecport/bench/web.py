"""`codec-bench web`: codecport.mjs in headless Chromium (onnxruntime-web's wasm, 1 and 2
threads) beside the native CPU EP on the same web folders, in one run.

The contenders take turns round by round (a slow spell of the machine lands on all of them),
and every call is timed where it runs: `performance.now()` in the page, `perf_counter` here.
Per codec (its bench facts' `web_preset` and `web_codebooks`) and precision:
- encode and decode of one fixed-length call (the real-time factor: compute s per audio s);
- codecs that stream both ways (Mimi): the live loop, encoder then decoder push of each step, p50/p95.
Weights are random (timings do not depend on them); WebGPU is left out: on SwiftShader (the
only adapter here) its timings mean nothing.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import click
import numpy as np

from .. import registry
from ..errors import CodecportError
from ..export.targets import TARGETS
from ..frontend import Finite, guard, unwinds_on_sigterm
from .facts import facts_of
from .measure import WARMUP_STEPS, clip, percentiles, run_report, summary

PAGE_RUN = """async ([what, runs, steps]) => {
  const c = window.demo.codec, x = window.benchClip, out = {};
  const time = async (f) => {
    const t0 = performance.now(); const r = await f(); return [performance.now() - t0, r];
  };
  if (what.includes("decode")) {  // the native runtime's codes where the page does not encode
    let codes = window.benchCodes ?? (await time(() => c.encode(x)))[1];  // warm-up: opens the sessions
    await c.decode(codes);
    out.decode = [];
    if (what.includes("encode")) out.encode = [];
    for (let i = 0; i < runs; i++) {
      if (what.includes("encode")) {
        let [ms, r] = await time(() => c.encode(x));
        out.encode.push(ms / 1000); codes = r;
      }
      out.decode.push((await time(() => c.decode(codes)))[0] / 1000);
    }
  }
  if (what.includes("stream")) {
    const e = c.encoderStream(), d = c.decoderStream(), n = e.stepFrames * c.frameSize,
      both = [], enc = [], dec = [];
    for (let i = 0; i < steps + WARMUP; i++) {
      const pcm = x.subarray((i * n) % (x.length - n), (i * n) % (x.length - n) + n);
      const [me, codes] = await time(() => e.push(pcm));
      const [md] = await time(() => d.push(codes));
      if (i >= WARMUP) { enc.push(me / 1000); dec.push(md / 1000); both.push((me + md) / 1000); }
    }
    out.stream = {encode_step: enc, decode_step: dec, both, frames_per_step: e.stepFrames};
  }
  return out;
}""".replace("WARMUP", str(WARMUP_STEPS))


def _folders(spec, work: Path, seconds: float, precisions: tuple[str, ...], frames: int,
             preset: str | None = None) -> dict[str, Path]:
    """precision -> web folder of `spec`'s bench preset (random weights), built once and reused
    while the export code and the settings are the same."""
    from ..export.builds import Build, build_of_folder
    from .prepare import export_options, export_source_hash, stamped

    facts, models = facts_of(spec), spec.module("model")
    preset = preset or facts.web_preset
    if preset not in spec.presets:
        raise CodecportError(f"{spec.name} has no preset {preset!r}; choose one of {', '.join(spec.presets)}")
    cfg = spec.presets[preset]
    codebooks = min(facts.web_codebooks or cfg.n_codebooks, cfg.n_codebooks)
    samples = facts.clip_samples(cfg, seconds)
    frames = frames if spec.has_step_graphs else 1
    key = {"preset": preset, "samples": samples, "codebooks": codebooks, "frames": frames,
           "source": export_source_hash()}
    base = work / "base"

    def make() -> None:
        click.echo(f"exporting {spec.name} {preset} for {seconds:g} s (random weights, quantizer in the "
                   "graphs) ...")
        model = models.init_random(models.MODEL(cfg), 0).eval()
        spec.module("export").export(model, base, samples, options=export_options(spec, frames),
                                     preset=preset, weights="random-init seed 0", weights_sha256="none",
                                     in_graph_codebooks=codebooks)

    stamped(work, key, make, builds="web-*")
    out = {}
    for p in precisions:
        folder = work / f"web-{p}"
        if not (folder / "manifest.json").is_file():
            click.echo(f"building {spec.name}'s web {p} folder (deviation measured) ...")
            build_of_folder(spec, base, folder, Build("web", p))
        out[p] = folder
    return out


class Native:
    """The Python runtime on the CPU EP with `threads` intra-op threads."""

    def __init__(self, folder: Path, threads: int):
        from ..registry import codec_of_folder

        self.codec = codec_of_folder(folder).runtime(folder, options={"threads": str(threads)})

    def run(self, x: np.ndarray, what: tuple[str, ...], runs: int, steps: int) -> dict:
        c, out = self.codec, {}
        if "decode" in what:
            codes = c.encode(x, c.input_rate)
            c.decode(codes.data)
            out["decode"] = []
            if "encode" in what:
                out["encode"] = []
            for _ in range(runs):
                if "encode" in what:
                    t0 = time.perf_counter()
                    codes = c.encode(x, c.input_rate)
                    out["encode"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                c.decode(codes.data)
                out["decode"].append(time.perf_counter() - t0)
        if "stream" in what:
            e, d = c.encoder_stream(), c.decoder_stream()
            n, enc, dec = e.step_frames * c.frame_size, [], []
            for i in range(steps + WARMUP_STEPS):
                at = (i * n) % (len(x) - n)
                t0 = time.perf_counter()
                codes = e.push(x[at:at + n])
                t1 = time.perf_counter()
                d.push(codes)
                if i >= WARMUP_STEPS:
                    enc.append(t1 - t0)
                    dec.append(time.perf_counter() - t1)
            out["stream"] = {"encode_step": enc, "decode_step": dec,
                             "both": [a + b for a, b in zip(enc, dec)],
                             "frames_per_step": e.step_frames}
        return out


class InPage:
    """codecport.mjs on onnxruntime-web's wasm with `threads` threads, in one page kept open."""

    def __init__(self, browser, url: str, x: np.ndarray, threads: int, codes: np.ndarray | None = None):
        self.page = browser.new_page()
        self.page.set_default_timeout(600_000)
        # Given codes, the page opens no encoder (`sides: ["decode"]`) and decodes these.
        self.page.goto(f"{url}?threads={threads}" + ("" if codes is None else "&sides=decode"))
        self.page.wait_for_function("document.body.dataset.state !== 'loading'")
        if self.page.evaluate("document.body.dataset.state") != "ready":
            raise CodecportError(f"the page did not load the model: {self.page.inner_text('#error')}")
        self.page.evaluate("(x) => { window.benchClip = Float32Array.from(x); }", x.tolist())
        if codes is not None:
            self.page.evaluate("([d, s]) => { window.benchCodes = {data: Int32Array.from(d), shape: s}; }",
                               [codes.ravel().tolist(), list(codes.shape)])

    def run(self, x, what, runs, steps) -> dict:
        return self.page.evaluate(PAGE_RUN, [list(what), runs, steps])


def _pooled(results: list[dict], audio_s: float, frame_ms: float) -> dict:
    out = {}
    for d in ("encode", "decode"):
        if d in results[0]:
            out[d] = summary([s for r in results for s in r[d]], audio_s)
    if "stream" in results[0]:
        st = {"frame_ms": frame_ms, "frames_per_step": results[0]["stream"]["frames_per_step"],
              "steps": sum(len(r["stream"]["both"]) for r in results)}
        for d in ("encode_step", "decode_step", "both"):
            st[d] = percentiles([s for r in results for s in r["stream"][d]])
        out["stream"] = st
    return out


def bench_web(codecs: list[str], seconds: float, precisions: tuple[str, ...], threads: tuple[int, ...],
              runs: int, rounds: int, steps: int, work: Path, ort_web: Path | None, frames: int = 1,
              preset: str | None = None, decode_only: bool = False) -> dict:
    import onnxruntime

    from ..serve.web import WebServer, find_ort_web
    from .browser import CHROMIUM, CHROMIUM_ARGS

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise CodecportError("codec-bench web drives Chromium with playwright: pip install "
                             "'codecport[bench]'") from None

    machine = {"cpus": os.cpu_count(), "platform": platform.platform(),
               "onnxruntime": onnxruntime.__version__}
    report = {"seconds": seconds, "runs": runs, "rounds": rounds, "steps": steps, "threads": list(threads),
              "frames": frames, "decode_only": decode_only,
              "machine": machine, "codecs": {}}
    if not Path(CHROMIUM).is_file():
        raise CodecportError(f"{CHROMIUM} is missing: apt-get install chromium (scripts/setup_web.sh does), "
                             "or set CODECPORT_CHROMIUM")
    ort_dir = find_ort_web(ort_web)
    machine["onnxruntime_web"] = json.loads((ort_dir.parent / "package.json").read_text()).get("version") \
        if (ort_dir.parent / "package.json").is_file() else None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        machine["chromium"] = browser.version
        try:
            for name in codecs:
                spec = registry.get(name)
                folders = _folders(spec, work / name, seconds, precisions, frames, preset)
                for precision, folder in folders.items():
                    manifest = json.loads((folder / "manifest.json").read_text())
                    # The clip the fixed graphs take, at the rate the encoder takes (NeuCodec's 16 kHz).
                    geo, rate = manifest["geometry"], int(manifest["sample_rate"])
                    samples = geo.get("input_samples", geo["samples"])
                    in_rate = int(manifest.get("input_rate", rate))
                    x = clip(samples)[0]
                    duplex = {"encoder", "decoder"} <= set(spec.runtime.streams)
                    what = (("decode",) if decode_only
                            else ("encode", "decode", *(("stream",) if duplex else ())))
                    frame_ms = 1000 * int(manifest["frame_size"]) / rate
                    server = WebServer(folder, ort_dir, 0).start()
                    try:
                        contenders = {}
                        for t in threads:
                            contenders[f"native {t} thread{'s' if t > 1 else ''}"] = Native(folder, t)
                        codes = (next(iter(contenders.values())).codec.encode(x, in_rate).data[0]
                                 if decode_only else None)
                        for t in threads:
                            click.echo(f"loading {name} {precision} in the page, wasm {t} thread(s) ...")
                            contenders[f"wasm {t} thread{'s' if t > 1 else ''}"] = InPage(
                                browser, server.url, x, t, codes)
                        results: dict[str, list[dict]] = {c: [] for c in contenders}
                        for r in range(rounds):
                            for label, c in contenders.items():
                                click.echo(f"  {name} {precision} {label} (round {r + 1} of {rounds}) ...")
                                results[label].append(c.run(x, what, runs, steps))
                        for c in contenders.values():
                            if isinstance(c, InPage):
                                c.page.close()
                    finally:
                        server.stop()
                    entry = {label: _pooled(rs, samples / in_rate, frame_ms) for label, rs in results.items()}
                    dev = manifest.get("deviation", {})
                    report["codecs"].setdefault(name, {})[precision] = {
                        "preset": manifest["preset"], "audio_seconds": samples / in_rate, "contenders": entry,
                        "deviation": {g: dev[g] for g in ("encoder", "decoder") if g in dev}}
        finally:
            browser.close()
    return report


def table(report: dict) -> list[str]:
    m = report["machine"]
    lines = [(f"codecport.mjs on onnxruntime-web {m.get('onnxruntime_web')} (Chromium {m.get('chromium')}) "
              f"beside the native CPU EP (onnxruntime {m['onnxruntime']}), {m['cpus']} CPUs; "
              f"{report['runs']} runs x {report['rounds']} rounds taken in turn; "
              "RTF = compute s per audio s")]
    for name, by_precision in report["codecs"].items():
        for precision, r in by_precision.items():
            lines.append(f"{name} {r.get('preset', r.get('variant'))} {precision}, "
                         f"{r['audio_seconds']:g} s a call:")
            cs = r["contenders"]
            for label, c in cs.items():
                timed = [d for d in ("encode", "decode") if d in c]
                parts = [f"{d} RTF {c[d]['rtf_median']:.3f}" for d in timed]
                native = cs.get(label.replace("wasm", "native"))
                if label.startswith("wasm") and native:
                    parts.append("time vs native: " + ", ".join(
                        f"{d} {c[d]['seconds_median'] / native[d]['seconds_median']:.2f}x" for d in timed))
                if "stream" in c:
                    st, b = c["stream"], c["stream"]["both"]
                    f = st["frames_per_step"]
                    step = f"{f} x {st['frame_ms']:g} ms frames" if f > 1 else f"{st['frame_ms']:g} ms frame"
                    parts.append(f"live encode+decode per {step} p50 {b['p50_ms']:.1f} ms, "
                                 f"p95 {b['p95_ms']:.1f} ms "
                                 f"({'real time' if b['p95_ms'] < f * st['frame_ms'] else 'NOT real time'})")
                lines.append(f"  {label:<17} " + "; ".join(parts))
            for g, d in r["deviation"].items():
                what = [f"codes {d['code_agreement_pct']:.1f}% equal"] if "code_agreement_pct" in d else []
                if d.get("snr_db") is not None:
                    what.append(f"audio SNR {d['snr_db']:.1f} dB")
                lines.append(f"  {g} deviation from fp32: {', '.join(what) or 'identical'}")
    return lines


@click.command("web", context_settings={"show_default": True})
@click.option("--codec", "codecs", multiple=True, default=None,
              help="Codecs to run (repeatable) [default: every codec codecport.mjs runs].")
@click.option("--variant", default=None, hidden=True)
@click.option("--preset", default=None,
              help="Preset of every codec run [default: each codec's bench preset: " + ", ".join(
                  f"{facts_of(s).web_preset} for {s.name}" for s in registry.codecs() if s.web) + "].")
@click.option("--seconds", type=Finite(min=0.01, max=600), default=5.0, help="Audio per encode/decode call.")
@click.option("--precision", "precisions", multiple=True, default=["fp32", "int8"],
              type=click.Choice(list(TARGETS["web"].precisions)),
              help="Web folders in these precisions (repeatable).")
@click.option("--threads", multiple=True, type=click.IntRange(1, 64), default=[1, 2],
              help="WASM threads, and the native CPU EP's intra-op threads (repeatable).")
@click.option("--runs", type=click.IntRange(min=1), default=3, help="Timed calls per round after a warm-up.")
@click.option("--rounds", type=click.IntRange(min=1), default=2, help="Rounds, the contenders taking turns.")
@click.option("--steps", type=click.IntRange(min=1), default=60, help="Live-loop frames timed per round.")
@click.option("--frames", type=click.IntRange(min=1), default=1,
              help="Code frames per streaming step (codecs whose steps the browser runs): the cost per "
                   "frame falls, the latency grows.")
@click.option("--decode-only", is_flag=True,
              help="Time the decoders only, on the native runtime's codes: the page opens no encoder (a "
                   "folder whose encoder is past what wasm32 loads, NeuCodec's fp32 at the released size).")
@click.option("--ort-web", type=click.Path(path_type=Path), default=None,
              help="onnxruntime-web's dist folder [default: as codec-run web finds it].")
@click.option("--dir", "work", type=click.Path(path_type=Path), default=None,
              help="Keep the web folders here and reuse them [default: a temp folder].")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Write the report.")
@guard
@unwinds_on_sigterm
def web_cmd(codecs, variant, preset, seconds, precisions, threads, runs, rounds, steps, frames, decode_only,
            ort_web, work, json_out) -> None:
    """codecport.mjs in headless Chromium (wasm) against the native CPU EP, on the same folders."""
    web = [c.name for c in registry.codecs() if c.web]
    for name in codecs:
        if name not in web:
            raise click.BadParameter(f"{name}: codecport.mjs runs {', '.join(web)}", param_hint="--codec")
    run_report(work, "codec-bench-web-", lambda w: bench_web(
        list(codecs) or web, seconds, tuple(precisions), tuple(threads), runs, rounds, steps, w, ort_web,
        frames, preset or variant, decode_only), table, json_out)
