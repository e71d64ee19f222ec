"""NeuCodec -> ONNX: the decoder, and the encoder's own layers (work in progress).

Not registered as a codec yet (`codec-export neucodec` does not exist): w2v-BERT 2.0, the
semantic model the encoder reads, is not exported, and the graphs have no padding mask for
clips shorter than they are. What is here is validated as every graph is:

- `decoder`: FSQ levels `[1, frames, len(levels)]` (the numpy FSQ of runtime/fsq.py turns codes
  into them) -> audio `[1, 1, frames * hop]`: `project_out`, `fc_post_a`, the Vocos backbone and
  the ISTFT head, the inverse STFT as a MatMul (models/istft.py): no DFT, no ConvTranspose.
- `encoder`: 16 kHz audio `[1, 1, frames * 320]` and w2v-BERT's 16th hidden state
  `[1, frames, semantic_dim]` -> the FSQ's input `[1, frames, len(levels)]` (runtime/fsq.py
  quantizes it): the acoustic encoder, the semantic encoder, `fc_prior`, `project_in`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ..errors import ExportError
from ..models.neucodec import NeuCodec
from ..runtime.fsq import Fsq
from .graph import GraphSpec, Tensor, export_validated
from .validate import AUDIO_ATOL, check_close, check_codes, run


class DecoderGraph(nn.Module):
    def __init__(self, model: NeuCodec):
        super().__init__()
        self.model = model

    def forward(self, levels: torch.Tensor) -> torch.Tensor:
        g = self.model.generator
        x = self.model.fc_post_a(g.quantizer.project_out(levels))
        return g.head(g.backbone(x))[:, None]


class EncoderGraph(nn.Module):
    def __init__(self, model: NeuCodec):
        super().__init__()
        self.model = model

    def forward(self, audio: torch.Tensor, semantic: torch.Tensor) -> torch.Tensor:
        return self.model.latent_in(audio, semantic)


def graph_specs(model: NeuCodec, frames: int) -> list[GraphSpec]:
    """The decoder and encoder graphs for `frames` code frames (50 a second)."""
    cfg = model.cfg
    if frames < 2:
        raise ExportError(f"NeuCodec graphs need at least 2 frames, got {frames}")
    hop_in = math.prod(cfg.enc_strides)
    meta = {"codec": "neucodec", "frames": str(frames), "sample_rate": str(cfg.sample_rate),
            "input_rate": str(cfg.input_rate), "levels": ",".join(map(str, cfg.levels))}
    levels = Tensor("levels", (1, frames, len(cfg.levels)), "float32")
    return [
        GraphSpec("decoder", DecoderGraph(model), [levels],
                  [Tensor("audio", (1, 1, frames * cfg.hop), "float32")],
                  {**meta, "role": "decoder", "samples": str(frames * cfg.hop)}),
        GraphSpec("encoder", EncoderGraph(model),
                  [Tensor("audio", (1, 1, frames * hop_in), "float32"),
                   Tensor("semantic", (1, frames, cfg.semantic_dim), "float32")],
                  [Tensor("latent", (1, frames, len(cfg.levels)), "float32")],
                  {**meta, "role": "encoder", "samples": str(frames * hop_in)}),
    ]


def validate(spec: GraphSpec, onnx_model, model: NeuCodec, seed: int = 1) -> dict[str, float]:
    """ONNX Runtime against torch on inputs other than the export dummy: a decoder on the levels
    of random codes, within `AUDIO_ATOL`; an encoder to identical FSQ codes."""
    fsq = Fsq(model.cfg.levels)
    rng = np.random.default_rng(seed)
    if spec.metadata["role"] == "decoder":
        frames = spec.inputs[0].shape[1]
        x = [fsq.codes(rng.integers(0, fsq.size, (1, frames)))]
    else:
        x = spec.random_inputs(seed)
    with torch.no_grad():
        want = spec.module(*map(torch.from_numpy, x)).numpy()
    got = run(onnx_model, {t.name: a for t, a in zip(spec.inputs, x)})[0]
    if spec.metadata["role"] == "decoder":
        return {"audio_max_abs_err": check_close(spec.name, got, want, AUDIO_ATOL)}
    check_codes(spec.name, fsq.indices(got), fsq.indices(want))
    return {"codes_identical": 1.0}


def export_graphs(model: NeuCodec, frames: int) -> tuple[dict, dict]:
    """(name -> validated ONNX model, name -> measured errors)."""
    models, validation = {}, {}
    export_validated(graph_specs(model.eval(), frames), models, validation,
                     lambda s, m: validate(s, m, model))
    return models, validation
