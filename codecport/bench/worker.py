"""One contender of codec-bench, run in its own process so timings and peak RSS are its own.

    python -m codecport.bench.worker '<json job>'   -> prints one JSON line

Job keys: contender (onnx | torch | transformers | rustymimi | official | memory), codec (dac |
mimi), dir (the bench folder: `model/` graphs, `weights.safetensors`, `config.json`), seconds,
runs, provider, steps, frames (Mimi: code frames a streaming step), long (DAC: windows of long
audio through the chunked graphs; 0 for none). A contender that finds itself unable to run
prints `{"skipped": reason}`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

from .measure import clip, peak_rss_mb, percentiles, summary, timings


def run_onnx(job: dict) -> dict:
    from ..runtime.dac import DacCodec
    from ..runtime.mimi import MimiCodec, MimiStream

    folder, runs = Path(job["dir"]) / job.get("model", "model"), job["runs"]
    if job["codec"] == "dac":
        codec = DacCodec(folder, job["provider"])
        x = clip(codec.graph("encoder").int("samples"))
        codes = codec.encode_exact(x)
        enc = timings(lambda: codec.encode_exact(x), runs)
        dec = timings(lambda: codec.decode(codes, padding=True), runs)
        out = _dac_long(codec, job) if job.get("long") else {}
    else:
        codec = MimiCodec(folder, job["provider"])
        x = clip(codec.graph("encoder").int("samples"))
        codes = codec.encode(x, codec.sample_rate)
        enc = timings(lambda: codec.encode(x, codec.sample_rate), runs)
        dec = timings(lambda: codec.decode(codes), runs)
        stream = MimiStream(codec)
        out = {"streaming": _mimi_steps(stream, stream.step_frames, stream.step_samples,
                                        codec.sample_rate, job["steps"])}
    return {**out, "encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "provider": codec.provider, "codes": np.asarray(codes).tolist()}


def _dac_long(codec, job: dict) -> dict:
    """Long audio through the chunked graphs, as `codec-run` slides them: `long` windows."""
    g = codec.graph("encoder_chunked")
    n = job["long"] * g.int("chunk_step")
    x = clip(n)
    codes = codec.encode_chunked(x)
    enc = timings(lambda: codec.encode_chunked(x), job["runs"])
    dec = timings(lambda: codec.decode(codes, padding=False), job["runs"])
    seconds = n / codec.sample_rate
    return {"encode-long": summary(enc, seconds), "decode-long": summary(dec, seconds),
            "windows_at_once": codec.windows}


def _mimi_steps(stream, frames: int, samples: int, rate: int, steps: int) -> dict:
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


def _torch_model(job: dict):
    """Our torch reference with the bench's weights."""
    from safetensors.torch import load_file

    from ..models.checkpoint import load_state

    conf = json.loads((Path(job["dir"]) / "config.json").read_text())
    if job["codec"] == "dac":
        from ..models.dac import DAC, DacConfig

        model = DAC(DacConfig.from_kwargs(conf))
    else:
        from ..models.mimi import MimiConfig, MimiModel

        model = MimiModel(MimiConfig.from_kwargs(conf))
    load_state(model, load_file(Path(job["dir"]) / "weights.safetensors"), "bench weights")
    return model.eval()


