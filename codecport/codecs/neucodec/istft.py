"""The inverse STFT of Vocos heads (NeuCodec, XCodec2), written for export.

ONNX has no inverse STFT (onnx/onnx#4777), and the usual stand-ins break where codecport's users
run: a ConvTranspose with a Fourier basis (WebGPU: onnxruntime#22994, fp16 past 2048 outputs
#28976; DirectML; CoreML), or the DFT op (missing from most execution providers). Here the
inverse real DFT is one MatMul with a constant basis (the synthesis window folded in), the
overlap-add is static slices, pads and sums, and the window envelope a constant: ops every
target runs.

`IstftSame.reference` is the official computation (`torch.fft.irfft`, `fold`, the envelope
divided), kept to check the graph form against.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ...models.layers import FrameMask, zero_pad


class IstftSame(nn.Module):
    """Vocos' `ISTFT(padding="same")` with a Hann window of `n_fft`: complex frames `[B, n_fft/2+1,
    T]` (as magnitude and phase) -> audio `[B, T * hop]`. `n_fft` must be a multiple of `hop`
    (Vocos heads use 4x): the overlap-add is then `n_fft / hop` shifted copies of the frames."""

    def __init__(self, n_fft: int, hop: int):
        super().__init__()
        if n_fft % hop or (n_fft - hop) % 2:
            raise ValueError(f"n_fft {n_fft} must be a multiple of hop {hop}, with an even trim")
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)
        self.register_buffer("basis", self._basis(n_fft), persistent=False)
        self.mask: FrameMask | None = None  # a shorter clip's frames (see `forward`)

    @staticmethod
    def _basis(n: int) -> torch.Tensor:
        """`[2 * (n/2+1), n]`: rows for the real parts, then the imaginary parts, such that
        `[re, im] @ basis` is `irfft(re + i im, n) * hann(n)` (norm "backward"). irfft reads only
        the real part of the DC and Nyquist bins, as here (their sine rows are zero)."""
        f = n // 2 + 1
        k, t = np.arange(f)[:, None], np.arange(n)[None, :]
        weight = np.where((k == 0) | (k == n // 2), 1.0, 2.0) / n
        angle = 2 * np.pi * k * t / n  # float64: the basis is exact to float32's last bit
        window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)  # torch.hann_window (periodic)
        basis = np.concatenate([weight * np.cos(angle), -weight * np.sin(angle)]) * window
        return torch.from_numpy(basis.astype(np.float32))

    def envelope(self, frames: int) -> torch.Tensor:
        """`1 / sum of the squared windows` over the kept samples `[frames * hop]` (a constant of
        the graph, computed in float64)."""
        n, h = self.n_fft, self.hop
        w2 = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)) ** 2
        env = np.zeros((frames - 1) * h + n)
        for i in range(frames):
            env[i * h:i * h + n] += w2
        pad = (n - h) // 2
        return torch.from_numpy((1.0 / env[pad:pad + frames * h]).astype(np.float32))

    def overlap_add(self, frames: torch.Tensor) -> torch.Tensor:
        """Frames `[B, T, n]` placed every hop and summed, then trimmed ("same"): `[B, T * hop]`.
        Frame i lands at i*h; split into its n/h blocks of h, block j of every frame is one
        contiguous run shifted by j*h."""
        b, t, n = frames.shape
        h = self.hop
        k = n // h
        blocks = frames.split(h, dim=-1)  # Split, not Gather: CoreML's ML Program has no Gather
        y = sum(zero_pad(blocks[j].reshape(b, t * h), j * h, (k - 1 - j) * h) for j in range(k))
        pad = (n - h) // 2
        return y[:, pad:pad + t * h]

    def forward(self, mag: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        """With a `mask` (a clip of fewer frames than the graph's), the frames past the clip add
        nothing and the envelope is the clip's own, computed in the graph from the mask; the
        samples past the clip are zero."""
        t = mag.shape[-1]
        spec = torch.cat([mag * torch.cos(phase), mag * torch.sin(phase)], 1)  # [B, 2F, T]
        frames = torch.matmul(spec.transpose(1, 2), self.basis)  # [B, T, n]: windowed frames
        if self.mask is None:
            return self.overlap_add(frames) * self.envelope(t)
        valid = self.mask(t).transpose(1, 2)  # [1, T, 1]
        envelope = self.overlap_add(self.window.square() * valid)  # [1, T * hop]
        kept = self.mask(t * self.hop).flatten(1)  # [1, T * hop]; not [:, 0], a Gather
        # Past the clip the envelope may be 0: add 1 there so nothing is NaN, then zero it.
        return self.overlap_add(frames * valid) / (envelope + (1.0 - kept)) * kept

    def reference(self, mag: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        """The official computation (neucodec / Vocos `ISTFT.forward`, padding "same")."""
        spec = mag * (torch.cos(phase) + 1j * torch.sin(phase))
        _, _, t = spec.shape
        n, h = self.n_fft, self.hop
        pad = (n - h) // 2
        frames = torch.fft.irfft(spec, n, dim=1, norm="backward") * self.window[None, :, None]
        size = (t - 1) * h + n
        fold = lambda x: torch.nn.functional.fold(x, output_size=(1, size), kernel_size=(1, n),
                                                  stride=(1, h))
        y = fold(frames)[:, 0, 0, pad:-pad]
        env = fold(self.window.square().expand(1, t, -1).transpose(1, 2)).squeeze()[pad:-pad]
        return y / env

    def samples(self, frames: int) -> int:
        return frames * self.hop

    def flops(self, frames: int) -> int:
        """Multiply-adds of the MatMul, the bulk of the work."""
        return frames * 2 * (self.n_fft // 2 + 1) * self.n_fft

    def __repr__(self) -> str:
        return f"IstftSame(n_fft={self.n_fft}, hop={self.hop}, overlap={math.ceil(self.n_fft / self.hop)})"
