"""SNAC's part of codec-bench: its torch reference and the official package (`snac`, which
installs beside codecport) on the bench's weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...bench.facts import BenchFacts, LongAudio, Official
from ...bench.measure import clip, flat_codes, summary, timed, timings


def clip_samples(cfg, seconds: float) -> int:
    unit = cfg.hop_length * cfg.unit_frames
    return max(1, round(seconds * cfg.sample_rate / unit)) * unit


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
    codes, enc = timed(lambda: model.encode(x), job["runs"])
    dec = timings(lambda: model.decode(codes), job["runs"])
    seconds = n / int(meta["sample_rate"])
    return {"encode-long": summary(enc, seconds), "decode-long": summary(dec, seconds)}


def torch_encode(model, x, k):
    return model.encode(x)


def torch_codes(model, x, k) -> list[np.ndarray]:
    """The torch reference's codes of `x` `[B, 1, T]`, as `Codes` arrays `[B, 1, frames_l]`."""
    return [c.numpy()[:, None] for c in model.encode(x)]


def torch_decode(model, arrays) -> np.ndarray:
    """Audio `[B, samples]` of the torch reference, without noise (as `compare_noise` asks of ours)."""
    import torch

    codes = [torch.from_numpy(np.ascontiguousarray(a[:, 0])) for a in arrays]
    frames = codes[-1].shape[-1] * model.cfg.vq_strides[-1]
    zeros = [torch.zeros(s) for s in model.noise_shapes(frames, codes[0].shape[0])]
    return model.decode(codes, zeros)[:, 0].numpy()


def run_official(job: dict) -> dict:
    """The official package on the bench's weights, as its users run it (`SNAC(**config)`, weight
    norm in place, under `torch.inference_mode`); its decode draws its own noise."""
    from importlib.metadata import version

    import torch
    from safetensors.torch import load_file

    from ...models.checkpoint import unfold_weight_norm

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
        codes, enc = timed(lambda: model.encode(x), job["runs"])
        dec = timings(lambda: model.decode(codes), job["runs"])
        out = torch_long(model, job, meta) if job.get("long") else {}
    return {**out, "encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "threads": torch.get_num_threads(), "version": version("snac"),
            "codes": flat_codes([c.numpy()[:, None] for c in codes]).tolist()}


FACTS = BenchFacts(
    demo_preset="24khz", demo_seconds=2.0, clip_samples=clip_samples,
    torch_encode=torch_encode, torch_codes=torch_codes, torch_decode=torch_decode,
    fixed_mode="whole",  # one call of the window graph
    compare_noise={"noise": "zero"},  # comparisons with torch's decode: neither adds noise
    long=LongAudio("whole", ("encoder", "decoder"),
                   "through the window graphs, overlapping by the receptive field",
                   "on the whole clip at once",
                   long_samples),
    torch_long=torch_long,
    official=Official("snac", "snac", "pip install snac (it installs beside codecport's torch)"),
    contenders={"official": run_official},
)
