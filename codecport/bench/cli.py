"""codec-bench: speed, efficiency and memory of our graphs against the torch implementations.

Each contender runs in its own process (`codecport.bench.worker`), one after another, so the
timings and the peak RSS are its own. Needs the [export] extra (the model is exported first).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click

from .. import __version__, registry
from ..atomic import atomic_path
from ..errors import CodecportError
from .measure import gemm_peak, graph_flops, pool, run_report
from .tokenize import tokenize_cmd
from .web import web_cmd

# Contenders that are not installed here are listed, skipped, with the reason.
_OPTIONAL = {
    "transformers": ("transformers", "pip install 'codecport[dev]' (transformers)"),
    "rustymimi": ("rustymimi", "pip install rustymimi"),
}


def _prepare(spec, variant: str, seconds: float, frames: int, seed: int, out: Path,
             batch: int | None = None) -> dict:
    """Export the model (random weights) once into `out`, with its weights and config."""
    from safetensors.torch import save_file

    hooks, models = spec.module("bench"), spec.module("model")
    cfg = spec.presets[variant]
    model = models.init_random(models.MODEL(cfg), seed).eval()
    samples = hooks.clip_samples(cfg, seconds)
    spec.module("export").export(model, out / "model", samples, options=hooks.export_options(frames),
                                 variant=variant, weights=f"random-init seed {seed}", weights_sha256="none",
                                 batch=batch)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "weights.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg.to_kwargs()))
    return {"samples": samples, "sample_rate": cfg.sample_rate}


def _worker(job: dict) -> dict:
    if "python" in job:  # an official package in an environment of its own (e.g. official_dac.py)
        cmd = [job["python"], job["script"]]
    else:
        cmd = [sys.executable, "-m", "codecport.bench.worker"]
    # cwd: `python -m` puts the working directory first on sys.path, where any stray timeit.py
    # or numpy.py would shadow the real module; the bench folder holds only our files.
    proc = subprocess.run([*cmd, json.dumps(job)], capture_output=True, text=True, check=False,
                          cwd=job["dir"])
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CodecportError(f"{job['contender']} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _speedups(results: dict, ours: str) -> dict:
    """How many times faster `ours` is than every other contender that ran, per direction."""
    out = {}
    for name, r in results.items():
        if name == ours or "skipped" in r or "deviation" in r:  # variants: against our fp32 below
            continue
        sp = {d: r[d]["seconds_median"] / results[ours][d]["seconds_median"]
              for d in _directions(r) if d in results[ours]}
        if "streaming" in r and "streaming" in results[ours]:
            for d in ("encode_step", "decode_step"):
                if d in r["streaming"] and d in results[ours]["streaming"]:
                    sp[f"{d} p95"] = r["streaming"][d]["p95_ms"] / results[ours]["streaming"][d]["p95_ms"]
        out[f"{ours} vs {name}"] = sp
    return out


DIRECTIONS = ("encode", "decode", "encode-long", "decode-long")


def _directions(result: dict) -> list[str]:
    return [d for d in DIRECTIONS if d in result]


def _table(report: dict) -> list[str]:
    peak = report["gemm_peak"]["gflops"]
    w = max(16, 2 + max(map(len, report["contenders"]), default=0))  # the contender column
    lines = [(f"{report['codec']} {report['variant']}: {report['seconds']:g} s of audio, "
             f"{report['runs']} runs after a warm-up"
             + (f", in each of {report['rounds']} rounds taken in turn" if report["rounds"] > 1 else "")
             + f"; fp32 GEMM peak {peak:.0f} GFLOP/s "
             f"({report['gemm_peak']['library']})"),
             (f"{'contender':<{w}}{'direction':<12}{'RTF med':>7}{'min':>8}{'max':>8}{'GFLOP/s':>9}"
             f"{'of peak':>9}{'peak RSS':>10}")]
    for name, r in report["contenders"].items():
        if "skipped" in r:
            lines.append(f"{name:<{w}}skipped: {r['skipped']}")
            continue
        for d in _directions(r):
            s = r[d]
            rate = report["flops"][d] / s["seconds_median"] / 1e9
            lines.append(f"{name:<{w}}{d:<12}{s['rtf_median']:>7.3f}{s['rtf_min']:>8.3f}"
                         f"{s['rtf_max']:>8.3f}{rate:>9.0f}{rate / peak:>9.0%}"
                         f"{r['peak_rss_mb']:>8.0f}MB")
    for name, r in report["contenders"].items():
        for graph, d in r.get("deviation", {}).items():
            what = []
            if "code_agreement_pct" in d:
                what.append(f"codes {d['code_agreement_pct']:.1f}% equal (first codebook "
                            f"{d['first_codebook_agreement_pct']:.1f}%)")
            what.append(f"audio SNR {d['snr_db']:.1f} dB")
            lines.append(f"{name} {graph} deviation from fp32: {', '.join(what)}, "
                         f"{d['size_bytes'] / 1e6:.0f} MB (fp32 {d['fp32_size_bytes'] / 1e6:.0f} MB)")
    if "long" in report:
        lines.append(f"-long: {report['long']['windows']} windows ({report['long']['seconds']:g} s of audio) "
                     f"{report['long'].get('through', 'through the chunked graphs')}; ours run "
                     + ", ".join(f"{r['windows_at_once']} at once ({n})" for n, r in report["contenders"].items()
                                 if "windows_at_once" in r)
                     + (f"; torch {report['long'].get('torch', 'one after another')}" if "encode-long" in report["contenders"].get("torch-eager", {})
                        else ""))
    for name, r in report["contenders"].items():
        if "codes_equal_pct" in r:
            eq = r["codes_equal_pct"]
            lines.append(f"{name} codes: {eq['pct']:.1f}% equal to {eq['to']}'s on the same weights"
                         + ("" if eq["frames"][0] == eq["frames"][1]
                            else f" ({eq['frames'][0]} against {eq['frames'][1]} frames)"))
    for pair, sp in report["speedups"].items():
        lines.append(f"{pair}: " + ", ".join(f"{d} {x:.2f}x" for d, x in sp.items()) + " faster")
    first: dict[str, dict] = {}
    for m in report.get("memory", []):
        d = m.get("direction", "decode")
        ref = first.setdefault(d, m)
        what = "of a 44.1 kHz stereo WAV" if d == "encode" else f"({m['output_mb']:.0f} MB of audio written)"
        what += "" if d == "encode" else f" from {m['from']}"
        ratio = f" ({m['peak_rss_mb'] / ref['peak_rss_mb']:.2f}x the {ref['minutes']:g} min run)" if m is not ref else ""
        lines.append(f"codec-run {d} of {m['minutes']:g} min {what}: peak RSS {m['peak_rss_mb']:.0f} MB"
                     f"{ratio}, {m['seconds']:.1f} s")
    for name, r in report["contenders"].items():
        if "streaming" in r:
            st = r["streaming"]
            for d in [d for d in ("encode_step", "decode_step") if d in st]:
                p = st[d]
                f = st["frames_per_step"]
                line = (f"{name} streaming {d} ({f} × {st['frame_ms']:g} ms frame{'s' if f > 1 else ''} a step, "
                        f"{st['steps']} steps): p50 {p['p50_ms']:.1f} ms, p95 {p['p95_ms']:.1f} ms, "
                        f"p99 {p['p99_ms']:.1f} ms")
                if f > 1:  # the weights are read once a step, so the cost of a frame falls
                    line += f"; per frame p50 {p['p50_ms'] / f:.1f} ms, p95 {p['p95_ms'] / f:.1f} ms"
                if len(p.get("round_p50_ms", ())) > 1:
                    line += "; p50 by round " + " / ".join(f"{x:.1f}" for x in p["round_p50_ms"]) + " ms"
                if "latency_frames" in st:
                    line += (f"; audio final {st['latency_frames']:g} frames "
                             f"({st['latency_frames'] * st['frame_ms']:.0f} ms) after its frame")
                lines.append(line)
    return lines


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = {n: r for n, r in report["contenders"].items() if "skipped" not in r}
    dirs = [d for d in DIRECTIONS if any(d in r for r in ran.values())]
    fig, ax = plt.subplots(figsize=(3.5 * len(dirs), 3.5))
    width = 0.8 / max(1, len(ran))
    for i, (name, r) in enumerate(ran.items()):
        ax.bar([j + i * width for j, d in enumerate(dirs) if d in r],
               [r[d]["rtf_median"] for d in dirs if d in r], width, label=name)
    ax.set_xticks([j + width * (len(ran) - 1) / 2 for j in range(len(dirs))], dirs)
    ax.set_ylabel("real-time factor (lower is faster)")
    ax.set_title(f"{report['codec']} {report['variant']}, {report['seconds']:g} s, {report['machine']['cpus']} CPUs")
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)


@click.command(context_settings={"show_default": True})
@click.argument("codec", type=click.Choice(registry.names()))
@click.option("--variant", default=None, help="Preset [default: the codec's default, e.g. 44khz for "
                                                 "dac, mimi for mimi].")
@click.option("--seconds", type=float, default=5.0, help="Audio per encode/decode call.")
@click.option("--runs", type=click.IntRange(min=1), default=3, help="Timed runs after one warm-up.")
@click.option("--rounds", type=click.IntRange(min=1), default=1,
              help="Run every contender this many times, taking turns, and pool their runs: a slow "
                   "spell of the machine then falls on all of them.")
@click.option("--provider", "providers", multiple=True, default=["cpu"],
              type=click.Choice(["cpu", "cuda", "dml", "coreml"]), help="Our graphs on these (repeatable).")
@click.option("--precision", "precisions", multiple=True, default=["fp32"],
              type=click.Choice(["fp32", "fp16", "int8"]),
              help="Our graphs in these precisions (repeatable); fp16/int8 are built from the fp32 "
                   "export and their measured deviation is reported next to their speed.")
@click.option("--steps", type=click.IntRange(min=1), default=50, help="Mimi streaming steps timed.")
@click.option("--frames", type=click.IntRange(min=1), default=1,
              help="Mimi: 80 ms code frames per streaming step; SNAC: coarse frames per call of its "
                   "stream decoder. A step reads all the weights once, so more frames cost less per "
                   "frame, at that many frames of latency.")
@click.option("--long", "long_windows", type=click.IntRange(min=0), default=4,
              help="DAC and SNAC: also time long audio of this many windows (DAC's chunked graphs, "
                   "SNAC's window graphs overlapping), as "
                   "codec-run slides them (our runtime runs windows at once, see the `windows` "
                   "option), against the same windows through torch; 0 for none.")
@click.option("--contender", "contenders", multiple=True, default=["torch", "transformers", "official", "rustymimi"],
              help="Others to compare with (repeatable): torch, transformers, official (moshi for "
                   "mimi), rustymimi.")
@click.option("--official-python", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="DAC: the Python of an environment where descript-audio-codec is installed, for "
                   "`--contender official` (it cannot share one with codecport).")
@click.option("--memory", "minutes", multiple=True, type=click.FloatRange(min=0.01),
              help="Also run `codec-run encode` on a 44.1 kHz stereo WAV and `codec-run decode` on "
                   "codes this many minutes long, and report their peak RSS (repeatable, e.g. "
                   "--memory 0.5 --memory 10: each later length is compared with the first).")
@click.option("--dir", "work", type=click.Path(path_type=Path), default=None,
              help="Keep the exported model here and reuse it on the next run [default: a temp folder].")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Write the report.")
@click.option("--plot", type=click.Path(path_type=Path), default=None, help="Bar chart PNG (matplotlib).")
def codec_cmd(codec, variant, seconds, runs, rounds, providers, precisions, steps, frames, long_windows,
         contenders, official_python, minutes, work, json_out, plot) -> None:
    """Benchmark CODEC: our ONNX graphs vs the torch implementations, one process each."""

    try:
        import onnx  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        click.echo(f"error: codec-bench needs the [export] extra ({e}); pip install 'codecport[export]'",
                   err=True)
        sys.exit(1)
    if plot and importlib.util.find_spec("matplotlib") is None:
        click.echo("error: --plot needs matplotlib; pip install 'codecport[bench]'", err=True)
        sys.exit(1)
    spec = registry.get(codec)
    hooks = spec.module("bench")
    with_steps = [c.name for c in registry.codecs() if c.module("bench").FRAMES]
    own_python = [c.name for c in registry.codecs() if c.module("bench").OFFICIAL_SCRIPT]
    if frames != 1 and not hooks.FRAMES:
        click.echo(f"error: --frames is for codecs with streaming steps ({', '.join(with_steps)}); "
                   f"{codec} has none", err=True)
        sys.exit(2)
    if official_python and not hooks.OFFICIAL_SCRIPT:
        click.echo(f"error: --official-python is for {', '.join(own_python)}; {codec}'s official package "
                   "runs in the bench's own environment", err=True)
        sys.exit(2)
    variant = variant or spec.default_variant
    if variant not in spec.presets:
        click.echo(f"error: {codec} has no preset {variant!r}; choose one of {', '.join(spec.presets)}", err=True)
        sys.exit(2)
    report = run_report(work, "codec-bench-", lambda w: _bench(
        spec, variant, seconds, runs, rounds, providers, precisions, steps, frames,
        long_windows if hooks.LONG else 0, contenders, minutes, w, official_python), _table, json_out)
    if plot:
        _plot(report, plot)
        click.echo(f"wrote {plot}")


main = click.Group("codec-bench", context_settings={"show_default": True},
                   help="Benchmark a codec (our graphs against torch and the official packages), "
                        "corpus tokenizing (`codec-bench tokenize`), or the browser (`codec-bench web`).")
for _spec in registry.codecs():
    main.add_command(click.Command(
        _spec.name, params=[p for p in codec_cmd.params if p.name != "codec"],
        callback=functools.partial(codec_cmd.callback, _spec.name), context_settings={"show_default": True},
        help=f"Benchmark {_spec.label}: our ONNX graphs vs the torch implementations, one process each."))
main.add_command(tokenize_cmd)
main.add_command(web_cmd)


def _export_source_hash() -> str:
    """Hash of the code that builds the graphs: a kept `--dir` export is rebuilt when it changed
    (the version number stays the same between releases)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted([*(root / "models").glob("*.py"), *(root / "export").glob("*.py")]):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _variant(work: Path, precision: str) -> Path:
    """The fp32 export's `precision` variant, built once and kept beside it."""
    from ..export.variants import Shaping, variant_of_folder

    folder = work / f"model-{precision}"
    fp32_id = json.loads((work / "model" / "manifest.json").read_text())["export_id"]
    manifest = folder / "manifest.json"
    if not manifest.is_file() or json.loads(manifest.read_text()).get("fp32_export_id") != fp32_id:
        click.echo(f"building the {precision} variant (calibration and deviation measured) ...")
        variant_of_folder(work / "model", folder, Shaping("cpu", precision))
    return folder


