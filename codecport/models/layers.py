"""Building blocks written for export: explicit padding, polyphase transposed convs, Snake.

Every conv keeps the official padding as data (`pad`) and applies it with an explicit constant
`Pad`, so the exported `Conv` nodes carry zero `pads`: execution providers
disagree on how they pad (CoreML, DirectML, MLX), and a plain Pad is portable. `set_padding(model,
False)` reproduces the official "padding off" chunked mode.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Snake(nn.Module):
    """Snake activation `x + sin(alpha x)^2 / (alpha + 1e-9)` per channel, on `[B, C, T]`."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class PaddedConv1d(nn.Conv1d):
    """Conv1d whose symmetric zero padding `pad` is an explicit op before a pad-free conv."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1,
                 pad: int = 0, bias: bool = True):
        super().__init__(c_in, c_out, kernel, stride=stride, dilation=dilation, bias=bias)
        self.pad = pad
        self.use_padding = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_padding and self.pad:
            x = F.pad(x, (self.pad, self.pad))
        return super().forward(x)


class UpConv1d(nn.ConvTranspose1d):
    """ConvTranspose1d with kernel `2*stride`, computed either natively or as a polyphase conv.

    Weight layout is the ConvTranspose1d one, `[C_in, C_out, 2s]`. Output sample `j*s + p` only
    sees taps `p` and `p + s`, so each phase `p` is a 2-tap ordinary conv of the input padded by
    one frame on each side; stacking the `s` phases as output channels gives one Conv (one GEMM)
    and a reshape interleaves them. No multiply hits an inserted zero, and no ConvTranspose node
    reaches the graph (DirectML, CoreML NeuralNetwork and mobile GPU delegates reject it).
    """

    def __init__(self, c_in: int, c_out: int, stride: int, pad: int, polyphase: bool = True):
        super().__init__(c_in, c_out, 2 * stride, stride=stride)
        self.pad = pad
        self.polyphase = polyphase
        self.use_padding = True

    def phase_weight(self) -> torch.Tensor:
        """`[C_out * s, C_in, 2]`: row `oc*s + p` holds taps (w[..., p+s], w[..., p])."""
        s = self.stride[0]
        w = self.weight.permute(1, 0, 2)  # [C_out, C_in, 2s]
        taps = torch.stack([w[:, :, s:], w[:, :, :s]], dim=-1)  # [C_out, C_in, s, 2]
        return taps.permute(0, 2, 1, 3).reshape(self.out_channels * s, self.in_channels, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = self.pad if self.use_padding else 0
        s = self.stride[0]
        if not self.polyphase:
            return F.conv_transpose1d(x, self.weight, self.bias, stride=s, padding=pad)
        b, _, t = x.shape
        y = F.conv1d(F.pad(x, (1, 1)), self.phase_weight(), self.bias.repeat_interleave(s))
        # [B, C_out*s, T+1] -> [B, C_out, T+1, s] -> [B, C_out, (T+1)*s]: index j*s + p.
        y = y.reshape(b, self.out_channels, s, t + 1).transpose(2, 3)
        y = y.reshape(b, self.out_channels, (t + 1) * s)
        if pad:
            y = y[..., pad:(t + 1) * s - pad]
        return y


class ResidualUnit(nn.Module):
    """Snake -> Conv(k7, dilation d) -> Snake -> Conv(k1), plus a centre-cropped skip."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        # Sequential indices mirror the official module, so checkpoint keys map one to one.
        self.block = nn.Sequential(
            Snake(dim), PaddedConv1d(dim, dim, 7, dilation=dilation, pad=3 * dilation),
            Snake(dim), PaddedConv1d(dim, dim, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        crop = (x.shape[-1] - y.shape[-1]) // 2
        if crop > 0:  # only with padding off
            x = x[..., crop:-crop]
        return x + y


def set_padding(module: nn.Module, value: bool) -> None:
    """Switch every conv in `module` between official padding and the padding-off chunked mode."""
    for m in module.modules():
        if isinstance(m, (PaddedConv1d, UpConv1d)):
            m.use_padding = value
