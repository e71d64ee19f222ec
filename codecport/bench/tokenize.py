"""`codec-bench tokenize`: corpus tokenizing throughput, in audio seconds per wall second.

Contenders, each a process of its own, taking turns over slices of one generated corpus (clips
of mixed lengths, rates and channels), so that a slow spell of the machine falls on all:
- `torch-loop`: the loop users write today, file by file over our torch reference (read,
  resample with soxr, `encode` each channel under `no_grad`);
- `local`: `codec-run tokenize --engine local`, at batch 1 and batch B;
- `ray-1`, `ray-2`: `codec-run tokenize --engine ray` with 1 and 2 actors, at batch 1 and B.
Each is also run once on a single short clip: that wall time is what the engine costs to start
(Python, sessions, workers or a Ray cluster), reported beside the rates; and on `--short-clips`
clips of 0.2 s, which gives what a file costs beyond its audio (reading, resampling, scheduling, and the
padding of a short clip to the fixed graph).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np

from .. import registry
from ..atomic import atomic_path
from ..frontend import Finite, guard, unwinds_on_sigterm
from .facts import facts_of

BIN = Path(sys.executable).parent
ONE_S, SHORT_S = 0.5, 0.2  # seconds of the clip that times the start, and of each short clip


def per_file_ms(start_s: float, many_wall_s: float, many: int, wall_s: float, runs: int,
                audio_s: float) -> float:
    """What a file costs beyond its audio, in ms: the wall time of `many` short clips, less the
    start and their audio at the corpus's rate (`audio_s` in `runs` runs of `wall_s` in all, each
    run's start taken off: a small corpus is mostly starts). Never below 0: where the runs are too
    short to tell the files' cost from the noise of the starts, it reads 0."""
    audio_cost = max(0.0, wall_s - runs * start_s) / audio_s if audio_s > 0 else 0.0  # s per audio s
    return 1000 * max(0.0, (many_wall_s - start_s) / many - SHORT_S * audio_cost)


def make_corpus(root: Path, clips: int, min_s: float, max_s: float, seed: int = 0) -> float:
    """`clips` WAV/FLAC files of uniform 1..20 s-like lengths at mixed rates and channel counts;
    returns the seconds of audio written."""
    import soundfile as sf

    rng = np.random.default_rng(seed)
    total = 0.0
    for i in range(clips):
        sr = (16000, 22050, 24000, 44100, 48000)[i % 5]
        channels = 2 if i % 4 == 0 else 1
        secs = float(rng.uniform(min_s, max_s))
        t = np.arange(int(secs * sr)) / sr
        x = 0.2 * np.sin(2 * np.pi * rng.uniform(80, 1500) * t * (1 + 0.1 * np.sin(t)))[:, None] + \
            0.03 * rng.standard_normal((len(t), channels))
        sf.write(root / f"clip{i:04d}.{'flac' if i % 3 == 0 else 'wav'}", x.astype(np.float32), sr)
        total += secs
    return total


def _torch_loop(job: dict) -> None:
    """The `torch-loop` contender (run as `python -m codecport.bench.tokenize JOB`)."""
    import soundfile as sf
    import soxr
    import torch
    from safetensors.torch import load_file

    spec = registry.get(job["codec"])
    models, facts = spec.module("model"), facts_of(spec)
    cfg = spec.module("config").CONFIG.from_kwargs(json.loads(Path(job["config"]).read_text()))
    model = models.MODEL(cfg)
    model.load_state_dict(load_file(job["weights"]))
    model.eval()
    t0 = time.perf_counter()
    for path in sorted(Path(job["corpus"]).iterdir()):
        audio, sr = sf.read(path, dtype="float32", always_2d=True)
        if sr != cfg.sample_rate:
            audio = soxr.resample(audio, sr, cfg.sample_rate)
        with torch.no_grad():
            for channel in audio.T:
                facts.torch_encode(model, torch.from_numpy(np.ascontiguousarray(channel))[None, None],
                                   job["k"])
    print(json.dumps({"wall_s": time.perf_counter() - t0}))