def _code_agreement(contenders: dict, ours: str | None) -> None:
    """Codes of the contenders on the bench's weights, compared with our fp32 graphs' codes.

    The codes themselves leave the report. transformers builds its own random weights, so it
    has none to compare; our lower precisions report their deviation instead.
    """
    import numpy as np

    codes = {n: np.asarray(r.pop("codes")) for n, r in contenders.items() if "codes" in r}
    if ours not in codes:
        return
    for name, c in codes.items():
        if name == ours or "deviation" in contenders[name]:
            continue
        want = codes[ours]
        # Over the frames both have; a differing count is printed beside the share.
        k, t = min(c.shape[-2], want.shape[-2]), min(c.shape[-1], want.shape[-1])
        contenders[name]["codes_equal_pct"] = {
            "to": ours, "pct": float((c[..., :k, :t] == want[..., :k, :t]).mean() * 100),
            "frames": [int(c.shape[-1]), int(want.shape[-1])]}


def _bench(spec, variant, seconds, runs, rounds, providers, precisions, steps, frames, long_windows,
           contenders, minutes, work: Path, official_python: Path | None = None) -> dict:
    import onnxruntime
    import torch

    codec, hooks = spec.name, spec.module("bench")
    stamp = work / "stamp.json"
    key = {"codec": codec, "variant": variant, "seconds": seconds, "codecport": __version__,
           "source": _export_source_hash(), **({"frames": frames} if hooks.FRAMES else {})}
    if not stamp.is_file() or json.loads(stamp.read_text()) != key:
        click.echo(f"exporting {codec} {variant} for {seconds:g} s of audio (random weights) ...")
        # Variants of the previous export go too: the same seed gives the same export id, so
        # `_variant` could not tell them from variants of this one.
        for old in work.glob("model-*"):
            shutil.rmtree(old)
        _prepare(spec, variant, seconds, frames, 0, work)
        stamp.write_text(json.dumps(key))
    model = work / "model"
    flops = {"encode": graph_flops(model / "encoder.onnx"), "decode": graph_flops(model / "decoder.onnx")}
    manifest = json.loads((model / "manifest.json").read_text())
    audio_s = manifest["geometry"]["samples"] / int(manifest["sample_rate"])
    report = {"codec": codec, "variant": variant, "seconds": audio_s, "runs": runs, "rounds": rounds,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "processor": platform.processor() or platform.machine(),
                          "onnxruntime": onnxruntime.__version__, "torch": torch.__version__},
              "gemm_peak": gemm_peak(), "flops": flops, "contenders": {}}
    if long_windows:
        for d, g in zip(("encode-long", "decode-long"), hooks.LONG_GRAPHS):
            flops[d] = long_windows * graph_flops(model / f"{g}.onnx")
        report["long"] = {"windows": long_windows, "through": hooks.LONG_LABEL, "torch": hooks.LONG_TORCH,
                          "seconds": hooks.long_samples(manifest, long_windows) / int(manifest["sample_rate"])}
    base = {"codec": codec, "dir": str(work), "seconds": audio_s, "runs": runs, "steps": steps,
            "frames": frames, "long": long_windows}
    t0 = time.perf_counter()
    jobs, deviations = {}, {}
    for precision in precisions:
        folder = "model" if precision == "fp32" else _variant(work, precision).name
        suffix = "" if precision == "fp32" else f"-{precision}"
        for p in providers:
            name = f"onnx-{p}{suffix}"
            jobs[name] = {**base, "contender": "onnx", "provider": p, "model": folder}
            if precision != "fp32":
                dev = json.loads((work / folder / "manifest.json").read_text())["deviation"]
                deviations[name] = {g: dev[g] for g in ("encoder", "decoder")}
    skipped = {}
    for name in contenders:
        if name == "official":
            label, module, reason = hooks.OFFICIAL
        else:
            label = "torch-eager" if name == "torch" else name
            module, reason = _OPTIONAL.get(name, ("torch", ""))
        if name == "official" and hooks.OFFICIAL_SCRIPT:
            if official_python is None:
                skipped[label] = {"skipped": reason}
            else:
                hooks.prepare_official(work)
                # absolute, not resolved: a venv's python is a symlink that must stay one
                jobs[label] = {**base, "contender": name, "python": str(official_python.absolute()),
                               "script": str(hooks.OFFICIAL_SCRIPT)}
            continue
        if name not in ("torch", "transformers", "official") and name not in hooks.CONTENDERS:
            skipped[label] = {"skipped": f"not a contender for {codec}"}
            continue
        if name != "torch" and importlib.util.find_spec(module) is None:
            skipped[label] = {"skipped": f"not installed: {reason}"}
            continue
        if (why := hooks.skip(name, variant)) is not None:
            skipped[label] = {"skipped": why}
            continue
        jobs[label] = {**base, "contender": name}
    # Rounds interleave the contenders, so a slow spell of the machine (other tenants, clock
    # changes) lands on all of them instead of deciding one ratio.
    rounds_of: dict[str, list[dict]] = {name: [] for name in jobs}
    for r in range(rounds):
        for name, job in jobs.items():
            if name in skipped:
                continue
            click.echo(f"running {name}" + (f" (round {r + 1} of {rounds})" if rounds > 1 else "") + " ...")
            result = _worker(job)
            if "skipped" in result:  # installed, but it found it cannot run here
                skipped[name] = result
                del rounds_of[name]
            else:
                rounds_of[name].append(result)
    for name, results in rounds_of.items():
        report["contenders"][name] = {**pool(results), **({"deviation": deviations[name]}
                                                          if name in deviations else {})}
    report["contenders"].update(skipped)
    _code_agreement(report["contenders"], f"onnx-{providers[0]}" if "fp32" in precisions else None)
    for direction in ("encode", "decode"):
        for m in minutes:
            click.echo(f"running codec-run {direction} of {m:g} min ...")
            report.setdefault("memory", []).append(
                _worker({**base, "contender": "memory", "minutes": m, "direction": direction}))
    report["bench_seconds"] = time.perf_counter() - t0
    ours = f"onnx-{providers[0]}" + ("" if precisions[0] == "fp32" else f"-{precisions[0]}")
    report["speedups"] = _speedups(report["contenders"], ours)
    for precision in precisions[1:] if precisions[0] == "fp32" else []:
        # Each lower precision against our own fp32, as the targets are stated.
        low = f"onnx-{providers[0]}-{precision}"
        report["speedups"][f"{low} vs {ours}"] = {
            d: report["contenders"][ours][d]["seconds_median"] / report["contenders"][low][d]["seconds_median"]
            for d in _directions(report["contenders"][low])}
    return report


if __name__ == "__main__":
    main()
