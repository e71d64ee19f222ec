"""NeuCodec's encoder layers in torch (the acoustic encoder, the semantic encoder): official key
names under `CodecEnc.` and `SemanticEncoder_module.`; codecs/neucodec/model.py assembles them."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...models.layers import FrameMask, PaddedConv1d, edge_pad, zero_pad
from .config import NeuCodecConfig


# ---- the acoustic encoder ----------------------------------------------------------------
def kaiser_sinc(kernel: int = 12, ratio: int = 2) -> torch.Tensor:
    """alias_free_torch's `kaiser_sinc_filter1d(0.5 / ratio, 0.6 / ratio, kernel)`: `[1, 1, kernel]`."""
    cutoff, half_width = 0.5 / ratio, 0.6 / ratio
    half = kernel // 2
    a = 2.285 * (half - 1) * np.pi * 4 * half_width + 7.95
    beta = (0.1102 * (a - 8.7) if a > 50
            else (0.5842 * (a - 21) ** 0.4 + 0.07886 * (a - 21) if a >= 21 else 0.0))
    window = torch.kaiser_window(kernel, beta=beta, periodic=False)
    t = torch.arange(-half, half) + 0.5 if kernel % 2 == 0 else torch.arange(kernel) - half
    f = 2 * cutoff * window * torch.sinc(2 * cutoff * t)
    return (f / f.sum()).view(1, 1, kernel)


def hold_last(x: torch.Tensor, mask: FrameMask | None) -> torch.Tensor:
    """`x` `[B, C, T]` with the positions past a shorter clip holding the clip's last sample, as
    the replicate padding of the official filters pads the clip alone."""
    if mask is None:
        return x
    m = mask(x.shape[-1])
    last = m - zero_pad(m[..., 1:], 0, 1)  # 1.0 at the clip's last position
    return x * m + (x * last).sum(-1, keepdim=True) * (1.0 - m)


class UpSample1d(nn.Module):
    """x2 with the kaiser-sinc filter after replicate padding: the official transposed conv,
    written as its two phases (a 6-tap depthwise conv each) interleaved."""

    def __init__(self):
        super().__init__()
        self.register_buffer("filter", kaiser_sinc())
        self.mask: FrameMask | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = hold_last(x, self.mask)
        b, c, t = x.shape
        f = self.filter.reshape(-1)  # 12 taps
        # y[2m + p] = sum_k f[2k + p] x[m - k]: phase p is a conv with taps f[2(5 - j) + p].
        w = torch.stack([f[[2 * (5 - j) + p for j in range(6)]] for p in range(2)])  # [2, 6]
        x = zero_pad(edge_pad(x, 5, 5), 5, 5)
        y = F.conv1d(x, w[None].expand(c, 2, 6).reshape(2 * c, 1, 6), groups=c)  # [B, 2C, T + 15]
        y = y.reshape(b, c, 2, -1).transpose(2, 3).reshape(b, c, -1)
        return 2 * y[..., 15:15 + 2 * t]


class LowPassFilter1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("filter", kaiser_sinc())
        self.mask: FrameMask | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = hold_last(x, self.mask)
        c = x.shape[1]
        return F.conv1d(edge_pad(x, 5, 6), self.filter.expand(c, -1, -1), stride=2, groups=c)


class DownSample1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.lowpass = LowPassFilter1d()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lowpass(x)


class SnakeBeta(nn.Module):
    """`x + sin^2(x e^alpha) / (e^beta + 1e-9)` per channel (alpha, beta in log scale)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.sin(x * torch.exp(self.alpha)[:, None])
        return x + (torch.exp(self.beta)[:, None] + 1e-9).reciprocal() * (s * s)


class Activation1d(nn.Module):
    """Anti-aliased activation: x2 up, SnakeBeta, x2 down (alias_free_torch)."""

    def __init__(self, channels: int):
        super().__init__()
        self.act = SnakeBeta(channels)
        self.upsample = UpSample1d()
        self.downsample = DownSample1d()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(self.act(self.upsample(x)))


class EncResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(Activation1d(dim),
                                   PaddedConv1d(dim, dim, 7, dilation=dilation, pad=3 * dilation),
                                   Activation1d(dim), PaddedConv1d(dim, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int):
        super().__init__()
        self.block = nn.Sequential(*[EncResidualUnit(dim // 2, d) for d in (1, 3, 9)], Activation1d(dim // 2),
                                   PaddedConv1d(dim // 2, dim, 2 * stride, stride=stride,
                                                pad=stride // 2 + stride % 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class CodecEncoder(nn.Module):
    """16 kHz audio `[B, 1, N]` -> `[B, N / prod(strides), hidden]` (keys `CodecEnc.*`)."""

    def __init__(self, cfg: NeuCodecConfig):
        super().__init__()
        d = cfg.enc_channels
        blocks: list[nn.Module] = [PaddedConv1d(1, d, 7, pad=3)]
        for stride in cfg.enc_strides:
            d *= 2
            blocks.append(EncoderBlock(d, stride))
        self.conv_blocks = nn.Sequential(*blocks)
        self.conv_final_block = nn.Sequential(Activation1d(d), PaddedConv1d(d, cfg.hidden, 3, pad=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_final_block(self.conv_blocks(x)).transpose(1, 2)


class SemanticEncoder(nn.Module):
    """w2v-BERT's 16th hidden state `[B, C, T]` -> `[B, C, T]`: a conv, a residual pair of convs
    behind ReLUs, a conv (k = 3, "same"). The official residual block starts with an in-place
    ReLU, which rectifies the skip too: the sum is `block(x) + relu(x)`, kept here."""

    def __init__(self, dim: int, inner: int | None = None):
        super().__init__()
        inner = inner or dim  # the distilled variant's is wider than its ends
        self.initial_conv = PaddedConv1d(dim, inner, 3, pad=1, bias=False)
        self.residual_blocks = nn.Sequential(nn.ReLU(), PaddedConv1d(inner, inner, 3, pad=1), nn.ReLU(),
                                             PaddedConv1d(inner, inner, 3, pad=1))
        self.final_conv = PaddedConv1d(inner, dim, 3, pad=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.initial_conv(x))
        return self.final_conv(self.residual_blocks(x) + x)
