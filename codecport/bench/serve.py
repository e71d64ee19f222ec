"""`codec-bench serve CODEC`: how many real-time streams `codec-serve` holds, on loopback.

Each client is a live stream in real time: a codec that streams both ways gets 80 ms-style
frames of audio, one frame period apart, and takes back codes and their decoded audio (duplex);
a codec that streams its decoder only gets a coarse frame of codes a period (as a TTS model emits
them) and takes back audio. A frame's latency runs from sending it to receiving the last sample of
audio it made final (its stated lookahead taken off); time to first audio from the first send.

Configurations, all in one run: `--slots B` for each B (1: one graph step per stream; B > 1: the
folder's batched slot graphs, B streams a call) and each `--precision`. Every configuration has
its own server, started before any load; the load ramps in lockstep (every configuration at N
streams before any at 2N), then bisects, configurations taking turns, so a slow spell of this
machine falls on all of them. A configuration holds N streams when the p99 frame latency stays
under one frame period (for output that comes in windows, NeuCodec's: under the audio of a
window's step, which the client plays meanwhile) and every stream ends complete.

The bound: the streams the fixed full-clip graphs (`--len` s a call) could sustain for the same
work (1 / their real-time factor: encode + decode of a clip, or its decode), measured between
the ramps.

`--abuse SECONDS`: instead of the ramp, what a flooding client and a slow reader cost each
configuration's processes (abuse.py), the engines side by side.

`--soak MINUTES`: the best configuration at its held load for that long, with random disconnects,
garbage frames and slow readers mixed in: the others' output is checked against single streams,
the server's RSS is sampled, and every slot must be free at the end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import click
import numpy as np

from .. import registry
from ..export.targets import PRECISIONS
from ..frontend import Finite, guard, unwinds_on_sigterm
from ..version import __version__
from . import abuse, procs
from .load import check_streams, duplex_of, open_folder, soak_run, trial
from .measure import run_report
from .prepare import build_folder, export_source_hash, fail, prepare, preset_of, stamped

# The ramp's servers keep this much output for a client (codec-serve's default is 4 MiB): the
# load's clients read late on a loaded machine, and are not dropped for it.
RAMP_BACKLOG = 64 << 20
WARMUP_SECONDS = 3.0  # a trial per server before any is measured (no longer than a trial)


@dataclass
class Config:
    slots: int  # 1: one step per stream; else the batched graphs' B
    precision: str
    folder: Path
    engine: str = "local"  # codec-serve's --engine: "ray" is a private local Ray, one replica
    url: str = ""
    proc: subprocess.Popen | None = None
    held: int = 0  # most streams held in real time
    failed: int | None = None  # fewest streams seen failing
    trials: dict = field(default_factory=dict)  # streams -> trial report

    @property
    def name(self) -> str:
        return f"B={self.slots} {self.precision}" + ("" if self.engine == "local" else f" {self.engine}")


# ---- the servers -------------------------------------------------------------------------------
def start_server(folder: Path, pool: int, batched: bool, provider: str,
                 engine: str = "local", max_backlog: int | None = RAMP_BACKLOG) -> subprocess.Popen:
    """`codec-serve` on a free port of 127.0.0.1, starting (`server_url` waits for it), in a
    session of its own (procs.py finds a Ray server's processes by it). `engine` "ray": one
    replica on a private local Ray, behind one proxy."""
    cmd = [sys.executable, "-c", "from codecport.cli.serve import serve_cli; serve_cli()", "-m", str(folder),
           "--slots", str(pool), "--port", "0", "--provider", provider]
    if max_backlog is not None:  # None: codec-serve's own
        cmd += ["--max-backlog", str(max_backlog)]
    if not batched:
        cmd.append("--no-batch")
    if engine == "ray":
        cmd += ["--engine", "ray", "--proxies", "head"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def server_url(proc: subprocess.Popen) -> str:
    """The http URL a starting server prints once it listens."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("listening on "):
            return line.split()[2]
    proc.kill()
    raise RuntimeError(f"codec-serve did not start: {proc.stderr.read()[-2000:]}")


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # a Ray server's daemons too
        return -9


# ---- the bound: the fixed graphs --------------------------------------------------------------
def fixed_bound(spec, folder: Path, seconds: float, seed: int, provider: str) -> dict:
    """Streams the fixed full-clip graphs could sustain for a stream's work: 1 / real-time factor
    of encoding and decoding a clip of their length (decoding only, for a decoder-only stream)."""
    codec = open_folder(folder, provider)
    rng = np.random.default_rng(seed)
    n = int(seconds * codec.sample_rate)
    clip = (0.1 * rng.standard_normal((1, n))).astype(np.float32)
    codes = codec.encode(clip, codec.sample_rate)
    work = (lambda: codec.decode(codec.encode(clip, codec.sample_rate))) if duplex_of(spec) \
        else (lambda: codec.decode(codes, **({"noise": 0} if getattr(codec, "draws_noise", False) else {})))
    work()  # warm-up
    times = []
    for _ in range(3):
        t = time.perf_counter()
        work()
        times.append(time.perf_counter() - t)
    rtf = float(np.median(times)) / seconds
    return {"rtf": rtf, "streams": 1 / rtf}


# ---- the command -------------------------------------------------------------------------------
def ensure_export(spec, preset: str, clip: float, seed: int, slots: int, base: Path) -> None:
    """The export in `base` (slot graphs of `slots` streams, none for 0), made once for its
    preset, fixed-graph length, seed and export code, and kept for the next run (`--dir`)."""
    key = {"codec": spec.name, "preset": preset, "len": clip, "seed": seed, "slots": slots,
           "codecport": __version__, "source": export_source_hash()}

    def make() -> None:
        click.echo(f"exporting {spec.label} {preset} (random weights)"
                   f"{f' with --slots {slots}' if slots else ''} ...")
        prepare(spec, preset, clip, 1, seed, base, **({"slots": slots} if slots else {}))

    stamped(base, key, make)


def bench_serve(spec, preset: str, slots: tuple[int, ...], precisions: tuple[str, ...], seconds: float,
                max_streams: int, soak: float, provider: str, seed: int, work: Path,
                clip: float = 2.0, engines: tuple[str, ...] = ("local",), abuse_seconds: float = 0.0) -> dict:
    """The whole run in `work`; `clip`: seconds per call of the fixed graphs, the bound's clip."""
    batched = sorted({b for b in slots if b > 1})
    bases = {}
    for b in batched or [0]:
        bases[b] = work / f"slots{b}"
        ensure_export(spec, preset, clip, seed, b, bases[b])
    folders = {}
    for b, base in bases.items():
        for p in precisions:
            folders[(b, p)] = base / "model" if p == "fp32" else build_folder(spec, base, p)
    configs = []
    for b in sorted(set(slots)):
        for p in precisions:
            folder = folders[(b if b > 1 else (batched[0] if batched else 0), p)]
            configs.extend(Config(b, p, folder, engine) for engine in engines)
    # SIGTERM (a killed bench) unwinds through the `finally` below, which stops the servers: they
    # are this process's children, and would outlive it otherwise.
    if threading.current_thread() is threading.main_thread():  # (only the main thread may)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    period = _period(configs[0].folder)
    report = {"codec": spec.name, "preset": preset, "provider": provider, "period_ms": 1000 * period,
              "trial_seconds": seconds, "cores": os.cpu_count(), "bound": {p: [] for p in precisions},
              "configs": {}}
    try:
        click.echo(f"starting {len(configs)} servers ...")
        # All at once: each opens its graphs and times each at its first calls (12 s for the
        # released Mimi's 32-slot server on this 2-core machine), mostly on one core.
        for cfg in configs:
            cfg.proc = start_server(cfg.folder, max_streams, cfg.slots > 1, provider, cfg.engine,
                                    None if abuse_seconds else RAMP_BACKLOG)  # abused: its own bounds
        for cfg in configs:
            cfg.url = server_url(cfg.proc)
        click.echo("warming up every server (sessions, the bank's measured costs) ...")
        for cfg in configs:
            trial(cfg.url, spec, min(4, max_streams), min(WARMUP_SECONDS, seconds), seed, period)

        if abuse_seconds:
            report["abuse"] = abuse.run(configs, abuse_seconds, period)
            return report

        def bound_round():
            for p in precisions:
                report["bound"][p].append(fixed_bound(spec, folders[(batched[0] if batched else 0, p)], clip,
                                                      seed, provider))

        bound_round()
        n = 1
        alive = list(configs)
        while alive and n <= max_streams:  # the ramp, in lockstep
            for cfg in alive:
                _run_trial(cfg, spec, n, seconds, seed, period)
            alive = [c for c in alive if c.failed is None]
            n *= 2
        bound_round()
        for _ in range(8):  # bisect, configurations taking turns
            open_ = [c for c in configs if c.failed is not None and c.failed - c.held > max(1, c.held // 8)]
            if not open_:
                break
            for cfg in open_:
                _run_trial(cfg, spec, (cfg.held + cfg.failed) // 2, seconds, seed, period)
        bound_round()
        for cfg in configs:
            report["configs"][cfg.name] = {"slots": cfg.slots, "precision": cfg.precision,
                                           "engine": cfg.engine, "held": cfg.held,
                                           "capped": cfg.failed is None, "trials": cfg.trials}
        if soak:
            # The local server's: the soak samples the RSS of the server's one process.
            best = max([c for c in configs if c.engine == "local"] or configs,
                       key=lambda c: (c.precision == "fp32", c.held, c.slots))
            load = max(1, best.held)
            click.echo(f"soak: {best.name} at {load} streams for {soak:g} min ...")
            result = asyncio.run(soak_run(best.url, best.proc.pid, spec, load, soak, seed + 10_000, period))
            result["check"] = check_streams(spec, best.folder, result.pop("checked"))
            result["config"] = best.name
            report["soak"] = result
    finally:
        for cfg in (c for c in configs if c.proc is not None):
            code = stop_server(cfg.proc)
            report["configs"].setdefault(cfg.name, {})["exit_code"] = code
    return report


def _period(folder: Path) -> float:
    """Seconds of a (coarse) code frame: a client's rhythm."""
    codec = open_folder(folder)
    return codec.frame_size * codec.strides[0] / codec.sample_rate


def _run_trial(cfg: Config, spec, n: int, seconds: float, seed: int, period: float) -> None:
    """One trial at N streams; one that fails runs again before it counts (this machine has slow
    spells of a second or two, which one p99 of a short trial catches)."""
    r = _costed(cfg, lambda: trial(cfg.url, spec, n, seconds, seed, period))
    if not r["held"]:
        again = _costed(cfg, lambda: trial(cfg.url, spec, n, seconds, seed + 1, period))
        r = {**again, "first_try": r} if again["held"] else {**r, "second_try": again}
    cfg.trials[n] = r
    lat = r["latency_ms"]
    click.echo(f"  {cfg.name:<12} {n:>3} streams: p50 {lat.get('p50', float('nan')):6.1f} ms  p99 "
               f"{lat.get('p99', float('nan')):6.1f} ms  errors {r['n_errors']}  -> "
               f"{'held' if r['held'] else 'not held'}")
    if r["held"]:
        cfg.held = max(cfg.held, n)
    else:
        cfg.failed = n if cfg.failed is None else min(cfg.failed, n)


def _costed(cfg: Config, run) -> dict:
    """`run()`'s trial report, with the server's CPU per frame sent and its resident memory after,
    by role (procs.py: one process for a local server; proxy, replica, driver and node on Ray)."""
    pids = procs.roles(cfg.proc.pid, cfg.engine)
    before = {role: procs.cpu_seconds(p) for role, p in pids.items()}
    r = run()
    frames = max(1, r["frames"])
    r["cpu_ms_per_frame"] = {role: 1000 * (procs.cpu_seconds(p) - before[role]) / frames
                             for role, p in pids.items()}
    r["rss_mb"] = {role: procs.rss_mb(p) for role, p in procs.roles(cfg.proc.pid, cfg.engine).items()}
    return r


def lines(report: dict) -> list[str]:
    """The table: streams held per configuration, latency at that load, ratios in this run (or,
    for --abuse, what the flooding client and the slow reader cost each)."""
    if "abuse" in report:
        return [f"{report['codec']} {report['preset']} on {report['provider']}, {report['cores']} cores",
                *abuse.lines(report["abuse"])]
    out = [(f"{report['codec']} {report['preset']} on {report['provider']}, {report['cores']} cores, frames "
            f"of {report['period_ms']:.0f} ms, {report['trial_seconds']:g} s a trial"),
           ("| config | streams held | p50 / p95 / p99 frame latency | time to first audio p50 "
            "| connect p50 | × B=1 | × local | × fixed bound |"),
           "|---|---|---|---|---|---|---|---|"]
    bounds = {p: float(np.median([b["streams"] for b in v])) for p, v in report["bound"].items()}
    nan = float("nan")
    configs = {name: c for name, c in report["configs"].items() if "held" in c}
    for name, c in configs.items():
        suffix = "" if c.get("engine", "local") == "local" else f" {c['engine']}"
        one = configs.get(f"B=1 {c['precision']}{suffix}", {}).get("held") or nan
        local = configs.get(f"B={c['slots']} {c['precision']}", {}).get("held") or nan
        t = c["trials"].get(c["held"], {})
        lat, ttfa, conn = t.get("latency_ms", {}), t.get("ttfa_ms", {}), t.get("connect_ms", {})
        held = f"{c['held']}{'+' if c['capped'] else ''}"
        bound = bounds[c["precision"]]
        out.append(f"| {name} | {held} | {lat.get('p50', nan):.1f} / {lat.get('p95', nan):.1f} / "
                   f"{lat.get('p99', nan):.1f} ms | {ttfa.get('p50', nan):.0f} ms | "
                   f"{conn.get('p50', nan):.1f} ms | {c['held'] / one:.2f} | {c['held'] / local:.2f} | "
                   f"{c['held'] / bound:.0%} |")
    out.append("frame latency p50 / p99 and time to first audio p50 at 1 and 4 streams:")
    for name, c in configs.items():
        at = [(n, c["trials"][n]) for n in (1, 4) if n in c["trials"]]
        out.append(f"  {name}: " + "; ".join(
            f"{n}: {t['latency_ms'].get('p50', nan):.1f} / {t['latency_ms'].get('p99', nan):.1f} ms, "
            f"{t['ttfa_ms'].get('p50', nan):.0f} ms" for n, t in at))
    out.append("server cost at each configuration's held load (CPU ms per frame sent; resident MiB after "
               "the trial), by process role:")
    for name, c in configs.items():
        t = c["trials"].get(c["held"]) or c["trials"].get(min(c["trials"], default=0), {})
        cpu, rss = t.get("cpu_ms_per_frame", {}), t.get("rss_mb", {})
        out.append(f"  {name} ({t.get('streams', 0)} streams): " + ", ".join(
            f"{role} {cpu[role]:.2f} ms, {rss.get(role, nan):.0f} MiB" for role in cpu))
    for p, v in report["bound"].items():
        rtfs = ", ".join(f"{b['rtf']:.3f}" for b in v)
        out.append(f"fixed-graph bound ({p}): {bounds[p]:.1f} streams (RTF {rtfs} at the start, middle "
                   "and end)")
    if "soak" in report:
        s = report["soak"]
        out.append(f"soak: {s['config']} at {s['streams']} streams for {s['minutes']:g} min; clients "
                   f"{s['clients']}; well-behaved failed: {s['n_good_failed']}; slots active after: "
                   f"{s['health_after'].get('slots')}; RSS {s['rss_mb'][1]:.0f} -> {s['rss_mb'][-1]:.0f} MB "
                   f"(drift {s['rss_drift_mb']:+.1f} MB); checked {s['check']}")
    return out


SERVABLE = [s.name for s in registry.codecs() if s.runtime.streams]


@click.command("serve", context_settings={"show_default": True})
@click.argument("codec", type=click.Choice(SERVABLE))
@click.option("--preset", default=None, help="Preset [default: the codec's].")
@click.option("--slots", "slots", multiple=True, type=click.IntRange(1, 256),
              help="Configurations (repeatable): 1 steps each stream on its own, B > 1 the batched graphs "
                   "of B streams a call [default: 1, 8 and 16; 1 for a codec without step graphs].")
@click.option("--precision", "precisions", multiple=True, type=click.Choice(PRECISIONS),
              default=["fp32", "int8"],
              help="Precisions (repeatable).")
@click.option("--seconds", type=Finite(min=0.2, max=3600), default=8.0, help="Seconds of each trial.")
@click.option("--len", "clip", type=Finite(min=0.1, max=600), default=2.0,
              help="Seconds per call of the fixed graphs, whose real-time factor gives the bound.")
@click.option("--max-streams", type=click.IntRange(1, 1024), default=64, help="The ramp's ceiling.")
@click.option("--soak", type=Finite(min=0, max=1440), default=0.0,
              help="Minutes of the soak at the best configuration's held load (0: none).")
@click.option("--abuse", "abuse_seconds", type=Finite(min=0, max=600), default=0.0,
              help="Instead of the ramp: a flooding client, then a slow reader, for up to this many seconds "
                   "each, on every configuration (the engines side by side), with each process's memory.")
@click.option("--provider", default="cpu", help="The servers' provider.")
@click.option("--engine", "engines", multiple=True, type=click.Choice(["local", "ray"]), default=["local"],
              help="codec-serve's engines (repeatable): ray is one replica on a private local Ray behind "
                   "Serve's proxy, beside the local server on the same folders and clients.")
@click.option("--seed", type=int, default=0)
@click.option("--dir", "work", type=click.Path(path_type=Path), default=None,
              help="Keep the exports here and reuse them [default: a temp folder].")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="Write the report.")
@guard
@unwinds_on_sigterm
def serve_cmd(codec, preset, slots, precisions, seconds, clip, max_streams, soak, abuse_seconds, provider,
              engines, seed, work, json_out):
    """Real-time streams `codec-serve` holds for CODEC, per --slots and --precision, on loopback."""
    spec = registry.get(codec)
    slots = slots or ((1, 8, 16) if spec.has_step_graphs else (1,))
    if not spec.has_step_graphs and any(b > 1 for b in slots):
        fail(f"--slots B > 1 steps B streams in one call of batched step graphs; {spec.label} has no step "
             "graphs (codec-serve runs its streams one by one): pass --slots 1", 2)
    try:
        import aiohttp  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        fail(f"codec-bench serve needs the [export] and [serve] extras ({e})", 1)
    if "ray" in engines:
        try:
            import ray.serve  # noqa: F401
        except ImportError as e:
            fail(f"codec-bench serve --engine ray needs the [ray] extra ({e})", 1)
    preset = preset_of(spec, preset, None)
    run_report(work, "codec-bench-serve-", lambda w: bench_serve(
        spec, preset, tuple(slots), tuple(precisions), seconds, max_streams, soak, provider, seed, w, clip,
        tuple(dict.fromkeys(engines)), abuse_seconds),
        lines, json_out)
