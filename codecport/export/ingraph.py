"""The runtime's numpy ends of NeuCodec and XCodec2 as graph ops, for graphs a browser (or an app
without numpy) runs whole: w2v-BERT's fbank features (runtime/fbank.py) and the FSQ
(runtime/fsq.py), built from the runtime's own constants so that the two cannot drift apart.

Written for every runtime, WebGPU's kernel table included (export/web.py): no DFT (the fbank's
framing, DC removal, pre-emphasis, window and real DFT are all linear in the frame, so they are
one strided Conv with a constant kernel), no Round and no Mod (WebGPU has neither: rounding half
to even and the mixed-radix digits are spelled with Floor, exact on these small integers), and
codes as int32 (WebGPU has no int64).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..runtime import fbank as fb
from ..runtime.fsq import Fsq


def _frame_basis() -> np.ndarray:
    """`[2 * (FFT // 2 + 1), FRAME]`: a frame (16-bit range) -> the real and imaginary parts of
    its spectrum, as runtime/fbank.py computes them (DC offset removed, pre-emphasis, Povey
    window, a zero-padded real DFT), applied to each unit frame in float64."""
    buf = np.eye(fb.FRAME)
    buf = buf - buf.mean(axis=1, keepdims=True)
    buf[:, 1:] = buf[:, 1:] - 0.97 * buf[:, :-1]
    buf[:, 0] *= 1 - 0.97
    spec = np.fft.rfft(buf * fb.Fbank().window, fb.FFT)  # [FRAME, bins]: row k is unit frame k's
    return np.concatenate([spec.real.T, spec.imag.T]).astype(np.float32)


class FbankFeatures(nn.Module):
    """16 kHz audio `[1, 1, n]` and the codes' `mask` `[1, 1, frames]` -> w2v-BERT's features
    `[1, frames, 160]` of the clip the mask marks, zero past it: what the runtime feeds the
    encoder graph. The clip is the mask's frames and `extra` more, `hop` samples a frame; `pad`:
    zeros each side of it first (the config's `fbank_pad`).

    Two feature frames make a row, and a clip of `v` code frames has exactly `2 v` of them in
    both codecs' alignments (models/neucodec_config.py), so the mask, repeated twice, marks the
    frames each mel bin is normalised over (sample variance, as runtime/fbank.py)."""

    def __init__(self, pad: int, hop: int, extra: int):
        super().__init__()
        self.pad, self.hop, self.extra = pad, hop, extra
        self.register_buffer("basis", torch.from_numpy(_frame_basis())[:, None], persistent=False)
        self.register_buffer("filters", torch.from_numpy(fb.mel_filters().T.copy()), persistent=False)

    def forward(self, audio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        frames = mask.shape[-1]
        # The clip's samples only (its code frames and the acoustic frames past them): the
        # features' last frames reach past the clip, where the runtime's see the official zeros.
        clip = torch.cat([torch.ones_like(mask[..., :1])] * self.extra + [mask], -1)
        x = audio * torch.stack([clip] * self.hop, -1).reshape(1, 1, -1)
        x = F.pad(x, (self.pad, self.pad)) if self.pad else x
        spec = F.conv1d(x * float(1 << 15), self.basis, stride=fb.HOP)[..., :fb.STRIDE * frames]
        re, im = spec.chunk(2, dim=1)
        mel = torch.log(torch.clamp(self.filters @ (re * re + im * im), min=fb.MEL_FLOOR))  # [1, MELS, 2F]
        m = torch.stack([mask] * fb.STRIDE, -1).reshape(1, 1, fb.STRIDE * frames)
        count = m.sum(-1, keepdim=True)
        centred = (mel - (mel * m).sum(-1, keepdim=True) / count) * m
        var = (centred * centred).sum(-1, keepdim=True) / (count - 1)
        x = centred / torch.sqrt(var + 1e-7)
        return x.transpose(1, 2).reshape(1, frames, fb.FEATURES)


def _floor_mod2(x: torch.Tensor) -> torch.Tensor:
    return x - 2 * torch.floor(x / 2)


class FsqOps(nn.Module):
    """runtime/fsq.py's `Fsq` on tensors: `indices` (latent -> int32 codes, bit for bit the
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
        """`[..., dim]` float32 -> `[...]` int32 codes. Round half to even from Floor: `x - floor(x)`
        is exact in float32, so the tie test is too."""
        x = self._bound(self._bound(z))
        f = torch.floor(x)
        d = x - f
        up = (d > 0.5).float() + (d == 0.5).float() * _floor_mod2(f)
        return ((f + up + self.half_width) * self.basis).sum(-1).to(torch.int32)

    def levels(self, codes: torch.Tensor) -> torch.Tensor:
        """int32 codes `[...]` -> levels `[..., dim]` in [-1, 1). The digits are
        `floor(c / b) - l * floor(c / (b l))` in float32: codes below 2^24 are exact there, and
        so is the floor of their correctly rounded quotients (tests/test_fsq.py checks every code)."""
        c = codes.float()[..., None]
        digits = torch.floor(c / self.basis) - self.radix * torch.floor(c / (self.basis * self.radix))
        return (digits - self.half_width) / self.half_width
