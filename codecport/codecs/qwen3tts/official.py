"""qwen-tts, the official Qwen3-TTS tokenizer package, as a codec-bench contender.

    OTHER_ENV/bin/python path/to/codecs/qwen3tts/official.py '<json job>'   -> prints one JSON line
    OTHER_ENV/bin/python path/to/codecs/qwen3tts/official.py '{"config": "CONFIG.json"}'
        -> the official state dict's names, shapes and dtypes for that config

Run by its path with the interpreter of an environment of its own (`codec-bench
--official-python`): qwen-tts pins transformers 4.57.3 (and under codecport's newer transformers
it does not run correctly), so it never shares codecport's environment. This file imports nothing
of codecport but the bench's `measure.py`, which needs numpy alone. torchaudio, which only the
25 Hz tokenizer imports, is stubbed before `import qwen_tts` (scripts/official_qwen3tts.py does the
same; its wheel does not load beside torch 2.13).

The bench folder's `official/` holds the bench's weights in the official layout (written by
`facts.prepare_official` from the names and shapes `keys` lists). The timings are the official
calls: `model.encode(wav, padding_mask)`, `model.decode(codes)` (its `chunked_decode`, 300 frames
with 25 of left context), and the way the official code can stream, which has no streaming API:
each push of new frames re-runs the decoder on them with 25, or 72 (vLLM-Omni's PR #2480), frames of
left context before them and keeps the new frames' audio, as `chunked_decode` does chunk by chunk.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
import time
import types
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# Run by path, this folder is first on sys.path, and its modules (config.py, model.py...) would
# shadow modules of the official package's own imports.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
CONTEXTS = (25, 72)  # left context frames of the official chunking, and of vLLM-Omni's


def _measure():
    spec = importlib.util.spec_from_file_location("codec_bench_measure",
                                                  Path(__file__).parents[2] / "bench" / "measure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _official():
    """The official model and config classes, or the reason they do not import."""
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__spec__, stub.__path__ = importlib.machinery.ModuleSpec(name, None), []
            sys.modules[name] = stub
    try:
        from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
            Qwen3TTSTokenizerV2Config,
        )
        from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
    except ImportError as e:
        return None, f"qwen-tts does not import with {sys.executable} ({e})"
    return (Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model), None


def _build(classes, conf: dict):
    config_cls, model_cls = classes
    conf = {k: v for k, v in conf.items() if k not in ("model_type", "architectures")}
    return model_cls(config_cls(**conf))


def keys(config: Path) -> dict:
    """The official model's state dict of this config.json: name -> [shape, dtype]."""
    import torch

    classes, why = _official()
    if classes is None:
        return {"skipped": why}
    with torch.device("meta"):  # shapes only: nothing allocated, nothing initialised
        model = _build(classes, json.loads(config.read_text()))
    return {"keys": {k: [list(v.shape), str(v.dtype).removeprefix("torch.")]
                     for k, v in model.state_dict().items()}}


def stream(model, codes, frames: int, context: int, steps: int, hop: int, rate: int, m) -> dict:
    """Per push of `frames` new code frames: the decoder re-run on them and `context` frames
    before them, their audio kept; and time to first audio, a new stream's first push (no
    context yet), the median of a few."""
    lat, first = [], []
    for i in range(steps + m.WARMUP_STEPS):
        # Each push past the longest context: a stream that has run a while holds all of it.
        end = max(CONTEXTS) + (i + 1) * frames
        t0 = time.perf_counter()
        model.decoder(codes[..., end - frames - context:end])[..., -frames * hop:]
        if i >= m.WARMUP_STEPS:
            lat.append(time.perf_counter() - t0)
    for _ in range(m.WARMUP_STEPS):
        t0 = time.perf_counter()
        model.decoder(codes[..., max(CONTEXTS):max(CONTEXTS) + frames])
        first.append(time.perf_counter() - t0)
    return {"decode_step": m.percentiles(lat), "steps": steps, "frames_per_step": frames,
            "frame_ms": 1000 * hop / rate, "first_audio_ms": 1e3 * sorted(first)[len(first) // 2],
            "latency_frames": 0}


def run(job: dict) -> dict:
    classes, why = _official()  # before torch's import (seconds): a missing package is found at once
    if classes is None:
        return {"skipped": why}
    import numpy as np
    import torch
    from safetensors.torch import load_file

    m = _measure()
    folder = Path(job["dir"])
    conf = json.loads((folder / "official" / "config.json").read_text())
    model = _build(classes, conf)
    model.load_state_dict(load_file(folder / "official" / "model.safetensors"), strict=True)
    model.eval()
    meta = json.loads((folder / "model" / "manifest.json").read_text())
    x = torch.from_numpy(m.clip(int(meta["geometry"]["samples"])))
    hop, rate = conf["decode_upsample_rate"], conf["output_sample_rate"]
    steps, frames = job["steps"], job["frames"]
    rng = np.random.default_rng(0)  # the codes the bench's own decoder stream is timed on
    k, size = conf["encoder_valid_num_quantizers"], conf["decoder_config"]["codebook_size"]
    pushed = np.concatenate([rng.integers(0, size, (k, frames)) for _ in range(steps + m.WARMUP_STEPS)]
                            + [rng.integers(0, size, (k, max(CONTEXTS)))], axis=-1)
    pushed = np.concatenate([pushed[:, -max(CONTEXTS):], pushed[:, :-max(CONTEXTS)]], axis=-1)
    with torch.inference_mode():  # as the official wrapper calls them
        codes, enc = m.timed(lambda: model.encode(x, torch.ones_like(x, dtype=torch.long)).audio_codes[0],
                             job["runs"])
        dec = m.timings(lambda: model.decode(codes[None]), job["runs"])
        streams = {f"streaming (left context {c})" if c != CONTEXTS[0] else "streaming":
                   stream(model, torch.from_numpy(pushed)[None], frames, c, steps, hop, rate, m)
                   for c in CONTEXTS}
    try:
        release = version("qwen-tts")
    except PackageNotFoundError:
        release = "unknown"
    return {"encode": m.summary(enc, job["seconds"]), "decode": m.summary(dec, job["seconds"]), **streams,
            "threads": torch.get_num_threads(), "version": release, "python": sys.executable,
            "codes": codes.T[None].numpy().tolist(), "peak_rss_mb": m.peak_rss_mb()}


if __name__ == "__main__":
    job = json.loads(sys.argv[1])
    print(json.dumps(keys(Path(job["config"])) if "config" in job else run(job)))
