"""Receptive fields of the non-causal codecs (DAC, SNAC), from their configs alone (no torch).

A layer is a `Conv(kernel, stride, dilation, pad)`, an `UpConv(stride, pad)` (transposed conv of
kernel 2*stride, output sample `o` reading input frames `(o + pad) // stride` and the one
before) or a `Window(size)` (attention within fixed, non-overlapping windows of positions).
Walking a graph's layers backwards from one output position gives the exact span of input
positions it reads: how far a window's kept centre must stay from the window's edges for its
outputs to equal those of the whole clip.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Conv:
    kernel: int
    stride: int = 1
    dilation: int = 1
    pad: int = 0


@dataclass(frozen=True)
class UpConv:
    stride: int
    pad: int


@dataclass(frozen=True)
class Window:
    size: int


def _back(layers, lo: int, hi: int) -> tuple[int, int]:
    """Input positions [lo', hi'] that output positions [lo, hi] of `layers` read."""
    for layer in reversed(layers):
        if isinstance(layer, Conv):
            lo = layer.stride * lo - layer.pad
            hi = layer.stride * hi - layer.pad + layer.dilation * (layer.kernel - 1)
        elif isinstance(layer, UpConv):
            lo = (lo + layer.pad) // layer.stride - 1
            hi = (hi + layer.pad) // layer.stride
        else:
            lo = layer.size * (lo // layer.size)
            hi = layer.size * (hi // layer.size) + layer.size - 1
    return lo, hi


def encoder_margin(layers, hop: int, unit: int) -> int:
    """Latent frames an encoder window must keep clear of its edges (a multiple of `unit`):
    latent frame f reads audio samples [f*hop - left, f*hop + hop - 1 + right]."""
    f = 1000 * unit  # far from the start, on a window boundary
    lo, hi = _back(layers, f, f)
    reach = max(f * hop - lo, hi - (f * hop + hop - 1), 0)
    return unit * math.ceil(math.ceil(reach / hop) / unit)


def decoder_margin(layers, hop: int, unit: int) -> int:
    """Latent frames a decoder window must keep clear of its edges (a multiple of `unit`):
    the audio of latent frame f reads frames [f - left, f + right]."""
    f = 1000 * unit
    lo, hi = _back(layers, f * hop, f * hop + hop - 1)
    reach = max(f - lo, hi - f, 0)
    return unit * math.ceil(reach / unit)


def unpadded_length(layers, n: int) -> int:
    """Output positions of `layers` for `n` input positions with their padding off (DAC's chunked
    mode: the official `get_output_length`)."""
    for layer in layers:
        if isinstance(layer, Conv):
            n = (n - layer.dilation * (layer.kernel - 1) - 1) // layer.stride + 1
        elif isinstance(layer, UpConv):
            n = (n - 1) * layer.stride + 2 * layer.stride
    return n


def unpadded_delay(layers) -> int:
    """Zeros the official chunked mode pads on each side of the signal so that `layers` with their
    padding off give out what went in (the official `get_delay`)."""
    l_out = n = unpadded_length(layers, 0)
    for layer in reversed(layers):
        if isinstance(layer, Conv):
            n = (n - 1) * layer.stride + layer.dilation * (layer.kernel - 1) + 1
        elif isinstance(layer, UpConv):
            n = math.ceil((n - 2 * layer.stride) / layer.stride + 1)
    return (n - l_out) // 2


def residual_units(dilations=(1, 3, 9)) -> list:
    """The three residual units of a DAC/SNAC block: a k7 conv of each dilation, then a 1x1."""
    return [c for d in dilations for c in (Conv(7, dilation=d, pad=3 * d), Conv(1))]


def strided(stride: int) -> Conv:
    """The downsampling conv of a DAC/SNAC encoder block."""
    return Conv(2 * stride, stride, pad=math.ceil(stride / 2))
