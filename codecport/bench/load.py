"""The load generator of `codec-bench serve`: real-time clients of `codec-serve` (the client in
serve/client.py), trials of N of them at once, and the soak with misbehaving clients mixed in."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import registry
from .procs import rss_mb

STAGGER = True  # clients start spread over one frame period: staggered traffic, not lockstep
KEEP = 12  # well-behaved soak streams checked against single streams afterwards


def open_folder(folder: Path, provider: str = "cpu"):
    """The codec of an export folder (what `codecport.load` does)."""
    return registry.codec_of_folder(folder).runtime(folder, provider)


def ms_percentiles(seconds: list[float]) -> dict:
    """p50/p95/p99 in milliseconds (none of an empty list)."""
    return {f"p{p}": 1000 * float(np.percentile(seconds, p)) for p in (50, 95, 99)} if seconds else {}


# ---- one client --------------------------------------------------------------------------------
@dataclass
class Stream:
    """What one client sent and got."""

    sent: list[float] = field(default_factory=list)  # send time of each frame
    arrivals: list[tuple[int, float]] = field(default_factory=list)  # (audio samples so far, time)
    codes: list = field(default_factory=list)  # codes pieces received (duplex)
    audio: list = field(default_factory=list)
    inputs: list = field(default_factory=list)  # what was sent, for the soak's check
    error: str | None = None
    warnings: int = 0
    lookahead: int = 0  # samples of stated latency
    frame: int = 0  # samples a frame
    seed: int = 0  # of its input
    noise: int | None = None  # the seed of its decoder's noise (the ready reply's), if it draws any
    window_step: int = 0  # frames between windows' starts, for output that comes in windows; else 0
    connect_s: float | None = None  # from the connection's start to the ready reply

    def latencies(self, skip: int = 0) -> list[float]:
        """Seconds from sending each frame to the arrival of the audio it made final: for steps,
        its audio up to the stated latency before it; for windows (`window_step`), when it is
        the last frame of a window, that window's audio up to its overlap (the frames between
        windows make nothing final: waiting for the rest of a window is not the server's delay)."""
        out, j = [], 0
        ahead = self.lookahead // self.frame if self.window_step else 0
        for i, t in enumerate(self.sent):
            if self.window_step:
                if (i - ahead) % self.window_step or i < ahead:
                    continue
                target = (i - ahead + self.window_step) * self.frame
            else:
                target = (i + 1) * self.frame - self.lookahead
            if target <= 0 or i < skip:
                continue
            while j < len(self.arrivals) and self.arrivals[j][0] < target:
                j += 1
            if j == len(self.arrivals):
                break
            out.append(self.arrivals[j][1] - t)
        return out


def duplex_of(spec) -> bool:
    """A codec that streams both ways is benched as duplex clients; one that streams its decoder
    only as a TTS model's (codes in, audio out)."""
    return "encoder" in spec.runtime.streams


