"""How a build's graphs are run, fed and measured: through the runtime, as users run them.

The same clips go through the fp32 export folder and the build's folder; `deviation` compares
what comes out, graph by graph. `record_feeds` captures the real inputs each graph receives (step
state included) for calibration and range probes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runtime.folder import ladder_name

# Calibration feeds kept per graph (see record_feeds).
MAX_FEEDS = 64


@dataclass
class Probe:
    """How the build machinery runs a codec's graphs (from its exporter's `probe(manifest)`).

    `open(dir)` builds the runtime codec for an export folder. `encode(codec, name, clip)` gives
    codes for a clip `[1, N]` at the model rate through encoder graph `name` (the clip cut to
    what that graph's path takes); `decode(codec, name, codes)` gives audio through decoder
    graph `name`. `pairs` maps each encoder to the decoder its codes go back through (or to
    several, as a tuple: a codec with two decoders for one encoder's codes).
    `clip_samples` is a clip length that reaches every graph (chunked/step ones included), and
    `specs` the graphs' GraphSpecs, for the .mlpackage conversion.
    """

    open: Callable[..., object]  # (dir, options=None) -> the runtime `Codec`
    encode: Callable[[object, str, np.ndarray], np.ndarray]
    decode: Callable[[object, str, np.ndarray], np.ndarray]
    pairs: dict[str, str | tuple[str, ...]]
    sample_rate: int
    clip_samples: int
    specs: dict

    def decoders(self, encoder: str) -> tuple[str, ...]:
        d = self.pairs[encoder]
        return (d,) if isinstance(d, str) else d


def exercise(probe: Probe, codec, clip: np.ndarray,
             codes: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Every graph of `codec` run once on `clip`: encoder name -> codes, decoder name -> audio.

    Decoders decode `codes[their encoder]` when given (the fp32 folder's codes, so both folders
    decode the same codes), else this codec's own codes.
    """
    out = {}
    for enc in probe.pairs:
        if enc in codec.present:
            out[enc] = probe.encode(codec, enc, clip)
        src = (codes or out).get(enc)
        for dec in probe.decoders(enc):
            if dec in codec.present and src is not None:
                out[dec] = probe.decode(codec, dec, src)
    return out


def generated_clips(n: int, samples: int, sample_rate: int, seed: int) -> list[np.ndarray]:
    """Speech/music-like test audio `[1, samples]`: harmonic tones with a moving pitch, an
    amplitude envelope and a little noise; deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / sample_rate
    clips = []
    for _ in range(n):
        f0 = rng.uniform(90, 300) * (1 + 0.2 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t))
        phase = 2 * np.pi * np.cumsum(f0) / sample_rate
        tone = sum(np.sin(h * phase) / h for h in range(1, 6))
        env = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * t + rng.uniform(0, 6))
        x = 0.25 * env * tone + 0.02 * rng.standard_normal(samples)
        clips.append((x / max(1.0, np.abs(x).max()))[None].astype(np.float32))
    return clips


def calibration_clips(paths: list[Path] | None, probe: Probe, seed: int = 100) -> list[np.ndarray]:
    """The user's calibration audio (any format soundfile reads, resampled, mono) cut to the
    clip length, or generated clips when none is given."""
    if not paths:
        return generated_clips(4, probe.clip_samples, probe.sample_rate, seed)
    from ..runtime.audio import read_audio, resample

    clips = []
    for p in paths:
        audio, sr = read_audio(Path(p))
        x = resample(audio, sr, probe.sample_rate).mean(axis=0, keepdims=True)
        for i in range(0, max(1, x.shape[1] - probe.clip_samples + 1), probe.clip_samples):
            piece = x[:, i:i + probe.clip_samples]
            clips.append(np.pad(piece, ((0, 0), (0, probe.clip_samples - piece.shape[1]))))
    return clips[:16]  # calibration cost grows with it; 16 clips cover the ranges


def record_feeds(codec, probe: Probe, clips: list[np.ndarray],
                 keep: int = MAX_FEEDS) -> dict[str, list[dict]]:
    """The inputs each graph of `codec` receives while `exercise` runs on `clips`: the real
    feeds, state included for step graphs, for calibration and range measurement. At most `keep`
    per graph, a uniform sample (reservoir): a step graph's feeds carry megabytes of state each."""
    feeds: dict[str, list[dict]] = {}
    seen: dict[str, int] = {}
    rng = np.random.default_rng(0)
    for name in codec.present:
        graph = codec.graph(name)
        sess_run = graph.session.run

        def recording(outputs, feed, *args, _name=name, _run=sess_run, **kwargs):
            n = seen[_name] = seen.get(_name, 0) + 1
            kept = feeds.setdefault(_name, [])
            if len(kept) < keep:
                kept.append({k: np.array(v) for k, v in feed.items()})
            elif (slot := int(rng.integers(0, n))) < keep:
                kept[slot] = {k: np.array(v) for k, v in feed.items()}
            return _run(outputs, feed, *args, **kwargs)

        graph.session.run = recording
    try:
        for clip in clips:
            exercise(probe, codec, clip)
    finally:
        for name in codec.present:
            del codec.graph(name).session.run
    return feeds


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((got.astype(np.float64) - ref) ** 2))
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    if noise == 0.0:
        return float("inf")
    return 10 * np.log10(max(signal, 1e-30) / noise)


def figures(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """SNR (dB, rounded) and max abs error of `got` against `ref`."""
    return {"snr_db": round(snr_db(ref, got), 2),
            "max_abs_err": float(np.max(np.abs(got.astype(np.float64) - ref)))}


def deviation(ref_dir: Path, build_dir: Path, probe: Probe, clips: list[np.ndarray]) -> dict[str, dict]:
    """Per graph: code agreement (encoders), SNR and max abs error of decoded audio vs fp32.

    An encoder's audio figures decode its codes with the fp32 decoder, so they show what the
    build's encoder alone costs; a decoder decodes the fp32 codes.
    """
    ref, var = probe.open(ref_dir), probe.open(build_dir)
    acc: dict[str, dict[str, list]] = {}
    for clip in clips:
        want = exercise(probe, ref, clip)
        got = exercise(probe, var, clip, codes=want)
        for enc in probe.pairs:
            decs = probe.decoders(enc)
            if enc in got:
                a = acc.setdefault(enc, {"agree": [], "first": [], "ref": [], "got": []})
                a["agree"].append((got[enc] == want[enc]).ravel())
                a["first"].append((got[enc][:, 0] == want[enc][:, 0]).ravel())
                if decs[0] in want:  # the encoder's audio through the first decoder
                    a["ref"].append(want[decs[0]].ravel())
                    a["got"].append(probe.decode(ref, decs[0], got[enc]).ravel())
            for dec in decs:
                if dec in got:
                    a = acc.setdefault(dec, {"agree": [], "first": [], "ref": [], "got": []})
                    a["ref"].append(want[dec].ravel())
                    a["got"].append(got[dec].ravel())
    out = {}
    for name, a in acc.items():
        d = {}
        if a["agree"]:
            d["code_agreement_pct"] = round(100 * float(np.mean(np.concatenate(a["agree"]))), 3)
            d["first_codebook_agreement_pct"] = round(100 * float(np.mean(np.concatenate(a["first"]))), 3)
        if a["ref"]:
            d.update(figures(np.concatenate(a["ref"]), np.concatenate(a["got"])))
        out[name] = d
    return out


def slot_deviation(ref_dir: Path, build_dir: Path, probe: Probe, clips: list[np.ndarray],
                   slot_feeds: Callable[[str, dict[str, list[dict]]], list[dict] | None]) -> dict[str, dict]:
    """Each `<side>_slots` graph (and its ladder) of the build against the fp32 one, call by call. The streams
    `exercise` runs through the one-stream step graphs give the feeds (state included, from
    fp32), `slot_feeds(name, recorded)` stacks them B streams a call, one graph at a time (the
    feeds of a whole ladder at once would hold every stream's state many times over), and both
    folders' slot graphs run the same
    calls: the first output's SNR and max abs error (the latent or audio), or its agreement
    (codes in the graph). One call each, not a stream: the state is fp32's every time."""
    ref = probe.open(ref_dir, options={"io_binding": "0", "parallel": "1"})
    names = [n for n in ref.present if n.endswith("_slots")]
    names += [ladder_name(n, b) for n in names for b in ref.ladders.get(n, [])]
    if not names:
        return {}
    var = probe.open(build_dir, options={"io_binding": "0", "parallel": "1"})
    recorded = record_feeds(ref, probe, clips)
    out = {}
    for name in names:
        feeds = slot_feeds(name, recorded) or []
        want = [ref.graph(name).session.run(None, f)[0] for f in feeds]
        got = [var.graph(name).session.run(None, f)[0] for f in feeds]
        if not want:
            continue
        r, g = np.concatenate([w.ravel() for w in want]), np.concatenate([x.ravel() for x in got])
        d: dict = {"calls": len(want), "measured": "one call at a time on the fp32 streams' feeds"}
        if np.issubdtype(r.dtype, np.integer):
            d["code_agreement_pct"] = round(100 * float(np.mean(r == g)), 3)
        else:
            d.update(figures(r, g))
        out[name] = d
    return out
