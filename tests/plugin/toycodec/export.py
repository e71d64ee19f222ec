"""The toy codec -> ONNX: a fixed-length encoder and decoder, and the decoder's step graph
(one frame a call, the previous latent as its state), each validated against torch before
anything is written, through codecport's export machinery as a built-in codec's are."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from codecport.errors import ExportError
from codecport.export.builds import Build, finish_export
from codecport.export.deviation import Probe
from codecport.export.graph import GraphSpec, Tensor, export_id, export_validated
from codecport.export.validate import AUDIO_ATOL, check_close, check_codes, run

from .model import ToyModel

LEN_NEEDED = "the samples (at 8 kHz) of the fixed graphs: a clip up to this long is one call"


class _Encoder(nn.Module):
    def __init__(self, model: ToyModel):
        super().__init__()
        self.model = model

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.model.encode(audio)


class _Decoder(nn.Module):
    def __init__(self, model: ToyModel):
        super().__init__()
        self.model = model

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.model.decode(codes)


class _DecoderStep(nn.Module):
    """codes `[1, K, 1]` and the previous frame's latent -> the frame's audio and its latent."""

    def __init__(self, model: ToyModel):
        super().__init__()
        self.model = model

    def forward(self, codes: torch.Tensor, z_before_in: torch.Tensor):
        z = self.model.latent(codes)
        return self.model.synthesize(z, z_before_in), z


def export(model: ToyModel, out_dir: Path, length: int | None, *, options: dict, preset: str, weights: str,
           weights_sha256: str, in_graph_codebooks: int | None = None, build: Build | None = None,
           batch: int | None = None) -> dict:
    if length is None:
        raise ExportError(f"pass --len N: {LEN_NEEDED}")
    if batch is not None:
        raise ExportError("the toy codec has no batched graphs; leave out --batch")
    build = build or Build()
    build.check()
    cfg = model.cfg
    frames = math.ceil(length / cfg.frame_size)
    samples = frames * cfg.frame_size
    k, d = cfg.n_codebooks, cfg.latent_dim
    meta = {"codec": "toy", "preset": preset, "sample_rate": str(cfg.sample_rate),
            "frame_size": str(cfg.frame_size), "n_codebooks": str(k), "codebook_size": str(cfg.codebook_size),
            "quantizer": "graph", "weights": weights, "weights_sha256": weights_sha256}
    meta["export_id"] = export_id(meta, samples)
    codes_t = Tensor("codes", (1, k, frames), "int64")
    audio_t = Tensor("audio", (1, 1, samples), "float32")
    fixed = {"mode": "fixed", "samples": str(samples), "frames": str(frames)}
    specs = [
        GraphSpec("encoder", _Encoder(model), [audio_t], [codes_t], {**meta, **fixed, "role": "encoder"}),
        GraphSpec("decoder", _Decoder(model), [codes_t], [audio_t], {**meta, **fixed, "role": "decoder"}),
        GraphSpec("decoder_step", _DecoderStep(model),
                  [Tensor("codes", (1, k, 1), "int64"), Tensor("z_before_in", (1, 1, d), "float32")],
                  [Tensor("audio", (1, 1, cfg.frame_size), "float32"),
                   Tensor("z_before_out", (1, 1, d), "float32")],
                  {**meta, "role": "decoder", "mode": "step", "samples": str(cfg.frame_size), "frames": "1"}),
    ]
    models, report = {}, {"files": {}, "validation": {}, "geometry": {"samples": samples, "frames": frames}}
    export_validated(specs, models, report["validation"], lambda s, m: _validate(s, m, cfg.codebook_size))
    manifest = {**meta, "n_codebooks": k, **report}
    report.update(finish_export(out_dir, models, None, manifest, build, probe(manifest, specs)))
    return report


def _validate(spec: GraphSpec, model, codebook_size: int) -> dict[str, float]:
    feeds = dict(zip([t.name for t in spec.inputs], spec.random_inputs(3, high=codebook_size)))
    with torch.no_grad():
        want = spec.module(*(torch.from_numpy(v) for v in feeds.values()))
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    got = run(model, feeds)
    if spec.metadata["role"] == "encoder":
        check_codes(spec.name, got[0], want[0])
        return {"codes_identical": 1.0}
    return {"audio_max_abs_err": max(check_close(spec.name, g, w, AUDIO_ATOL) for g, w in zip(got, want))}


def probe(manifest: dict, specs: list[GraphSpec] = ()) -> Probe:
    from .runtime import ToyCodec

    geo, sr = manifest["geometry"], int(manifest["sample_rate"])

    def encode(codec, name: str, clip: np.ndarray) -> np.ndarray:
        return codec.encode(clip[:, :geo["samples"]], sr, mode="fixed").data

    def decode(codec, name: str, codes: np.ndarray) -> np.ndarray:
        return codec.decode(codes, mode="fixed" if name == "decoder" else "step")[0]

    return Probe(open=ToyCodec, encode=encode, decode=decode, pairs={"encoder": ("decoder", "decoder_step")},
                 sample_rate=sr, clip_samples=2 * geo["samples"], specs={s.name: s for s in specs})


def describe(report: dict) -> list[str]:
    geo = report["geometry"]
    return [f"  fixed graphs: {geo['samples']} samples <-> {geo['frames']} frames; "
            "decoder_step: one frame a call"]
