"""One contender of codec-bench, run in its own process so timings and peak RSS are its own.

    python -m codecport.bench.worker '<json job>'   -> prints one JSON line

Job keys: contender (onnx | torch | transformers | memory, or one of the codec's own: see its
`bench/<codec>.py`), codec (a registered name), dir (the bench folder: `model/` graphs,
`weights.safetensors`, `config.json`), seconds, runs, provider, steps and frames (streaming steps
timed, code frames a step), long (windows of long audio through the chunked graphs; 0 for none).
A contender that finds itself unable to run prints `{"skipped": reason}`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from .. import registry
from .measure import clip, flat_codes, peak_rss_mb, percentiles, summary, timings


def run_onnx(job: dict) -> dict:
    """Our graphs through the public API: one fixed call each way, then the long-audio mode
    (windows, when the codec has them) and the streaming steps (when it has those)."""
    from .. import load
    from ..runtime.codes import Codes

    folder, runs = Path(job["dir"]) / job.get("model", "model"), job["runs"]
    codec, hooks = load(folder, job["provider"]), registry.get(job["codec"]).module("bench")
    sr, mode = codec.sample_rate, hooks.MODE
    x = clip(codec.graph("encoder").int("samples"))
    codes = Codes(codec.encode(x, sr, mode=mode).arrays)  # bare: no resampling or loudness on the way back
    enc = timings(lambda: codec.encode(x, sr, mode=mode), runs)
    dec = timings(lambda: codec.decode(codes, mode=mode), runs)
    out = {}
    if hooks.LONG and job.get("long"):
        out = _long(codec, hooks, job)
    if (streaming := hooks.stream_bench(codec, job)) is not None:
        out["streaming"] = streaming
    return {**out, "encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "provider": codec.provider, "codes": flat_codes(codes.arrays).tolist()}


def _long(codec, hooks, job: dict) -> dict:
    """Long audio of `long` windows, as `codec-run` runs it (the codec's `LONG_MODE`)."""
    from ..runtime.codes import Codes

    manifest = json.loads((codec.dir / "manifest.json").read_text())
    n, mode = hooks.long_samples(manifest, job["long"]), hooks.LONG_MODE
    x, sr = clip(n), codec.sample_rate
    codes = Codes(codec.encode(x, sr, mode=mode).arrays)
    enc = timings(lambda: codec.encode(x, sr, mode=mode), job["runs"])
    dec = timings(lambda: codec.decode(codes, mode=mode), job["runs"])
    seconds = n / sr
    return {"encode-long": summary(enc, seconds), "decode-long": summary(dec, seconds),
            "windows_at_once": codec.windows}


def stream_steps(stream, frames: int, samples: int, rate: int, steps: int) -> dict:
    """Latency of one streaming step (`frames` code frames, `samples` samples at `rate`), encode
    and decode separately."""
    x = clip(samples * (steps + 5))[0]
    enc, dec = [], []
    for i in range(steps + 5):
        t0 = time.perf_counter()
        codes = stream.encode_step(x[i * samples:(i + 1) * samples])
        t1 = time.perf_counter()
        stream.decode_step(codes)
        t2 = time.perf_counter()
        if i >= 5:  # the first steps warm the sessions up
            enc.append(t1 - t0)
            dec.append(t2 - t1)
    return {"encode_step": percentiles(enc), "decode_step": percentiles(dec), "steps": steps,
            "frames_per_step": frames, "frame_ms": 1000 * samples / frames / rate}


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
    hooks, model, runs = spec.module("bench"), _torch_model(spec, job), job["runs"]
    meta = json.loads((Path(job["dir"]) / "model" / "manifest.json").read_text())
    x = torch.from_numpy(clip(int(meta["geometry"]["samples"])))[:, None]
    k = spec.runtime.default_codebooks  # as the ONNX contender: all (DAC), Moshi's 8 (Mimi)
    k = None if k is None else min(k, model.cfg.n_codebooks)
    with torch.inference_mode():
        codes = hooks.torch_encode(model, x, k)
        enc = timings(lambda: hooks.torch_encode(model, x, k), runs)
        dec = timings(lambda: model.decode(codes), runs)
        out = hooks.torch_long(model, job, meta) if hooks.LONG and job.get("long") else {}
        arrays = hooks.torch_codes(model, x, k)
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
    encode, decode = registry.get(job["codec"]).module("bench").transformers_model(conf)
    with torch.inference_mode():
        codes = encode(x)
        enc = timings(lambda: encode(x), job["runs"])
        dec = timings(lambda: decode(codes), job["runs"])
    return {"encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "version": transformers.__version__}


def run_memory(job: dict) -> dict:
    """`codec-run decode` of random codes in the codec's own file, or `codec-run encode` of a
    44.1 kHz stereo WAV (`direction`), `minutes` long, in this process: its peak RSS is the
    command's."""
    import soundfile as sf

    from ..cli import run_cli

    folder, out = Path(job["dir"]), Path(job["dir"]) / "memory"
    out.mkdir(exist_ok=True)
    # From the manifest, not a loaded model: this process's peak RSS is what is measured.
    meta = json.loads((folder / "model" / "manifest.json").read_text())
    spec = registry.get(job["codec"])
    if job.get("direction") == "encode":
        wav, rate = out / "input.wav", 44100
        with sf.SoundFile(wav, "w", rate, 2, format="RF64", subtype="FLOAT") as f:
            left = round(job["minutes"] * 60 * rate)
            while left > 0:  # a second at a time: the input is never held whole, here either
                n = min(left, rate)
                f.write(np.tile(clip(n)[0][:, None], (1, 2)))
                left -= n
        args = ["encode", str(wav), "-m", str(folder / "model"), "-o", str(out / f"codes{spec.suffixes[-1]}")]
        written = out / f"codes{spec.suffixes[-1]}"
    else:
        # Codes in the codec's own file (DAC: .dac), as encode writes them, so that the original
        # length, rate and loudness are restored on the way out as they would be.
        from ..runtime.codes import Codes

        rate = int(meta["sample_rate"])
        n = round(job["minutes"] * 60 * rate)
        hooks = spec.module("bench")
        # One array of the first codebooks, or one codebook per time scale (`vq_strides`).
        strides = [int(s) for s in meta.get("vq_strides", "1").split(",")]
        k = min(8, int(meta["n_codebooks"])) if len(strides) == 1 else 1
        frames, rng = hooks.long_frames(meta, n), np.random.default_rng(0)
        codes = tuple(rng.integers(0, int(meta["codebook_size"]), (1, k, frames * strides[0] // s)) for s in strides)
        source = out / f"codes{spec.suffixes[-1]}"
        Codes(codes, codec=spec.name, sample_rate=rate, num_samples=n, **hooks.long_fields(meta)).save(source)
        del codes
        args = ["decode", str(source), "-m", str(folder / "model"), "-o", str(out / "decoded.wav")]
        written = out / "decoded.wav"
    t0 = time.perf_counter()
    run_cli.main(args, standalone_mode=False)
    return {"minutes": job["minutes"], "direction": job.get("direction", "decode"),
            "seconds": time.perf_counter() - t0, "output_mb": written.stat().st_size / 2 ** 20,
            "from": Path(args[1]).suffix}


def main() -> None:
    job = json.loads(sys.argv[1])
    runs = {"onnx": run_onnx, "torch": run_torch, "transformers": run_transformers, "memory": run_memory,
            **registry.get(job["codec"]).module("bench").CONTENDERS}
    result = runs[job["contender"]](job)
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