def _run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise click.ClickException(f"{cmd[1]} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return wall


def _contenders(batch: int | None, with_ray: bool) -> dict[str, dict]:
    """The engines at batch 1 and `batch` (None: a codec without batched encoders, batch 1 only)."""
    batches = (1,) if batch is None else (1, batch)
    out = {"torch-loop": {}, **{f"local b{b}": {"engine": "local", "batch": b} for b in batches}}
    if with_ray:
        for actors in (1, 2):
            for b in batches:
                out[f"ray-{actors} b{b}"] = {"engine": "ray", "batch": b, "workers": actors}
    return out


@click.command("tokenize", context_settings={"show_default": True})
@click.option("--codec", type=click.Choice(registry.names()), required=True,
              help="The codec to export and run.")
@click.option("--preset", default=None, help="Preset [default: the codec's default].")
@click.option("--variant", default=None, hidden=True)
@click.option("--len", "length", type=Finite(min=0.1, max=600), default=5.0,
              help="Seconds per call of the fixed graphs and of DAC's windows. Mimi batches the clips "
                   "up to this long (padded to it) and streams the longer ones.")
@click.option("--batch", type=click.IntRange(min=2), default=8, help="Rows of the batched encoders.")
@click.option("--frames", type=click.IntRange(min=1), default=25,
              help="Codecs with step graphs (Mimi): frames per step, for clips longer than --len "
                   "(25: 2 s a call; a corpus needs no low latency).")
@click.option("--clips", type=click.IntRange(min=1), default=200)
@click.option("--min-seconds", type=Finite(min=0.01, max=3600), default=1.0)
@click.option("--max-seconds", type=Finite(min=0.01, max=3600), default=20.0)
@click.option("--slices", type=click.IntRange(min=1), default=2,
              help="Corpus slices the contenders take turns over (order reversed every other slice).")
@click.option("--short-clips", "many", type=click.IntRange(min=1), default=40,
              help="Clips of 0.2 s whose wall time, less the start and their audio, gives the cost "
                   "per file.")
@click.option("--ray/--no-ray", "with_ray", default=True, help="Include the Ray engine.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None)
@guard
@unwinds_on_sigterm
def tokenize_cmd(codec, preset, variant, length, batch, frames, clips, min_seconds, max_seconds, slices, many,
                 with_ray, json_out) -> None:
    """Corpus tokenizing: our engines against a torch loop, audio seconds per wall second."""
    from .prepare import prepare, preset_of

    spec = registry.get(codec)
    preset = preset_of(spec, preset, variant)
    if not spec.runtime.batchable:
        click.echo(f"{spec.label} has no batched encoders: its engines run at batch 1", err=True)
        batch = None
    with tempfile.TemporaryDirectory(prefix="codec-bench-tokenize-") as tmp:
        work = Path(tmp)
        click.echo(f"exporting {codec} {preset} (random weights, --len {length} s, --batch {batch}, "
                   f"--frames {frames})...", err=True)
        prepare(spec, preset, length, frames if spec.has_step_graphs else 1, 0, work, batch=batch)
        parts = [work / f"slice{i}" for i in range(slices)]
        audio = []
        for i, part in enumerate(parts):
            part.mkdir()
            audio.append(make_corpus(part, clips // slices + (i < clips % slices), min_seconds, max_seconds,
                                     seed=i))
        one = work / "one"
        one.mkdir()
        make_corpus(one, 1, ONE_S, ONE_S)
        shorts = work / "short"
        shorts.mkdir()
        make_corpus(shorts, many, SHORT_S, SHORT_S, seed=9)
        contenders = _contenders(batch, with_ray)
        k = registry.get(codec).runtime.default_codebooks
        results = {name: {"wall_s": 0.0} for name in contenders}

        def command(name: str, corpus: Path, out: Path) -> list[str]:
            c = contenders[name]
            if not c:
                job = {"codec": codec, "config": str(work / "config.json"), "k": k,
                       "weights": str(work / "weights.safetensors"), "corpus": str(corpus)}
                return [sys.executable, "-m", "codecport.bench.tokenize", json.dumps(job)]
            cmd = [str(BIN / "codec-run"), "tokenize", str(corpus), "-m", str(work / "model"), "-o", str(out),
                   "--engine", c["engine"], "--batch", str(c["batch"])]
            return cmd + (["--workers", str(c["workers"])] if "workers" in c else [])

        runs = 0
        for name in contenders:  # the cost to start: one short clip
            results[name]["start_s"] = _run(command(name, one, work / f"out-one-{runs}"))
            runs += 1
        for i, part in enumerate(parts):
            order = list(contenders) if i % 2 == 0 else list(reversed(contenders))
            for name in order:
                wall = _run(command(name, part, work / f"out-{runs}"))
                runs += 1
                results[name]["wall_s"] += wall
                click.echo(f"  slice {i + 1}/{slices} {name:<12} {audio[i] / wall:7.1f} audio s per s",
                           err=True)
        for name in contenders:
            if contenders[name]:
                wall = _run(command(name, shorts, work / f"out-short-{runs}"))
                runs += 1
                results[name]["many_wall_s"] = wall
    total = sum(audio)
    for r in results.values():
        r["audio_s_per_s"] = total / r["wall_s"]
        if "many_wall_s" in r:
            r["per_file_ms"] = per_file_ms(r["start_s"], r["many_wall_s"], many, r["wall_s"], slices, total)
    report = {"codec": codec, "preset": preset, "len_s": length, "batch": batch, "frames": frames,
              "clips": clips,
              "audio_s": total, "seconds": [min_seconds, max_seconds], "slices": slices, "results": results}
    base = results["torch-loop"]["audio_s_per_s"]
    click.echo(f"{codec} {preset}: {clips} clips, {total / 3600:.2f} h of audio ({min_seconds:g}-"
               f"{max_seconds:g} s, rates 16-48 kHz, mono and stereo), batch {batch or 1}")
    click.echo(f"{'contender':<14}{'audio s/s':>10}{'vs torch':>10}{'vs local':>10}"
               f"{'start s':>9}{'ms/file':>9}")
    click.echo("  (vs local: against the local engine at the same batch)")
    for name, r in results.items():
        rate = r["audio_s_per_s"]
        local = results.get(f"local {name.split()[-1]}", results["local b1"])["audio_s_per_s"]
        r["vs_torch_loop"], r["vs_local_same_batch"] = rate / base, rate / local
        per = f"{r['per_file_ms']:9.1f}" if "per_file_ms" in r else f"{'-':>9}"
        click.echo(f"{name:<14}{rate:10.1f}{rate / base:9.2f}x{rate / local:9.2f}x{r['start_s']:9.1f}{per}")
    if json_out:
        with atomic_path(json_out) as t:
            t.write_text(json.dumps(report, indent=2))
        click.echo(f"wrote {json_out}")


if __name__ == "__main__":
    _torch_loop(json.loads(sys.argv[1]))
