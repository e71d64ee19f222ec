"""Building blocks written for export: explicit padding, polyphase transposed convs, Snake.

Every conv keeps the official padding as data (`pad`) and applies it explicitly, as a Concat with
zeros, so the exported `Conv` nodes carry zero `pads`: execution providers disagree on how they
pad (CoreML, DirectML, MLX), and CoreML's ML Program takes Concat but not Pad.
`set_padding(model, False)` reproduces the official "padding off" chunked mode.

`set_mask(model, mask)` makes the same convs compute what the official model computes on a
shorter clip placed inside the graph's window: the input of every padding conv is multiplied by
the window's valid positions, so the zeros a conv pads with at the clip's edges are there even
when the clip does not reach the window's edges (see `FrameMask`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def zero_pad(x: torch.Tensor, left: int, right: int = 0) -> torch.Tensor:
    """`F.pad(x, (left, right))` on the last axis, traced as a Concat with constant zeros."""
    parts = [x]
    if left:
        parts.insert(0, x.new_zeros(*x.shape[:-1], left))
    if right:
        parts.append(x.new_zeros(*x.shape[:-1], right))
    return torch.cat(parts, -1) if len(parts) > 1 else x


def edge_pad(x: torch.Tensor, left: int, right: int = 0) -> torch.Tensor:
    """Replicate padding on the last axis, traced as a Concat of the edge samples tiled (Pad in
    edge mode and Expand are not portable across EPs)."""
    parts = [x[..., :1].repeat(1, 1, left)] if left else []
    parts += [x] + ([x[..., -1:].repeat(1, 1, right)] if right else [])
    return torch.cat(parts, -1) if len(parts) > 1 else x


class Snake(nn.Module):
    """Snake activation `x + sin(alpha x)^2 / (alpha + 1e-9)` per channel, on `[B, C, T]`.

    `flat` is TSAC's `snake_s` instead: alpha is indexed by the flat channel-major position of
    each sample in the `[C, T]` buffer, `alpha[(c*T + t) mod len(alpha)]`, clamped to 1e-6, and
    divided by as is. That makes it depend on the length of the call, as TSAC's does.
    """

    def __init__(self, channels: int, flat: bool = False):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))
        self.flat = flat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.flat:
            return self._flat(x)
        s = torch.sin(self.alpha * x)
        # s * s, not s.pow(2): ORT's Pow is a slower kernel than its Mul (SNAC decoder: 44 ms of
        # Pow against 1.1 s in all).
        return x + (self.alpha + 1e-9).reciprocal() * (s * s)

    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        """TSAC's convention. For a channel, alpha repeats every `n = len(alpha)` samples: the
        samples are laid out `[B, C, T/n, n]` against one period `[1, C, 1, n]`, so the graph
        holds constants of `C * n` values, not `C * T` (hundreds of MB for a long decoder)."""
        b, c, t = x.shape[0], x.shape[1], int(x.shape[-1])  # static in the traced graph
        n = self.alpha.numel()
        idx = (torch.arange(c)[:, None] * t + torch.arange(n)[None, :]) % n
        alpha = self.alpha.reshape(-1)[idx].clamp_min(1e-6)[None, :, None]  # [1, C, 1, n]
        xs = zero_pad(x, 0, -t % n).reshape(b, c, -1, n)
        s = torch.sin(alpha * xs)
        y = (xs + alpha.reciprocal() * (s * s)).reshape(b, c, -1)
        return y[..., :t] if t % n else y  # a slice of all of it is an alias, which coremltools refuses


class FrameMask:
    """Valid positions of a window at every resolution of a graph, from its valid latent frames
    `[1, 1, frames]` (1.0 valid, 0.0 outside the clip). A resolution of `r` positions per frame
    repeats each frame's value `r` times: the clip's edges must fall on frame boundaries."""

    def __init__(self, frames: torch.Tensor):
        self.frames = frames
        self._at: dict[int, torch.Tensor] = {}

    def __call__(self, length: int) -> torch.Tensor:
        f = self.frames.shape[-1]
        if length not in self._at:
            r = length // f
            if r * f != length:
                raise ValueError(f"a resolution of {length} positions is not a whole number per "
                                 f"frame of {f} frames")
            # Tile, not Expand: CoreML's ML Program has no Expand. (A nearest Resize, which NNAPI
            # would take too, carries an empty input ORT's CoreML partitioner cannot see as fixed.)
            m = self.frames
            self._at[length] = m if r == 1 else m[..., None].repeat(1, 1, 1, r).reshape(*m.shape[:-1], length)
        return self._at[length]


class PaddedConv1d(nn.Conv1d):
    """Conv1d whose symmetric zero padding `pad` is an explicit op before a pad-free conv."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1,
                 pad: int = 0, bias: bool = True, groups: int = 1):
        super().__init__(c_in, c_out, kernel, stride=stride, dilation=dilation, bias=bias, groups=groups)
        self.pad = pad
        self.use_padding = True
        self.mask: FrameMask | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mask is not None and self.kernel_size[0] > 1:
            x = x * self.mask(x.shape[-1])
        if self.use_padding and self.pad:
            x = zero_pad(x, self.pad, self.pad)
        return super().forward(x)


