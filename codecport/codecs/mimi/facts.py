"""Mimi's part of codec-bench: its torch and transformers runs, Kyutai's Rust Mimi (rustymimi)
and the official package (moshi), both on the bench's weights and timed in their streaming
modes as well."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...bench.facts import BenchFacts, Official
from ...bench.measure import clip, summary, timed, timings
from .runtime import MOSHI_CODEBOOKS


def skip(contender: str, preset: str) -> str | None:
    if contender == "rustymimi" and preset != "mimi":
        # Its Tokenizer builds the released Mimi's config whatever the file holds.
        return "rustymimi runs the released Mimi config only (mimi --preset mimi)"
    return None


def torch_encode(model, x, k):
    return model.encode(model.pad(x), k)


def transformers_model(conf: dict):
    """transformers' `MimiModel` of the bench's config: (encode(x), decode(codes))."""
    import transformers

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


class _Push:
    """A contender's streaming call in the shape of codecport's streams: `push(x)`."""

    def __init__(self, fn):
        self.push = fn


def run_rustymimi(job: dict) -> dict:
    """Kyutai's Rust Mimi (candle), as its users run it, on the bench's weights: moshi's file
    format, whose key names are ours. It builds the released Mimi's config only."""
    from importlib.metadata import version

    import rustymimi

    from ...bench.worker import stream_steps

    meta = json.loads((Path(job["dir"]) / "model" / "manifest.json").read_text())
    tok = rustymimi.Tokenizer(str(Path(job["dir"]) / "weights.safetensors"), num_codebooks=MOSHI_CODEBOOKS)
    x = clip(int(meta["geometry"]["samples"]))[None]
    codes, enc = timed(lambda: tok.encode(x), job["runs"])
    dec = timings(lambda: tok.decode(codes), job["runs"])
    tok.reset()
    return {"encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "streaming": stream_steps(_Push(lambda frame: tok.encode_step(frame[None, None])),
                                      _Push(tok.decode_step), job["frames"],
                                      job["frames"] * int(meta["frame_size"]),
                                      int(meta["sample_rate"]), job["steps"]),
            "version": version("rustymimi"), "codes": codes.astype(np.int64).tolist()}


def run_moshi(job: dict) -> dict:
    """Mimi's official package, moshi, on the bench's weights: built by its own loader from the
    bench's weights file (moshi's format, whose key names are ours) and the bench's config, and
    run as Moshi runs it, under `torch.no_grad`."""
    from importlib.metadata import version

    try:  # first: a moshi that cannot run is skipped without torch's import (seconds)
        from moshi.models import loaders
    except ImportError as e:  # installed, but not its own dependencies
        return {"skipped": f"moshi is installed but does not import ({e})"}
    import torch

    from ...bench.worker import stream_steps
    from .config import MimiConfig
    from .weights import moshi_config
    folder = Path(job["dir"])
    cfg = MimiConfig.from_kwargs(json.loads((folder / "config.json").read_text()))
    k = min(MOSHI_CODEBOOKS, cfg.n_codebooks)
    model = loaders.get_mimi(str(folder / "weights.safetensors"), moshi_config(cfg), num_codebooks=k).eval()
    meta = json.loads((folder / "model" / "manifest.json").read_text())
    x = torch.from_numpy(clip(int(meta["geometry"]["samples"])))[:, None]
    with torch.no_grad():
        codes, enc = timed(lambda: model.encode(x), job["runs"])
        dec = timings(lambda: model.decode(codes), job["runs"])
        # As the Moshi server runs it: inside one `mimi.streaming(1)`, each call takes the next
        # frames and returns their codes or audio.
        with model.streaming(1):
            steps = stream_steps(_Push(lambda frame: model.encode(torch.from_numpy(frame)[None, None])),
                                 _Push(model.decode), job["frames"], job["frames"] * cfg.frame_size,
                                 cfg.sample_rate, job["steps"])
    return {"encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "streaming": steps, "threads": torch.get_num_threads(), "version": version("moshi"),
            "codes": codes.numpy().tolist()}


FACTS = BenchFacts(
    demo_preset="mimi", demo_seconds=2.0, web_preset="mimi", web_codebooks=MOSHI_CODEBOOKS,
    torch_encode=torch_encode,
    transformers_model=transformers_model, skip=skip,
    official=Official("moshi", "moshi", "pip install moshi, in an environment of its own (it pins "
                      "torch<2.10 and numpy<2.3), or pip install --no-deps moshi sentencepiece einops"),
    contenders={"rustymimi": run_rustymimi, "official": run_moshi},
)
