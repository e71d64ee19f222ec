"""The runtime's numpy ends of NeuCodec and XCodec2 as graph ops, for graphs a browser (or an app
without numpy) runs whole: w2v-BERT's fbank features (codecs/neucodec/fbank.py; DistilHuBERT's
normalised samples for the distilled NeuCodec) and the FSQ (codecs/neucodec/fsq.py), built from the
runtime's own constants so that the two cannot drift apart.

Written for every runtime, WebGPU's kernel table included (export/web.py): no DFT (static slices
cut the frames, whose DC removal, pre-emphasis, window and real DFT are all linear in the frame:
one MatMul with a constant basis), no Round and no Mod (WebGPU has neither: rounding half
to even and the mixed-radix digits are spelled with Floor, exact on these small integers), and
codes as int32 (WebGPU has no int64).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import fbank as fb
from .fsq import Fsq


def _frame_basis() -> np.ndarray:
    """`[FRAME, 2 * (FFT // 2 + 1)]`: a frame (16-bit range) -> the real and imaginary parts of
    its spectrum, as codecs/neucodec/fbank.py computes them (DC offset removed, pre-emphasis, Povey
    window, a zero-padded real DFT), applied to each unit frame in float64."""
    # [FRAME, bins]: row k is unit frame k's
    spec = np.fft.rfft(fb.Fbank().windowed(np.eye(fb.FRAME)), fb.FFT)
    return np.concatenate([spec.real, spec.imag], axis=1).astype(np.float32)


class FbankFeatures(nn.Module):
    """16 kHz audio `[B, 1, n]` and the codes' `mask` `[B, 1, frames]` -> w2v-BERT's features
    `[B, frames, 160]` of the clip the mask marks (row by row), zero past it: what the runtime feeds the
    encoder graph. The clip is the mask's frames and `extra` more, `hop` samples a frame; `pad`:
    zeros each side of it first (the config's `fbank_pad`).

    The 400-sample frames every 160 samples are cut with static slices (two 160-sample rows and
    half of a third), then one MatMul: a strided Conv with a 400-tap kernel would do the same,
    but onnxruntime-web's WebGPU Conv gave wrong values for it (measured on SwiftShader).

    Two feature frames make a row, and a clip of `v` code frames has exactly `2 v` of them in
    both codecs' alignments (codecs/neucodec/config.py), so the mask, repeated twice, marks the
    frames each mel bin is normalised over (sample variance, as codecs/neucodec/fbank.py)."""

    def __init__(self, pad: int, hop: int, extra: int):
        super().__init__()
        self.pad, self.hop, self.extra = pad, hop, extra
        self.register_buffer("basis", torch.from_numpy(_frame_basis()), persistent=False)
        self.register_buffer("filters", torch.from_numpy(fb.mel_filters()), persistent=False)

    def forward(self, audio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, frames = mask.shape[0], mask.shape[-1]
        n = fb.STRIDE * frames  # feature frames
        # The clip's samples only (its code frames and the acoustic frames past them): the
        # features' last frames reach past the clip, where the runtime's see the official zeros.
        clip = torch.cat([torch.ones_like(mask[..., :1])] * self.extra + [mask], -1)
        # Expand, not a stack of `hop` copies: onnxruntime-web's WebGPU Concat of 320 inputs
        # gave wrong values (measured on SwiftShader).
        x = audio * clip[..., None].expand(*clip.shape, self.hop).reshape(b, 1, -1)
        x = F.pad(x, (self.pad, self.pad)) if self.pad else x
        if x.shape[-1] % fb.HOP or x.shape[-1] // fb.HOP < n + 2:
            raise ValueError(f"{x.shape[-1]} samples do not hold {n} whole fbank frames")
        rows = (x * float(1 << 15)).reshape(b, -1, fb.HOP)  # frame i: rows i, i + 1 and half of i + 2
        tail = fb.FRAME - 2 * fb.HOP
        framed = torch.cat([rows[:, :n], rows[:, 1:n + 1], rows[:, 2:n + 2, :tail]], -1)  # [B, n, FRAME]
        re, im = (framed @ self.basis).chunk(2, dim=-1)
        mel = torch.log(torch.clamp((re * re + im * im) @ self.filters, min=fb.MEL_FLOOR))  # [B, n, MELS]
        m = mask[..., None].expand(*mask.shape, fb.STRIDE).reshape(b, n, 1)
        count = m.sum(1, keepdim=True)
        centred = (mel - (mel * m).sum(1, keepdim=True) / count) * m
        var = (centred * centred).sum(1, keepdim=True) / (count - 1)
        return (centred / torch.sqrt(var + 1e-7)).reshape(b, frames, fb.FEATURES)


class RawValues(nn.Module):
    """16 kHz audio `[B, 1, n]` and the codes' `mask` `[B, 1, frames]` -> DistilHuBERT's input
    `[B, n + 2 pad]` of the clip the mask marks: fbank.raw_values in the graph (the clip,
    `pad` zeros each side, normalised over those when `normalize`). Past the clip's padded end
    the values are not the runtime's zeros; the model never reads them (its conv frames there
    are masked)."""

    def __init__(self, pad: int, hop: int, extra: int, normalize: bool):
        super().__init__()
        self.pad, self.hop, self.extra, self.normalize = pad, hop, extra, normalize

    def forward(self, audio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b = mask.shape[0]
        clip = torch.cat([torch.ones_like(mask[..., :1])] * self.extra + [mask], -1)
        m = clip[..., None].expand(*clip.shape, self.hop).reshape(b, -1)  # the clip's samples
        x = F.pad(audio.reshape(b, -1) * m, (self.pad, self.pad))
        if not self.normalize:
            return x
        # The padded clip: its samples and the 2 pad zeros around them, from the start.
        v = torch.cat([torch.ones_like(m[:, :2 * self.pad]), m], -1)
        count = v.sum(-1, keepdim=True)
        mean = (x * v).sum(-1, keepdim=True) / count
        d = x - mean
        return d / torch.sqrt((d * d * v).sum(-1, keepdim=True) / count + 1e-7)


def round_half_even(x: torch.Tensor) -> torch.Tensor:
    """`torch.round` (half to even) from Floor, which every runtime has: `x - floor(x)` is exact
    in float32, so the tie test is too, and so is the parity of the floor (below 2^24)."""
    f = torch.floor(x)
    d = x - f
    odd = f - 2 * torch.floor(f / 2)
    return f + (d > 0.5).float() + (d == 0.5).float() * odd


class FsqOps(nn.Module):
    """codecs/neucodec/fsq.py's `Fsq` on tensors: `indices` (latent -> int32 codes, bit for bit the
    numpy quantizer's) and `levels` (int32 codes -> the decoder's input)."""

    def __init__(self, levels):
        super().__init__()
        q = Fsq(levels)
        self.size = q.size
        for name, value in (("shift", q._shift), ("half_l", q._half_l), ("offset", q._offset),
                            ("half_width", q.half_width), ("basis", q.basis.astype(np.float32)),
                            ("radix", q.levels.astype(np.float32))):
            self.register_buffer(name, torch.from_numpy(np.ascontiguousarray(value)), persistent=False)

    def _bound(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(z + self.shift) * self.half_l - self.offset

    def indices(self, z: torch.Tensor) -> torch.Tensor:
        """`[..., dim]` float32 -> `[...]` int32 codes."""
        q = round_half_even(self._bound(self._bound(z)))
        return ((q + self.half_width) * self.basis).sum(-1).to(torch.int32)

    def levels(self, codes: torch.Tensor) -> torch.Tensor:
        """int32 codes `[...]` -> levels `[..., dim]` in [-1, 1). The digits are
        `floor(c / b) - l * floor(c / (b l))` in float32: codes below 2^24 are exact there, and
        so is the floor of their correctly rounded quotients (tests/test_fsq.py checks every code)."""
        c = codes.float()[..., None]
        digits = torch.floor(c / self.basis) - self.radix * torch.floor(c / (self.basis * self.radix))
        return (digits - self.half_width) / self.half_width