class UpConv1d(nn.ConvTranspose1d):
    """ConvTranspose1d with kernel `2*stride`, computed either natively or as a polyphase conv.

    Weight layout is the ConvTranspose1d one, `[C_in, C_out, 2s]`. Output sample `j*s + p` only
    sees taps `p` and `p + s`, so each phase `p` is a 2-tap ordinary conv of the input padded by
    one frame on each side; stacking the `s` phases as output channels gives one Conv (one GEMM)
    and a reshape interleaves them. No multiply hits an inserted zero, and no ConvTranspose node
    reaches the graph (DirectML, CoreML NeuralNetwork and mobile GPU delegates reject it).
    """

    def __init__(self, c_in: int, c_out: int, stride: int, pad: int, polyphase: bool = True,
                 output_padding: int = 0):
        super().__init__(c_in, c_out, 2 * stride, stride=stride, output_padding=output_padding)
        self.pad = pad
        self.polyphase = polyphase
        self.use_padding = True
        self.mask: FrameMask | None = None

    def phase_weight(self) -> torch.Tensor:
        """`[C_out * s, C_in, 2]`: row `oc*s + p` holds taps (w[..., p+s], w[..., p])."""
        return polyphase_weight(self.weight, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = self.pad if self.use_padding else 0
        s, extra = self.stride[0], self.output_padding[0]
        if self.mask is not None:
            x = x * self.mask(x.shape[-1])
        if not self.polyphase:
            return F.conv_transpose1d(x, self.weight, self.bias, stride=s, padding=pad, output_padding=extra)
        b, _, t = x.shape
        y = F.conv1d(zero_pad(x, 1, 1), self.phase_weight(), self.bias.repeat_interleave(s))
        # [B, C_out*s, T+1] -> [B, C_out, T+1, s] -> [B, C_out, (T+1)*s]: index j*s + p.
        y = y.reshape(b, self.out_channels, s, t + 1).transpose(2, 3)
        y = y.reshape(b, self.out_channels, (t + 1) * s)
        if pad or extra:  # output_padding: samples kept past the right crop
            y = y[..., pad:(t + 1) * s - pad + extra]
        return y


class ResidualUnit(nn.Module):
    """Snake -> Conv(k7, dilation d) -> Snake -> Conv(k1), plus a centre-cropped skip; the k7
    conv grouped `groups` ways (SNAC's depthwise units)."""

    def __init__(self, dim: int, dilation: int, groups: int = 1):
        super().__init__()
        # Sequential indices mirror the official module, so checkpoint keys map one to one.
        self.block = nn.Sequential(
            Snake(dim), PaddedConv1d(dim, dim, 7, dilation=dilation, pad=3 * dilation, groups=groups),
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


def set_mask(module: nn.Module, mask: FrameMask | None) -> None:
    """Hand `mask` to every layer of `module` that takes one (a `mask` attribute: padding convs,
    and a codec's own masked layers); None: the whole window is the clip."""
    for m in module.modules():
        if "mask" in vars(m):
            m.mask = mask


def polyphase_weight(w: torch.Tensor, groups: int) -> torch.Tensor:
    """ConvTranspose1d weight `[C_in, C_out/g, 2s]` -> Conv1d weight `[C_out*s, C_in/g, 2]`.

    Output sample `j*s + p` only sees taps `p` (input frame j) and `p + s` (frame j-1); row
    `oc*s + p` holds (w[..., p+s], w[..., p]) for the (frame j-1, frame j) pair.
    """
    c_in, c_out_g, k = w.shape
    s = k // 2
    w = w.reshape(groups, c_in // groups, c_out_g, k).transpose(1, 2)  # [g, C_out/g, C_in/g, 2s]
    taps = torch.stack([w[..., s:], w[..., :s]], dim=-1)  # [g, C_out/g, C_in/g, s, 2]
    return taps.permute(0, 1, 3, 2, 4).reshape(groups * c_out_g * s, c_in // groups, 2)


def init_fan_in(model: nn.Module, g: torch.Generator, other=None) -> None:
    """Seeded weights for DAC-style models, scaled so activations stay O(1) (the official init
    makes the decoder output almost constant, which would make parity checks meaningless):
    Snake's alpha in [0.5, 2), codebooks N(0, 1), convs N(0, 1/fan_in), small biases, residual
    branches damped so three units a block do not blow activations up. `other(m, randn)`
    initialises the modules these rules do not cover, in the same pass (the draws stay in order)."""
    def randn(p: torch.Tensor, std: float) -> None:
        p.copy_(torch.randn(p.shape, generator=g) * std)

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, Snake):
                m.alpha.copy_(0.5 + torch.rand(m.alpha.shape, generator=g) * 1.5)
            elif isinstance(m, nn.Embedding):
                randn(m.weight, 1.0)
            elif isinstance(m, nn.Conv1d | nn.ConvTranspose1d):
                # A transposed conv output sees 2 taps of each input channel (kernel = 2 stride).
                fan_in = (m.in_channels // m.groups) * (2 if isinstance(m, UpConv1d) else m.kernel_size[0])
                randn(m.weight, fan_in ** -0.5)
                if m.bias is not None:
                    randn(m.bias, 0.01)
            elif other is not None:
                other(m, randn)
        for m in model.modules():
            if isinstance(m, ResidualUnit):
                m.block[3].weight.mul_(0.3)