def run_torch(job: dict) -> dict:
    import torch

    model, runs = _torch_model(job), job["runs"]
    meta = json.loads((Path(job["dir"]) / "model" / "manifest.json").read_text())
    x = torch.from_numpy(clip(int(meta["geometry"]["samples"])))[:, None]
    k = None if job["codec"] == "dac" else 8  # as the ONNX contender: all (DAC), Moshi's 8
    if job["codec"] == "mimi":
        x = model.pad(x)
    with torch.inference_mode():
        codes = model.encode(x, k)
        enc = timings(lambda: model.encode(x, k), runs)
        dec = timings(lambda: model.decode(codes), runs)
        out = _torch_dac_long(model, job, meta) if job["codec"] == "dac" and job.get("long") else {}
    return {**out, "encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "threads": torch.get_num_threads(), "codes": codes.numpy().tolist()}


def _torch_dac_long(model, job: dict, meta: dict) -> dict:
    """The same windows as `_dac_long`, through the torch reference one after another (the
    official chunked `compress`/`decompress` loop)."""
    import torch

    geo, runs = meta["geometry"], job["runs"]
    window, step, chunk = geo["window"], geo["chunk_step"], geo["chunk_frames"]
    n = job["long"] * step
    x = torch.nn.functional.pad(torch.from_numpy(clip(n))[:, None], (model.delay(), model.delay() + window))
    windows = [x[..., i:i + window] for i in range(0, n, step)]
    model.set_padding(False)
    try:
        codes = torch.cat([model.encode(w) for w in windows], -1)
        enc = timings(lambda: [model.encode(w) for w in windows], runs)
        dec = timings(lambda: [model.decode(codes[..., i:i + chunk])
                               for i in range(0, codes.shape[-1], chunk)], runs)
    finally:
        model.set_padding(True)
    seconds = n / int(meta["sample_rate"])
    return {"encode-long": summary(enc, seconds), "decode-long": summary(dec, seconds)}


def run_transformers(job: dict) -> dict:
    """transformers' own port, built from the same config with its own random init: the
    compute does not depend on the weights' values. Run as its users run it (weight norm
    still in place for DAC, as `from_pretrained` leaves it)."""
    import torch
    import transformers

    conf = json.loads((Path(job["dir"]) / "config.json").read_text())
    meta = json.loads((Path(job["dir"]) / "model" / "manifest.json").read_text())
    x = torch.from_numpy(clip(int(meta["geometry"]["samples"])))[:, None]
    runs = job["runs"]
    if job["codec"] == "dac":
        hf = transformers.DacModel(transformers.DacConfig(
            encoder_hidden_size=conf["encoder_dim"], downsampling_ratios=conf["encoder_rates"],
            decoder_hidden_size=conf["decoder_dim"], upsampling_ratios=conf["decoder_rates"],
            n_codebooks=conf["n_codebooks"], codebook_size=conf["codebook_size"],
            codebook_dim=conf["codebook_dim"], hidden_size=conf["latent_dim"],
            sampling_rate=conf["sample_rate"])).eval()
        encode = lambda: hf.encode(x).audio_codes
        decode = lambda c: hf.decode(audio_codes=c).audio_values
    else:
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
        k = min(8, conf["n_codebooks"])
        encode = lambda: hf.encode(x, num_quantizers=k).audio_codes
        decode = lambda c: hf.decode(c).audio_values
    with torch.inference_mode():
        codes = encode()
        enc = timings(encode, runs)
        dec = timings(lambda: decode(codes), runs)
    return {"encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "version": transformers.__version__}


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

    meta = json.loads((Path(job["dir"]) / "model" / "manifest.json").read_text())
    tok = rustymimi.Tokenizer(str(Path(job["dir"]) / "weights.safetensors"), num_codebooks=MOSHI_CODEBOOKS)
    x = clip(int(meta["geometry"]["samples"]))[None]
    codes = tok.encode(x)
    enc = timings(lambda: tok.encode(x), job["runs"])
    dec = timings(lambda: tok.decode(codes), job["runs"])
    tok.reset()
    return {"encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "streaming": _mimi_steps(_RustyStream(tok), job["frames"], job["frames"] * int(meta["frame_size"]),
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
    run as Moshi runs it, under `torch.no_grad`. (DAC's official package runs in an environment
    of its own: official_dac.py.)"""
    from importlib.metadata import version

    import torch

    from ..models.mimi import MimiConfig
    from ..models.mimi_weights import moshi_config
    from ..runtime.mimi import MOSHI_CODEBOOKS

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
            steps = _mimi_steps(_MoshiStream(model), job["frames"], job["frames"] * cfg.frame_size,
                                cfg.sample_rate, job["steps"])
    return {"encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "streaming": steps, "threads": torch.get_num_threads(), "version": version("moshi"),
            "codes": codes.numpy().tolist()}


def run_memory(job: dict) -> dict:
    """`codec-run decode` of random codes for `minutes` of audio, in this process."""
    from ..cli import run_cli

    folder, out = Path(job["dir"]), Path(job["dir"]) / "memory"
    out.mkdir(exist_ok=True)
    meta = json.loads((folder / "model" / "manifest.json").read_text())
    rate = int(meta["sample_rate"])
    if job["codec"] == "dac":
        chunk, step = meta["geometry"]["chunk_frames"], meta["geometry"]["chunk_step"]
        frames = -(-round(job["minutes"] * 60 * rate) // step) * chunk
    else:
        frames = -(-round(job["minutes"] * 60 * rate) // int(meta["frame_size"]))
    k = min(8, int(meta["n_codebooks"]))
    codes = np.random.default_rng(0).integers(0, int(meta["codebook_size"]), (1, k, frames))
    np.save(out / "codes.npy", codes)
    t0 = time.perf_counter()
    run_cli.main(["decode", str(out / "codes.npy"), "-m", str(folder / "model"), "-o",
                  str(out / "decoded.wav")], standalone_mode=False)
    return {"minutes": job["minutes"], "seconds": time.perf_counter() - t0,
            "output_mb": (out / "decoded.wav").stat().st_size / 2 ** 20}


def main() -> None:
    job = json.loads(sys.argv[1])
    run = {"onnx": run_onnx, "torch": run_torch, "transformers": run_transformers,
           "rustymimi": run_rustymimi, "official": run_moshi, "memory": run_memory}[job["contender"]]
    result = run(job)
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
