"""SNAC's part of codec-bench: its torch reference, the official package (`snac`, which installs
beside codecport) on the bench's weights, and the stream decoder's latency per coarse frame."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from .measure import clip, flat_codes, percentiles, summary, timings

FRAMES = True  # --frames: coarse frames per call of the stream decoder (--stream-frames)
LONG = True  # --long: audio of several windows, overlapping by the receptive field
LONG_MODE, LONG_GRAPHS = "whole", ("encoder", "decoder")
LONG_LABEL = "through the window graphs, overlapping by the receptive field"
LONG_TORCH = "on the whole clip at once"
MODE = "whole"  # one call of the window graph
NOISE = {"noise": "zero"}  # the demo compares its decode with torch's, so both add none
OFFICIAL = ("snac", "snac", "pip install snac (it installs beside codecport's torch)")
OFFICIAL_SCRIPT = None
DEMO = ("24khz", 2.0)


def clip_samples(cfg, seconds: float) -> int:
    unit = cfg.hop_length * cfg.unit_frames
    return max(1, round(seconds * cfg.sample_rate / unit)) * unit


def long_frames(manifest: dict, n: int) -> int:
    """Coarse frames of `n` samples (padded to whole coarse frames, as the official model)."""
    unit = int(manifest["unit_frames"]) * int(manifest["frame_size"])
    return -(-n // unit) * int(manifest["unit_frames"]) // int(manifest["vq_strides"].split(",")[0])


def long_samples(manifest: dict, windows: int) -> int:
    """Samples of audio that take `windows` windows (the first and last keep all but one margin,
    the others all but two)."""
    geo = manifest["geometry"]
    f, m = geo["frames"], max(geo["encoder_margin"], geo["decoder_margin"])
    frames = f if windows < 2 else 2 * (f - m) + (windows - 2) * (f - 2 * m)
    return frames * (geo["samples"] // geo["frames"])


def torch_long(model, job: dict, meta: dict) -> dict:
    """The torch reference on the same long clip at once, as the official package runs it
    (memory grows with the clip); its decode draws its own noise."""
    import torch

    n = long_samples(meta, job["long"])
    x = torch.from_numpy(clip(n))[:, None]
    codes = model.encode(x)
    enc = timings(lambda: model.encode(x), job["runs"])
    dec = timings(lambda: model.decode(codes), job["runs"])
    seconds = n / int(meta["sample_rate"])
    return {"encode-long": summary(enc, seconds), "decode-long": summary(dec, seconds)}


def long_fields(manifest: dict) -> dict:
    return {"mode": "whole"}


def export_options(frames: int) -> dict:
    return {"stream_frames": frames}


def skip(contender: str, variant: str) -> str | None:
    if contender == "transformers":
        return "transformers has no SNAC port"
    return None


def torch_encode(model, x, k):
    return model.encode(x)


def torch_codes(model, x, k) -> list[np.ndarray]:
    """The torch reference's codes of `x` `[B, 1, T]`, as `Codes` arrays `[B, 1, frames_l]`."""
    return [c.numpy()[:, None] for c in model.encode(x)]


def torch_decode(model, arrays) -> np.ndarray:
    """Audio `[B, samples]` of the torch reference, without noise (as `NOISE` asks of ours)."""
    import torch

    codes = [torch.from_numpy(np.ascontiguousarray(a[:, 0])) for a in arrays]
    frames = codes[-1].shape[-1] * model.cfg.vq_strides[-1]
    zeros = [torch.zeros(s) for s in model.noise_shapes(frames, codes[0].shape[0])]
    return model.decode(codes, zeros)[:, 0].numpy()


def transformers_model(conf: dict):
    raise NotImplementedError("transformers has no SNAC port")


def stream_bench(codec, job: dict) -> dict:
    """Latency of the stream decoder per push of the coarse frames one call decodes (`--frames`),
    as a TTS server would push them."""
    stream = codec.decode_stream(noise=0)
    coarse = codec.strides[0]
    per = codec.graph("decoder_stream").int("stream_frames") // coarse  # coarse frames a call
    rng = np.random.default_rng(0)
    steps, lat = job["steps"] + 5, []
    for i in range(steps):
        frame = [rng.integers(0, codec.codebook_size, per * coarse // s) for s in codec.strides]
        t0 = time.perf_counter()
        stream.push(frame)
        if i >= 5:
            lat.append(time.perf_counter() - t0)
    frame_ms = 1000 * stream.frame_samples / codec.sample_rate
    return {"decode_step": percentiles(lat), "steps": job["steps"], "frames_per_step": per,
            "frame_ms": frame_ms, "latency_frames": stream.latency_frames}


def demo_stream(codec, clip_audio: np.ndarray) -> str:
    """The demo's stream line: the clip's codes pushed a coarse frame at a time, against the
    whole decode with the same noise."""
    codes = codec.encode(clip_audio, codec.sample_rate)
    coarse = codec.strides[0]
    stream, lat, parts = codec.decode_stream(noise=1), [], []
    for j in range(codes.n_frames[0]):
        t0 = time.perf_counter()
        parts.append(stream.push([a[0, 0, j * coarse // s:(j + 1) * coarse // s]
                                  for a, s in zip(codes.arrays, codec.strides)]))
        lat.append(time.perf_counter() - t0)
    parts.append(stream.finish())
    whole = codec.decode(codes.replace(sample_rate=None, num_samples=None), noise=1)[0][0]
    err = float(np.abs(np.concatenate(parts) - whole).max())
    return (f"stream decode, a coarse frame ({1000 * stream.frame_samples / codec.sample_rate:.0f} ms) "
            f"a push: median {1e3 * np.median(lat):.1f} ms, p95 {1e3 * np.percentile(lat, 95):.1f} ms, "
            f"audio final {stream.latency_frames:g} frames later; max abs difference from the whole "
            f"decode {err:.1e}")


def run_official(job: dict) -> dict:
    """The official package on the bench's weights, as its users run it (`SNAC(**config)`, weight
    norm in place, under `torch.inference_mode`); its decode draws its own noise."""
    from importlib.metadata import version

    import torch
    from safetensors.torch import load_file

    from ..models.checkpoint import unfold_weight_norm

    try:
        from snac import SNAC
    except ImportError as e:
        return {"skipped": f"snac does not import ({e})"}
    folder = Path(job["dir"])
    model = SNAC(**json.loads((folder / "config.json").read_text())).eval()
    model.load_state_dict(unfold_weight_norm(load_file(folder / "weights.safetensors")))
    meta = json.loads((folder / "model" / "manifest.json").read_text())
    x = torch.from_numpy(clip(int(meta["geometry"]["samples"])))[:, None]
    with torch.inference_mode():
        codes = model.encode(x)
        enc = timings(lambda: model.encode(x), job["runs"])
        dec = timings(lambda: model.decode(codes), job["runs"])
        out = torch_long(model, job, meta) if job.get("long") else {}
    return {**out, "encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "threads": torch.get_num_threads(), "version": version("snac"),
            "codes": flat_codes([c.numpy()[:, None] for c in codes]).tolist()}


CONTENDERS = {"official": run_official}
