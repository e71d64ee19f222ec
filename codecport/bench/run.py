"""One `codec-bench CODEC` run: export the model once, run every contender in its own process
(`worker.py`), taking turns round by round, and gather the report."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from ..errors import CodecportError
from ..version import __version__
from .facts import facts_of
from .measure import gemm_peak, graph_flops, pool
from .prepare import build_folder, export_source_hash, prepare, stamped
from .report import code_agreement, directions, speedups

# Contenders that are not installed here are listed, skipped, with the reason. A codec's own
# contender (its bench facts' `contenders`) is the package of its name.
OPTIONAL = {"transformers": ("transformers", "pip install 'codecport[dev]' (transformers)")}


def run_worker(job: dict) -> dict:
    if "python" in job:  # an official package in an environment of its own (e.g. codecs/dac/official.py)
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


@dataclass(frozen=True)
class Options:
    """What one `codec-bench CODEC` run measures (its command-line options)."""

    preset: str
    seconds: float = 5.0
    runs: int = 3
    rounds: int = 1
    providers: tuple[str, ...] = ("cpu",)
    precisions: tuple[str, ...] = ("fp32",)
    steps: int = 50
    frames: int = 1
    long_windows: int = 0
    contenders: tuple[str, ...] = ()
    minutes: tuple[float, ...] = ()
    official_python: Path | None = None
    peak_seconds: float = 1.5  # seconds measuring the GEMM peak, per matrix size


def ensure_model(spec, o: Options, work: Path) -> dict:
    """The bench's export in `work` (made once per preset, length, step frames and export code);
    returns its manifest."""
    key = {"codec": spec.name, "preset": o.preset, "seconds": o.seconds, "codecport": __version__,
           "source": export_source_hash(), **({"frames": o.frames} if spec.has_step_graphs else {})}

    def make() -> None:
        click.echo(f"exporting {spec.name} {o.preset} for {o.seconds:g} s of audio (random weights) ...")
        prepare(spec, o.preset, o.seconds, o.frames, 0, work)

    stamped(work, key, make)
    return json.loads((work / "model" / "manifest.json").read_text())


def _jobs(spec, o: Options, work: Path, base: dict) -> tuple[dict, dict, dict]:
    """(name -> worker job, name -> {"skipped": why}, name -> the build's deviation)."""
    facts, jobs, deviations, skipped = facts_of(spec), {}, {}, {}
    for precision in o.precisions:
        folder = "model" if precision == "fp32" else build_folder(spec, work, precision).name
        suffix = "" if precision == "fp32" else f"-{precision}"
        for p in o.providers:
            name = f"onnx-{p}{suffix}"
            jobs[name] = {**base, "contender": "onnx", "provider": p, "model": folder}
            if precision != "fp32":
                dev = json.loads((work / folder / "manifest.json").read_text())["deviation"]
                deviations[name] = {g: dev[g] for g in ("encoder", "decoder")}
    for name in o.contenders:
        official = name == "official" and facts.official
        if name == "official":
            label, module, reason = (facts.official.label, facts.official.module, facts.official.install) \
                if official else ("official", None, f"{spec.label} has no official package to run")
        else:
            label = "torch-eager" if name == "torch" else name
            module, reason = (("torch", "") if name == "torch"
                              else OPTIONAL.get(name, (name, f"pip install {name}")))
        if official and facts.official.script is not None:
            if o.official_python is None:
                skipped[label] = {"skipped": reason}
            else:
                facts.prepare_official(work, o.official_python)
                # absolute, not resolved: a venv's python is a symlink that must stay one
                jobs[label] = {**base, "contender": name, "python": str(o.official_python.absolute()),
                               "script": str(facts.official.script)}
        elif name not in ("torch", "transformers") and name not in facts.contenders:
            skipped[label] = {"skipped": f"not a contender for {spec.name}"}
        elif name != "torch" and (module is None or importlib.util.find_spec(module) is None):
            skipped[label] = {"skipped": f"not installed: {reason}"}
        elif name == "transformers" and facts.transformers_model is None:
            skipped[label] = {"skipped": f"transformers has no {spec.label} port"}
        elif (why := facts.skip(name, o.preset)) is not None:
            skipped[label] = {"skipped": why}
        else:
            jobs[label] = {**base, "contender": name}
    return jobs, skipped, deviations


def bench(spec, o: Options, work: Path) -> dict:
    """The whole run in `work`: export (once), every contender round by round, the report."""
    import onnxruntime
    import torch

    facts = facts_of(spec)
    manifest = ensure_model(spec, o, work)
    model = work / "model"
    flops = {"encode": graph_flops(model / "encoder.onnx"), "decode": graph_flops(model / "decoder.onnx")}
    audio_s = manifest["geometry"]["samples"] / int(manifest["sample_rate"])
    report = {"codec": spec.name, "preset": o.preset, "seconds": audio_s, "runs": o.runs, "rounds": o.rounds,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                          "processor": platform.processor() or platform.machine(),
                          "onnxruntime": onnxruntime.__version__, "torch": torch.__version__},
              "gemm_peak": gemm_peak(o.peak_seconds), "flops": flops, "contenders": {}}
    long_windows = o.long_windows if facts.long else 0
    if long_windows:
        for d, g in zip(("encode-long", "decode-long"), facts.long.graphs):
            flops[d] = long_windows * graph_flops(model / f"{g}.onnx")
        report["long"] = {"windows": long_windows, "through": facts.long.label, "torch": facts.long.torch,
                          "seconds": facts.long.samples(manifest, long_windows) /
                                     int(manifest.get("input_rate", manifest["sample_rate"]))}
    base = {"codec": spec.name, "dir": str(work), "seconds": audio_s, "runs": o.runs, "steps": o.steps,
            "frames": o.frames, "long": long_windows}
    t0 = time.perf_counter()
    jobs, skipped, deviations = _jobs(spec, o, work, base)
    # Rounds interleave the contenders, so a slow spell of the machine (other tenants, clock
    # changes) lands on all of them instead of deciding one ratio.
    rounds_of: dict[str, list[dict]] = {name: [] for name in jobs}
    for r in range(o.rounds):
        for name, job in jobs.items():
            if name in skipped:
                continue
            click.echo(f"running {name}" + (f" (round {r + 1} of {o.rounds})" if o.rounds > 1 else "")
                       + " ...")
            result = run_worker(job)
            if "skipped" in result:  # installed, but it found it cannot run here
                skipped[name] = result
                del rounds_of[name]
            else:
                rounds_of[name].append(result)
    for name, results in rounds_of.items():
        report["contenders"][name] = {**pool(results), **({"deviation": deviations[name]}
                                                          if name in deviations else {})}
    report["contenders"].update(skipped)
    code_agreement(report["contenders"], f"onnx-{o.providers[0]}" if "fp32" in o.precisions else None)
    for direction in ("encode", "decode"):
        for m in o.minutes:
            click.echo(f"running codec-run {direction} of {m:g} min ...")
            report.setdefault("memory", []).append(
                run_worker({**base, "contender": "memory", "minutes": m, "direction": direction}))
    report["bench_seconds"] = time.perf_counter() - t0
    ours = f"onnx-{o.providers[0]}" + ("" if o.precisions[0] == "fp32" else f"-{o.precisions[0]}")
    report["speedups"] = speedups(report["contenders"], ours)
    for precision in o.precisions[1:] if o.precisions[0] == "fp32" else []:
        # Each lower precision against our own fp32, as the targets are stated.
        low = f"onnx-{o.providers[0]}-{precision}"
        report["speedups"][f"{low} vs {ours}"] = {
            d: (report["contenders"][ours][d]["seconds_median"]
                / report["contenders"][low][d]["seconds_median"])
            for d in directions(report["contenders"][low])}
    return report