async def run_client(url: str, spec, frames: int, seed: int, session, delay: float = 0.0,
                     misbehave: str | None = None, keep: bool = False) -> Stream:
    """One real-time stream of `frames` frames. `misbehave`: "disconnect" (leaves mid-stream
    without a word), "garbage" (sends bytes that are no message), "slow" (never reads)."""
    from ..serve.client import ServeError, connect

    out = Stream(seed=seed)
    rng = np.random.default_rng(seed)
    await asyncio.sleep(delay)
    duplex = duplex_of(spec)
    t0 = time.perf_counter()
    try:
        c = await connect(url, "duplex" if duplex else "decode", session=session)
    except ServeError as e:
        out.error = f"{e.code}: {e}"
        return out
    out.connect_s = time.perf_counter() - t0
    info = c.info
    out.noise = info.get("noise")  # the seed of a decoder that draws noise, which the server chose
    group = info.get("group_frames", 1)
    frames = -(-frames // group) * group  # a decoder takes whole groups of coarse frames
    period_samples = info["coarse_frame_samples"]
    out.frame = period_samples
    out.lookahead = sum(v["samples"] for v in info["latency"].values())
    windowed = [side for side, runs in info.get("runs", {}).items() if runs == "windows"]
    if windowed:
        out.window_step = info["step_frames"][windowed[0]]
    period = period_samples / info["sample_rate"]
    layout = [tuple(x) for x in info["code_layout"]]
    loop = asyncio.get_running_loop()

    async def send():
        t0 = loop.time()
        for i in range(frames):
            await asyncio.sleep(max(0.0, t0 + i * period - loop.time()))
            if misbehave == "disconnect" and i == frames // 2:
                await c.ws.close()
                return
            if misbehave == "garbage" and i == frames // 2:
                await c.send_raw(b"\x00ga")  # three bytes: whole samples of no PCM format, codes of no layout
                return
            if duplex:
                x = (0.1 * rng.standard_normal(period_samples)).astype(np.float32)
                out.sent.append(await c.send_pcm(x))
            else:
                x = [rng.integers(0, info["codebook_size"], (rows, per)) for rows, per in layout]
                out.sent.append(await c.send_codes(x))
            if keep:
                out.inputs.append(x)
        await c.end()

    async def receive():
        total = 0
        while True:
            piece = await c.receive(timeout=120)
            if piece is None:
                break
            if piece.kind == "audio":
                total += len(piece.data)
                out.arrivals.append((total, piece.t))
                if keep:
                    out.audio.append(piece.data)
            elif keep:
                out.codes.append(piece.data)

    try:
        if misbehave == "slow":
            await send()
            await asyncio.sleep(2 * period)
        elif misbehave in ("disconnect", "garbage"):
            sender = asyncio.ensure_future(send())
            with contextlib.suppress(Exception):
                await asyncio.wait_for(receive(), timeout=frames * period + 30)
            await sender
        else:
            await asyncio.gather(send(), receive())
    except ServeError as e:
        out.error = f"{e.code}: {e}"
    except (asyncio.TimeoutError, ConnectionError, OSError) as e:
        out.error = f"{type(e).__name__}: {e}"
    finally:
        out.warnings = len(c.warnings)
        await c.close()
    return out


async def _trial(url: str, spec, n: int, seconds: float, seed: int, period: float) -> list[Stream]:
    import aiohttp

    frames = max(2, round(seconds / period))
    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(
            run_client(url, spec, frames, seed + i, session, delay=(i / n) * period if STAGGER else 0.0)
            for i in range(n))))


