"""Causal convs with explicit streaming state, for step graphs (Mimi's): each stateful module
reads its state from a `StreamState`'s inputs and writes the next to its outputs, so an exported
step graph carries it as plain inputs and outputs; several streams' rows can be folded end to end
into one GEMM (`fold_rows`). The convs keep the padding as data, as layers.py's do."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import edge_pad, polyphase_weight, zero_pad


class StreamState:
    """Streaming state of one call, as named tensors: what the graph takes and what it returns.

    moshi keeps this state hidden inside its modules, which ONNX cannot see. Here every stateful
    module reads `inputs[its name]` and writes `outputs[its name]`, so an exported step graph
    carries the state as plain inputs/outputs. `offset` `[B]` counts the positions each batch row
    (an independent stream) has seen. `ring_at`: attention caches as rings (see `Attention`)."""

    def __init__(self, inputs: dict[str, torch.Tensor], offset: torch.Tensor,
                 ring_at: torch.Tensor | None = None):
        self.inputs, self.outputs, self.offset, self.ring_at = inputs, {}, offset, ring_at
        self.ring = ring_at is not None

    @property
    def rows(self) -> int:
        """Streams this call steps (static in a traced graph)."""
        return int(self.offset.shape[0])

    @property
    def first(self) -> torch.Tensor:
        """1.0 on the first step, else 0.0, computed without comparison ops (CoreML's ML Program
        has none): offset is a whole number >= 0."""
        # [B, 1, 1]: each batch row a stream of its own. Both bounds: no empty optional input.
        return (1 - self.offset.float()).clamp(0, 1).reshape(-1, 1, 1)


def fold_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`[B, C, T]` -> `[1, C, B*T]`: a batch of streams laid end to end on the time axis.

    ONNX Runtime's CPU Conv runs one GEMM per batch row, reading every weight again for each;
    a streaming step's rows are a few frames long, so that reading is most of the cost. Laid end
    to end, the rows make one GEMM as wide as all their frames, and the transposed convs'
    phase interleave one long transpose instead of B short ones (Mimi's 8-stream calls: 1.2x,
    docs/serve.md).
    """
    return x if rows == 1 else x.transpose(0, 1).reshape(1, x.shape[1], -1)


def unfold_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`[1, C, B*T]` -> `[B, C, T]`, undoing `fold_rows`."""
    return x if rows == 1 else x.reshape(x.shape[1], rows, -1).transpose(0, 1)


def conv_rows(conv, x: torch.Tensor, left: int, stride: int) -> torch.Tensor:
    """One conv over B rows, each with its own `left` samples of context: `x` `[C, B, left + T]`
    -> `[1, C_out, B*T/stride]` (folded). The outputs that straddle two rows are computed and
    dropped: `left / (left + T)` of the work, small against reading the weights B times."""
    c, b, n = x.shape
    if left % stride or (n - left) % stride:
        raise ValueError(f"rows of {n - left} + {left} samples do not align with stride {stride}")
    y = zero_pad(conv(x.reshape(1, c, b * n)), 0, left // stride)  # the last row's straddle, as zeros
    m = y.shape[1]
    return y.reshape(m, b, n // stride)[..., :(n - left) // stride].reshape(1, m, -1)


def stream_rows(module: nn.Module) -> int:
    """Rows of the step a module's folded convs are in (1 when not streaming)."""
    for m in module.modules():
        if getattr(m, "folded", False) and m.stream is not None:
            return m.stream.rows
    return 1


def fold_convs(module: nn.Module) -> None:
    """Mark the causal convs inside `module` as taking folded rows (`fold_rows`) when streaming:
    the module folds its input and unfolds its output (`stream_rows`)."""
    for m in module.modules():
        if isinstance(m, (CausalConv1d, CausalUpConv1d)):
            m.folded = True


class _Wrap(nn.Module):
    """Holds one submodule under a given name: the official checkpoints nest convs as
    `conv.conv.weight` / `convtr.convtr.weight`, and mirroring that keeps their keys as is."""

    def __init__(self, name: str, inner: nn.Module):
        super().__init__()
        setattr(self, name, inner)


