"""Mimi's part of codec-bench: its torch and transformers runs, Kyutai's Rust Mimi (rustymimi)
and the official package (moshi), both on the bench's weights and timed in their streaming
modes as well."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .measure import clip, summary, timings

FRAMES = True  # step graphs: --frames sets the code frames a step
WEB = ("mimi", 8)  # codec-bench web: the preset, and Moshi's 8 codebooks in the graphs
LONG = False
MODE = "fixed"  # one call of the fixed-length graphs
NOISE: dict = {}
OFFICIAL = ("moshi", "moshi", ("pip install moshi, in an environment of its own (it pins torch<2.10 "
            "and numpy<2.3), or pip install --no-deps moshi sentencepiece einops"))
OFFICIAL_SCRIPT = None

DEMO = ("mimi", 2.0)  # the demo's preset and seconds per fixed call


def clip_samples(cfg, seconds: float) -> int:
    return round(seconds * cfg.sample_rate / cfg.frame_size) * cfg.frame_size


def long_frames(manifest: dict, n: int) -> int:
    """Frames of `n` samples of long audio (it streams through the step graphs)."""
    return -(-n // int(manifest["frame_size"]))


def long_fields(manifest: dict) -> dict:
    """What codes of long audio carry besides their length and rate (see `Codes`)."""
    return {"mode": "step"}


def export_options(frames: int) -> dict:
    return {"frames": frames}


def skip(contender: str, variant: str) -> str | None:
    if contender == "rustymimi" and variant != "mimi":
        # Its Tokenizer builds the released Mimi's config whatever the file holds.
        return "rustymimi runs the released Mimi config only (mimi --variant mimi)"
    return None


def torch_encode(model, x, k):
    return model.encode(model.pad(x), k)


def torch_codes(model, x, k) -> list:
    return [torch_encode(model, x, k).numpy()]


def torch_decode(model, arrays):
    import torch

    return model.decode(torch.from_numpy(arrays[0]))[:, 0].numpy()


def stream_bench(codec, job: dict) -> dict:
    """Latency of one live step, encode and decode."""
    from .worker import stream_steps

    stream = codec.stream()
    return stream_steps(stream, stream.step_frames, stream.step_samples, codec.sample_rate, job["steps"])


def demo_stream(codec, clip_audio) -> str:
    """The demo's live loop: the clip a step at a time through encode and decode."""
    import time

    stream, lat = codec.stream(), []
    step = stream.step_samples
    for i in range(0, clip_audio.shape[1] - step + 1, step):
        t0 = time.perf_counter()
        stream.decode_step(stream.encode_step(clip_audio[0, i:i + step]))
        lat.append(time.perf_counter() - t0)
    return (f"live stream, {1000 * step / codec.sample_rate:g} ms a call (encode + decode): "
            f"median {1e3 * np.median(lat):.1f} ms, p95 {1e3 * np.percentile(lat, 95):.1f} ms")


def transformers_model(conf: dict):
    """transformers' `MimiModel` of the bench's config: (encode(x), decode(codes))."""
    import transformers

    from ..runtime.mimi import MOSHI_CODEBOOKS

    ratios = conf["ratios"]
    hf = transformers.MimiModel(transformers.MimiConfig(
        num_filters=conf["n_filters"], upsampling_ratios=ratios, hidden_size=conf["dimension"],
        num_hidden_layers=conf["n_layers"], intermediate_size=conf["ffn"],
        num_attention_heads=conf["n_heads"], num_key_value_heads=conf["n_heads"],
        codebook_size=conf["codebook_size"], codebook_dim=conf["codebook_dim"],
        vector_quantization_hidden_dimension=conf["codebook_dim"],
        num_quantizers=conf["n_codebooks"], upsample_groups=conf["dimension"],
        sampling_rate=conf["sample_rate"], sliding_window=conf["context"],
        frame_rate=conf["sample_rate"] / (conf["downsample_stride"] * int(np.prod(ratios))))).eval()
    k = min(MOSHI_CODEBOOKS, conf["n_codebooks"])
    return (lambda x: hf.encode(x, num_quantizers=k).audio_codes), (lambda c: hf.decode(c).audio_values)