def trial(url: str, spec, n: int, seconds: float, seed: int, period: float) -> dict:
    """N real-time streams at once for `seconds`: their frame latency, time to first audio, and
    whether they were held (p99 under what the client plays meanwhile, none failed, all output
    complete). What it plays meanwhile is a frame period for streams whose output comes a step
    at a time; for output that comes in windows, the audio of the window before: `window_step`
    periods (a window decoded within that never leaves a gap in the playback)."""
    streams = asyncio.run(_trial(url, spec, n, seconds, seed, period))
    # The first half second (connecting, warming up), or a quarter of a shorter trial.
    skip = max(1, min(round(0.5 / period), round(seconds / period) // 4))
    lat = [x for s in streams for x in s.latencies(skip)]
    errors = [s.error for s in streams if s.error]
    complete = all(s.arrivals and s.arrivals[-1][0] >= len(s.sent) * s.frame - 1
                   for s in streams if not s.error)
    ttfa = [s.arrivals[0][1] - s.sent[0] for s in streams if s.arrivals and s.sent]
    report = {"streams": n, "frames": sum(len(s.sent) for s in streams), "errors": errors[:3],
              "n_errors": len(errors), "warnings": sum(s.warnings for s in streams),
              "latency_ms": ms_percentiles(lat), "ttfa_ms": ms_percentiles(ttfa),
              "connect_ms": ms_percentiles([s.connect_s for s in streams if s.connect_s is not None])}
    budget = period * max(1, streams[0].window_step)
    report["budget_ms"] = 1000 * budget
    report["held"] = bool(lat) and not errors and complete and report["latency_ms"]["p99"] < 1000 * budget
    return report


# ---- the soak ----------------------------------------------------------------------------------
async def soak_run(url: str, pid: int, spec, n: int, minutes: float, seed: int, period: float) -> dict:
    """N lanes of clients of 2 to 12 s (none longer than the soak), one after another in each,
    for `minutes`: mostly well-behaved ones (a dozen kept for `check_streams`), some that
    disconnect mid-stream, send garbage, or never read; the server's RSS sampled as it goes and
    its /health read at the end."""
    import aiohttp

    deadline = time.monotonic() + 60 * minutes
    rng = np.random.default_rng(seed)
    kept: list[Stream] = []
    counts = {"good": 0, "disconnect": 0, "garbage": 0, "slow": 0}
    rss = [rss_mb([pid])]
    bad_ends = []

    async def lane(k: int):
        nonlocal seed
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                kind = rng.choice(["good", "disconnect", "garbage", "slow"], p=[0.7, 0.1, 0.1, 0.1])
                counts[kind] += 1
                seed += 1
                # (a soak shorter than a client would otherwise end long after its time)
                longest = min(12.0, 60 * minutes)
                shortest = round(min(2.0, longest / 2) / period)
                frames = int(rng.integers(max(1, shortest), max(2, shortest + 1, round(longest / period))))
                s = await run_client(url, spec, frames, seed, session, delay=float(rng.uniform(0, period)),
                                     misbehave=None if kind == "good" else kind, keep=kind == "good")
                if kind == "good":
                    good = counts["good"]
                    if s.error:
                        bad_ends.append(s.error)
                    elif len(kept) < KEEP:  # a uniform sample of the whole soak (reservoir)
                        kept.append(s)
                    elif (j := int(rng.integers(0, good))) < KEEP:
                        kept[j] = s

    async def sample_rss():
        while time.monotonic() < deadline:
            await asyncio.sleep(min(30.0, 6 * minutes))
            rss.append(rss_mb([pid]))

    await asyncio.gather(sample_rss(), *(lane(k) for k in range(n)))
    await asyncio.sleep(1.0)
    async with aiohttp.ClientSession() as session, session.get(url + "/health") as r:
        health = await r.json()
    rss.append(rss_mb([pid]))
    return {"streams": n, "minutes": minutes, "clients": counts, "good_failed": bad_ends[:5],
            "n_good_failed": len(bad_ends), "health_after": health, "rss_mb": rss,
            "rss_drift_mb": rss[-1] - rss[1] if len(rss) > 2 else float("nan"), "checked": kept}


def check_streams(spec, folder: Path, streams: list[Stream]) -> dict:
    """Each kept well-behaved stream against one stream of the runtime alone, same input."""
    codec = open_folder(folder)
    exact, max_err = (0 if duplex_of(spec) else None), 0.0
    for s in streams:
        if duplex_of(spec):
            enc, dec = codec.encoder_stream(), codec.decoder_stream()
            codes = np.concatenate([*(enc.push(x) for x in s.inputs), enc.flush()], axis=1)
            got_codes = np.concatenate([p[0] for p in s.codes], axis=1) if s.codes else codes[:, :0]
            exact += int(np.array_equal(got_codes, codes))
            want = np.concatenate([dec.push(codes), dec.flush()])
        else:
            dec = codec.decoder_stream(**({"noise": s.noise} if s.noise is not None else {}))
            want = np.concatenate([*(dec.push(list(x)) for x in s.inputs), dec.flush()])
        got = np.concatenate(s.audio) if s.audio else np.zeros(0, np.float32)
        if got.shape != want.shape:
            max_err = float("inf")
        else:
            max_err = max(max_err, float(np.abs(got - want).max()) if len(want) else 0.0)
    return {"checked": len(streams), "codes_exact": exact, "audio_max_abs_err": max_err}