class CausalConv1d(nn.Module):
    """Causal Conv1d: `k_eff - stride` samples of left context, zeros (or the first sample,
    `replicate`) at the start, and the previous call's tail when streaming.

    Inputs must be a multiple of the stride long (the model pads the audio to whole frames), so
    no right padding is ever needed and streaming equals the whole-clip result.
    """

    folded = False  # streaming input comes as `fold_rows` lays it out (see `fold_convs`)

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1,
                 bias: bool = True, replicate: bool = False, groups: int = 1):
        super().__init__()
        self.conv = _Wrap("conv", nn.Conv1d(c_in, c_out, kernel, stride, dilation=dilation, bias=bias,
                                            groups=groups))
        self.left = (kernel - 1) * dilation + 1 - stride
        self.replicate = replicate
        self.stream: StreamState | None = None
        self.state_name = ""

    def state_shape(self) -> tuple[int, ...] | None:
        """`[1, C_in, left]`: the last input samples, or None when the conv needs no context."""
        return (1, self.conv.conv.in_channels, self.left) if self.left else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.left:
            if self.stream is None:
                x = edge_pad(x, self.left) if self.replicate else zero_pad(x, self.left)
            else:
                rows = self.stream.rows if self.folded else 1
                prev = self.stream.inputs[self.state_name]  # [B, C, left]
                if rows > 1:  # [C, B, T] then: each row takes its own context
                    x, prev = x.reshape(x.shape[1], rows, -1), prev.transpose(0, 1)
                if self.replicate:  # moshi starts the replicate pad from the first frame
                    first = self.stream.first.reshape(1, -1, 1) if rows > 1 else self.stream.first
                    prev = first * x[..., :1].repeat(1, 1, self.left) + (1 - first) * prev
                x = torch.cat([prev, x], -1)
                tail = x[..., -self.left:]
                self.stream.outputs[self.state_name] = tail.transpose(0, 1) if rows > 1 else tail
                if rows > 1:
                    return conv_rows(self.conv.conv, x, self.left, self.conv.conv.stride[0])
        return self.conv.conv(x)


class CausalUpConv1d(nn.Module):
    """Causal ConvTranspose1d with kernel `2*stride`, trimmed right to `T*stride` samples.

    Polyphase (default): a 2-tap conv over input frames (j-1, j) with `C_out*s` output channels,
    reshaped to interleave the phases. That makes it an ordinary causal conv whose streaming state
    is the previous input frame `[1, C_in, 1]`, which carries the same information as moshi's
    output overlap tail (`k - s` samples of every output channel) in fewer numbers.
    """

    folded = False  # as CausalConv1d's

    def __init__(self, c_in: int, c_out: int, stride: int, groups: int = 1, bias: bool = True,
                 polyphase: bool = True):
        super().__init__()
        self.convtr = _Wrap("convtr", nn.ConvTranspose1d(c_in, c_out, 2 * stride, stride,
                                                          groups=groups, bias=bias))
        self.polyphase = polyphase
        self.stream: StreamState | None = None
        self.state_name = ""

    def state_shape(self) -> tuple[int, ...]:
        return (1, self.convtr.convtr.in_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ct = self.convtr.convtr
        s, t = ct.stride[0], x.shape[-1]
        if not self.polyphase:
            if self.stream is not None:
                raise ValueError("streaming needs the polyphase form of the transposed conv")
            return ct(x)[..., :t * s]
        bias = None if ct.bias is None else ct.bias.repeat_interleave(s)
        conv = lambda z: F.conv1d(z, polyphase_weight(ct.weight, ct.groups), bias, groups=ct.groups)
        rows = self.stream.rows if self.stream is not None and self.folded else 1
        if rows > 1:
            t = t // rows
            x = torch.cat([self.stream.inputs[self.state_name].transpose(0, 1),
                           x.reshape(x.shape[1], rows, t)], -1)
            self.stream.outputs[self.state_name] = x[..., -1:].transpose(0, 1)
            y = conv_rows(conv, x, 1, 1)  # [1, C_out*s, B*T]
            return (y.reshape(ct.out_channels, s, rows * t).transpose(1, 2)
                    .reshape(1, ct.out_channels, rows * t * s))
        if self.stream is None:
            x = zero_pad(x, 1)
        else:
            x = torch.cat([self.stream.inputs[self.state_name], x], -1)
            self.stream.outputs[self.state_name] = x[..., -1:]
        y = conv(x)
        b = y.shape[0]
        # [B, C_out*s, T] -> [B, C_out, T, s] -> [B, C_out, T*s]: sample j*s + p.
        return y.reshape(b, ct.out_channels, s, t).transpose(2, 3).reshape(b, ct.out_channels, t * s)