class _RustyStream:
    """rustymimi's streaming calls in `MimiStream`'s shape: one frame in, its codes out."""

    def __init__(self, tok):
        self.tok = tok

    def encode_step(self, frame: np.ndarray):
        return self.tok.encode_step(frame[None, None])

    def decode_step(self, codes):
        return self.tok.decode_step(codes)


def run_rustymimi(job: dict) -> dict:
    """Kyutai's Rust Mimi (candle), as its users run it, on the bench's weights: moshi's file
    format, whose key names are ours. It builds the released Mimi's config only."""
    from importlib.metadata import version

    import rustymimi

    from ..runtime.mimi import MOSHI_CODEBOOKS
    from .worker import stream_steps

    meta = json.loads((Path(job["dir"]) / "model" / "manifest.json").read_text())
    tok = rustymimi.Tokenizer(str(Path(job["dir"]) / "weights.safetensors"), num_codebooks=MOSHI_CODEBOOKS)
    x = clip(int(meta["geometry"]["samples"]))[None]
    codes = tok.encode(x)
    enc = timings(lambda: tok.encode(x), job["runs"])
    dec = timings(lambda: tok.decode(codes), job["runs"])
    tok.reset()
    return {"encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "streaming": stream_steps(_RustyStream(tok), job["frames"], job["frames"] * int(meta["frame_size"]),
                                      int(meta["sample_rate"]), job["steps"]),
            "version": version("rustymimi"), "codes": codes.astype(np.int64).tolist()}


class _MoshiStream:
    """moshi's streaming mode in `MimiStream`'s shape, as the Moshi server runs it: inside one
    `mimi.streaming(1)`, each call takes the next frames and returns their codes or audio."""

    def __init__(self, model):
        import torch

        self.model, self.torch = model, torch

    def encode_step(self, frame: np.ndarray):
        return self.model.encode(self.torch.from_numpy(frame)[None, None])

    def decode_step(self, codes):
        return self.model.decode(codes)


def run_moshi(job: dict) -> dict:
    """Mimi's official package, moshi, on the bench's weights: built by its own loader from the
    bench's weights file (moshi's format, whose key names are ours) and the bench's config, and
    run as Moshi runs it, under `torch.no_grad`."""
    from importlib.metadata import version

    import torch

    from ..models.mimi_config import MimiConfig
    from ..models.mimi_weights import moshi_config
    from ..runtime.mimi import MOSHI_CODEBOOKS
    from .worker import stream_steps

    try:
        from moshi.models import loaders
    except ImportError as e:  # installed, but not its own dependencies
        return {"skipped": f"moshi is installed but does not import ({e})"}
    folder = Path(job["dir"])
    cfg = MimiConfig.from_kwargs(json.loads((folder / "config.json").read_text()))
    k = min(MOSHI_CODEBOOKS, cfg.n_codebooks)
    model = loaders.get_mimi(str(folder / "weights.safetensors"), moshi_config(cfg), num_codebooks=k).eval()
    meta = json.loads((folder / "model" / "manifest.json").read_text())
    x = torch.from_numpy(clip(int(meta["geometry"]["samples"])))[:, None]
    with torch.no_grad():
        codes = model.encode(x)
        enc = timings(lambda: model.encode(x), job["runs"])
        dec = timings(lambda: model.decode(codes), job["runs"])
        with model.streaming(1):
            steps = stream_steps(_MoshiStream(model), job["frames"], job["frames"] * cfg.frame_size,
                                 cfg.sample_rate, job["steps"])
    return {"encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "streaming": steps, "threads": torch.get_num_threads(), "version": version("moshi"),
            "codes": codes.numpy().tolist()}


CONTENDERS = {"rustymimi": run_rustymimi, "official": run_moshi}
