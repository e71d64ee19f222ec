"""DAC's part of codec-bench: its long-audio path, its torch and transformers runs, and the
official package (descript-audio-codec), which runs in an interpreter of its own."""

from __future__ import annotations

import json
from pathlib import Path

from ...atomic import atomic_path
from ...bench.facts import BenchFacts, LongAudio, Official
from ...bench.measure import clip, summary, timed, timings


def clip_samples(cfg, seconds: float) -> int:
    return round(seconds * cfg.sample_rate)


def long_samples(manifest: dict, windows: int) -> int:
    """Samples of long audio that take `windows` windows of the chunked graphs."""
    return windows * manifest["geometry"]["chunk_step"]


def prepare_official(work: Path, python: Path) -> None:
    """The bench's weights as the official package saves them (`weights-official.pth`)."""
    import torch
    from safetensors.torch import load_file

    from .weights import unfold_weight_norm

    ckpt = {"state_dict": unfold_weight_norm(load_file(work / "weights.safetensors")),
            "metadata": {"kwargs": json.loads((work / "config.json").read_text())}}
    with atomic_path(work / "weights-official.pth") as tmp:
        torch.save(ckpt, tmp)


def torch_encode(model, x, k):
    return model.encode(x, k)


def torch_long(model, job: dict, meta: dict) -> dict:
    """The same windows as the runtime's long-audio run, through the torch reference one after
    another (the official chunked `compress`/`decompress` loop)."""
    import torch

    geo, runs = meta["geometry"], job["runs"]
    window, step, chunk = geo["window"], geo["chunk_step"], geo["chunk_frames"]
    n = job["long"] * step
    x = torch.nn.functional.pad(torch.from_numpy(clip(n))[:, None], (model.delay(), model.delay() + window))
    windows = [x[..., i:i + window] for i in range(0, n, step)]
    model.set_padding(False)
    try:
        parts, enc = timed(lambda: [model.encode(w) for w in windows], runs)
        codes = torch.cat(parts, -1)
        dec = timings(lambda: [model.decode(codes[..., i:i + chunk])
                               for i in range(0, codes.shape[-1], chunk)], runs)
    finally:
        model.set_padding(True)
    seconds = n / int(meta["sample_rate"])
    return {"encode-long": summary(enc, seconds), "decode-long": summary(dec, seconds)}


def transformers_model(conf: dict):
    """transformers' `DacModel` of the bench's config, run as its users run it (weight norm in
    place, as `from_pretrained` leaves it): (encode(x), decode(codes))."""
    import transformers

    hf = transformers.DacModel(transformers.DacConfig(
        encoder_hidden_size=conf["encoder_dim"], downsampling_ratios=conf["encoder_rates"],
        decoder_hidden_size=conf["decoder_dim"], upsampling_ratios=conf["decoder_rates"],
        n_codebooks=conf["n_codebooks"], codebook_size=conf["codebook_size"],
        codebook_dim=conf["codebook_dim"], hidden_size=conf["latent_dim"],
        sampling_rate=conf["sample_rate"])).eval()
    return (lambda x: hf.encode(x).audio_codes), (lambda c: hf.decode(audio_codes=c).audio_values)


FACTS = BenchFacts(
    # The smaller 24 kHz model keeps the demo's export short.
    demo_preset="24khz", demo_seconds=1.0, web_preset="24khz",
    clip_samples=clip_samples, torch_encode=torch_encode,
    transformers_model=transformers_model,
    long=LongAudio("chunked", ("encoder_chunked", "decoder_chunked"), "through the chunked graphs",
                   "one window after another", long_samples),
    torch_long=torch_long,
    official=Official(
        "descript-audio-codec", None,
        "descript-audio-codec cannot share an environment with codecport (its descript-audiotools pins "
        "protobuf<3.20, onnx and onnxruntime need >=4.25): install it in an environment of its own and "
        "pass --official-python ENV/bin/python",
        script=Path(__file__).with_name("official.py")),
    prepare_official=prepare_official,
)
