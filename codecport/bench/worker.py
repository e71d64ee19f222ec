"""One contender of codec-bench, run in its own process so timings and peak RSS are its own.

    python -m codecport.bench.worker '<json job>'   -> prints one JSON line

Job keys: contender (onnx | torch | transformers | memory, or one of the codec's own: see its
`codecs/<codec>/facts.py`), codec (a registered name), dir (the bench folder: `model/` graphs,
`weights.safetensors`, `config.json`), seconds, runs, provider, steps and frames (streaming steps
timed, code frames a step), long (windows of long audio through the chunked graphs; 0 for none).
A contender that finds itself unable to run prints `{"skipped": reason}`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .. import registry
from ..errors import CodecportError
from .facts import facts_of
from .measure import (
    WARMUP_STEPS,
    children_peak_rss_mb,
    clip,
    flat_codes,
    node_times,
    peak_rss_mb,
    percentiles,
    summary,
    timed,
    timings,
)


def run_onnx(job: dict) -> dict:
    """Our graphs through the public API: one fixed call each way, then the long-audio mode
    (windows, when the codec has them) and the streams (when it has those)."""
    from ..runtime.codes import Codes

    folder, runs = Path(job["dir"]) / job.get("model", "model"), job["runs"]
    spec = registry.get(job["codec"])
    codec, facts = spec.runtime(folder, job["provider"]), facts_of(spec)
    sr, mode = codec.input_rate, facts.fixed_mode  # the rate its encoder takes: no resampling timed
    x = clip(codec.graph("encoder").int("samples"))
    # bare: no resampling or loudness on the way back
    first, enc = timed(lambda: codec.encode(x, sr, mode=mode), runs)
    codes = Codes(first.arrays)
    dec = timings(lambda: codec.decode(codes, mode=mode), runs)
    out = {}
    if facts.long and job.get("long"):
        out = _long(codec, facts.long, job)
    if codec.stepped:
        out["streaming"] = stream_bench(codec, job["steps"])
    if facts.parts:  # one profile a graph, for the parts in it
        out["parts"] = {}
        for g in sorted({g for g, _ in facts.parts.values()}):
            mine = {label: prefix for label, (graph, prefix) in facts.parts.items() if graph == g}
            out["parts"].update({label: {"graph": g, **t} for label, t in node_times(folder / f"{g}.onnx",
                                                                                      mine).items()})
    return {**out, "encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "provider": codec.provider, "codes": flat_codes(codes.arrays).tolist()}


def _long(codec, long, job: dict) -> dict:
    """Long audio of `long` windows, as `codec-run` runs it (the codec's long-audio mode)."""
    from ..runtime.codes import Codes

    manifest = json.loads((codec.dir / "manifest.json").read_text())
    n = long.samples(manifest, job["long"])
    x, sr = clip(n), codec.input_rate
    first, enc = timed(lambda: codec.encode(x, sr, mode=long.mode), job["runs"])
    codes = Codes(first.arrays)
    dec = timings(lambda: codec.decode(codes, mode=long.mode), job["runs"])
    seconds = n / sr
    return {"encode-long": summary(enc, seconds), "decode-long": summary(dec, seconds),
            "windows_at_once": codec.parallel}


def stream_bench(codec, steps: int) -> dict:
    """Latency of the codec's streams, a step of its step graphs pushed at a time, as a live
    server pushes them: PCM through the encoder stream and its codes through the decoder stream
    when it has both, else random codes through the decoder stream."""
    dec = codec.decoder_stream() if "decoder" in codec.streams else None
    if "encoder" in codec.streams:
        enc = codec.encoder_stream()
        out = stream_steps(enc, dec, enc.step_frames, enc.step_frames * codec.frame_size, codec.sample_rate,
                           steps)
    else:
        lat, pushes = [], decoder_pushes(codec, dec.step_frames, steps + WARMUP_STEPS)
        for i, codes in enumerate(pushes):
            t0 = time.perf_counter()
            dec.push(codes)
            if i >= WARMUP_STEPS:
                lat.append(time.perf_counter() - t0)
        # Time to first audio: a new stream's first push (the sessions warm by now), the median
        # of a few new streams (the first after the loop above sometimes pays a one-off stall).
        first = []
        for _ in range(WARMUP_STEPS):
            fresh = codec.decoder_stream()
            t0 = time.perf_counter()
            fresh.push(pushes[0])
            first.append(time.perf_counter() - t0)
        frame = codec.strides[0] * codec.frame_size
        out = {"decode_step": percentiles(lat), "steps": steps, "frames_per_step": dec.step_frames,
               "frame_ms": 1000 * frame / codec.sample_rate, "first_audio_ms": 1e3 * float(np.median(first))}
    out["latency_frames"] = (dec or enc).latency.frames
    return out


def decoder_pushes(codec, step_frames: int, n: int) -> list[list[np.ndarray]]:
    """`n` pushes of random codes, `step_frames` code frames (of the coarsest scale) each, one
    `[codebooks, frames]` array per time scale (the official contenders stream the same)."""
    rng = np.random.default_rng(0)
    k = codec.codebooks(None) // codec.levels
    per = [step_frames * codec.strides[0] // s for s in codec.strides]  # codes of each scale a push
    return [[rng.integers(0, codec.codebook_size, (k, f)) for f in per] for _ in range(n)]


def stream_steps(encoder, decoder, frames: int, samples: int, rate: int, steps: int) -> dict:
    """Latency of one streaming step (`frames` code frames, `samples` samples at `rate`), encode
    and decode separately: `encoder.push(pcm)` gives codes, `decoder.push(codes)` audio."""
    x = clip(samples * (steps + WARMUP_STEPS))[0]
    enc, dec = [], []
    for i in range(steps + WARMUP_STEPS):
        t0 = time.perf_counter()
        codes = encoder.push(x[i * samples:(i + 1) * samples])
        t1 = time.perf_counter()
        if decoder is not None:
            decoder.push(codes)
        t2 = time.perf_counter()
        if i >= WARMUP_STEPS:
            enc.append(t1 - t0)
            dec.append(t2 - t1)
    return {"encode_step": percentiles(enc),
            **({"decode_step": percentiles(dec)} if decoder is not None else {}),
            "steps": steps, "frames_per_step": frames, "frame_ms": 1000 * samples / frames / rate}


def _torch_model(spec, job: dict):
    """Our torch reference with the bench's weights."""
    from safetensors.torch import load_file

    from ..models.checkpoint import load_state

    conf = json.loads((Path(job["dir"]) / "config.json").read_text())
    model = spec.module("model").MODEL(spec.module("config").CONFIG.from_kwargs(conf))
    load_state(model, load_file(Path(job["dir"]) / "weights.safetensors"), "bench weights")
    return model.eval()


def run_torch(job: dict) -> dict:
    import torch

    spec = registry.get(job["codec"])
    facts, model, runs = facts_of(spec), _torch_model(spec, job), job["runs"]
    meta = json.loads((Path(job["dir"]) / "model" / "manifest.json").read_text())
    geo = meta["geometry"]  # the clip the ONNX contender encodes: at the encoder's rate
    x = torch.from_numpy(clip(int(geo.get("input_samples", geo["samples"]))))[:, None]
    k = spec.runtime.default_codebooks  # as the ONNX contender: all (DAC), Moshi's 8 (Mimi)
    k = None if k is None else min(k, model.cfg.n_codebooks)
    with torch.inference_mode():
        codes, enc = timed(lambda: facts.torch_encode(model, x, k), runs)
        dec = timings(lambda: model.decode(codes), runs)
        out = facts.torch_long(model, job, meta) if facts.long and job.get("long") else {}
        arrays = facts.torch_codes(model, x, k)
    return {**out, "encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "threads": torch.get_num_threads(), "codes": flat_codes(arrays).tolist()}


def run_transformers(job: dict) -> dict:
    """transformers' own port, built from the same config with its own random init: the
    compute does not depend on the weights' values."""
    import torch
    import transformers

    conf = json.loads((Path(job["dir"]) / "config.json").read_text())
    meta = json.loads((Path(job["dir"]) / "model" / "manifest.json").read_text())
    x = torch.from_numpy(clip(int(meta["geometry"]["samples"])))[:, None]
    encode, decode = facts_of(registry.get(job["codec"])).transformers_model(conf)
    with torch.inference_mode():
        codes, enc = timed(lambda: encode(x), job["runs"])
        dec = timings(lambda: decode(codes), job["runs"])
    return {"encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "version": transformers.__version__}


def run_memory(job: dict) -> dict:
    """`codec-run decode` of random codes in the codec's own file, or `codec-run encode` of a
    44.1 kHz stereo WAV (`direction`), `minutes` long, in a process of its own: its peak RSS is
    the command's."""
    import soundfile as sf

    from ..runtime.codes import Codes

    folder, out = Path(job["dir"]), Path(job["dir"]) / "memory"
    out.mkdir(exist_ok=True)
    spec = registry.get(job["codec"])
    if job.get("direction") == "encode":
        wav, rate = out / "input.wav", 44100
        with sf.SoundFile(wav, "w", rate, 2, format="RF64", subtype="FLOAT") as f:
            left = round(job["minutes"] * 60 * rate)
            while left > 0:  # a second at a time: the input is never held whole, here either
                n = min(left, rate)
                f.write(np.tile(clip(n)[0][:, None], (1, 2)))
                left -= n
        written = out / f"codes{spec.suffixes[-1]}"
        args = ["encode", str(wav), "-m", str(folder / "model"), "-o", str(written)]
    else:
        # Codes in the codec's own file (DAC: .dac) as encode writes them for long audio, so that
        # the original length, rate and loudness are restored on the way out as they would be.
        codec, long = spec.runtime(folder / "model"), facts_of(spec).long
        rate = codec.sample_rate
        n = round(job["minutes"] * 60 * rate)
        mode = long.mode if long else None
        coarse, rng = codec.expected_frames(n, mode), np.random.default_rng(0)
        k = codec.codebooks(None) // codec.levels
        codes = tuple(rng.integers(0, codec.codebook_size, (1, k, coarse * codec.strides[0] // s))
                      for s in codec.strides)
        fields = {"mode": mode, "chunk_frames": codec.chunk_frames() if mode == "chunked" else None,
                  "loudness_db": -20.0 if codec.restores_loudness else None}
        source = out / f"codes{spec.suffixes[-1]}"
        Codes(codes, codec=spec.name, sample_rate=rate, num_samples=n, **fields).save(source)
        del codes, codec
        written = out / "decoded.wav"
        args = ["decode", str(source), "-m", str(folder / "model"), "-o", str(written)]
    t0 = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).parent / "codec-run"), *args], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise CodecportError(f"codec-run {args[0]} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return {"minutes": job["minutes"], "direction": job.get("direction", "decode"),
            "seconds": time.perf_counter() - t0, "output_mb": written.stat().st_size / 2 ** 20,
            "from": Path(args[1]).suffix, "peak_rss_mb": children_peak_rss_mb()}


def main() -> None:
    job = json.loads(sys.argv[1])
    runs = {"onnx": run_onnx, "torch": run_torch, "transformers": run_transformers, "memory": run_memory,
            **facts_of(registry.get(job["codec"])).contenders}
    result = runs[job["contender"]](job)
    result.setdefault("peak_rss_mb", peak_rss_mb())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
