"""Mimi's causal transformer (moshi `ProjectedTransformer` with d_model = input dim).

Module and parameter names mirror moshi's, so its checkpoint keys load as they are. Attention is
written out as MatMul/Softmax with an explicit mask, so the same code gives the whole-clip graph
and the step graph with a fixed-size KV window passed in and out as state.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...models.streaming import StreamState


def apply_rope(x: torch.Tensor, pos: torch.Tensor, max_period: float) -> torch.Tensor:
    """Interleaved RoPE as moshi: pairs (2i, 2i+1) rotate by `pos * max_period^(-2i/D)`.

    x `[B, H, T, D]`, pos `[T]` (every row alike) or `[B, T]` (each row its own) float32
    positions. The frequencies are computed with moshi's
    formula (exp of a log), not transformers' `1/base**x`, so the angles match to the ulp.
    """
    d = x.shape[-1]
    freqs = torch.exp(torch.arange(d // 2, dtype=torch.float32) * (-math.log(max_period) * 2 / d))
    ang = pos[..., None] * freqs  # [T, D/2] or [B, T, D/2]
    if ang.dim() == 3:
        ang = ang[:, None]  # [B, 1, T, D/2]: every head alike
    cos, sin = torch.cos(ang), torch.sin(ang)
    xr, xi = x.reshape(*x.shape[:-1], d // 2, 2).unbind(-1)  # Split, not Gather (CoreML)
    return torch.stack([xr * cos - xi * sin, xr * sin + xi * cos], dim=-1).reshape(x.shape)


class WindowAttention(nn.Module):
    """Causal multi-head self-attention over a sliding context of `context` positions, its
    projections and rotary embedding left to a subclass (`project`, `rotate`, `output`): Mimi's
    (`Attention`, below) and the decoders built on Mimi's (Qwen3-TTS's, codecs/qwen3tts/).

    A key at position k is visible from a query at q iff `0 <= q - k < context` (moshi's mask).
    Streaming keeps the last `context` rotated keys and values as state `[B, 2, H, context, D]`:
    by default a shifted window (the state out is the state in with the step's rows appended and
    the oldest dropped), so the step graph needs no scatter and every shape stays static. Under
    `StreamState.ring`, a ring instead: position p lives in row p mod context, the graph reads
    the state where it lies and puts out only the step's new rows (`[B, 2, H, t, D]`), which the
    caller writes in place at the rows it gave as `ring_at` (`[B, t]`); copying the whole cache in
    and out of the graph was a quarter of an 8-stream step. Either way rows holding positions
    before 0 are masked out, and each batch row is a stream of its own, at its own `offset`
    (`[B]`): its own rotary positions and mask.

    `moshi_ring` (streaming only) reproduces moshi's own streaming mode instead: its ring cache
    holds `context` entries *after* a step's new positions are written, so a step's earlier
    positions lose their oldest keys, and streaming codes drift from whole-clip ones after
    `context` positions. Off by default: then streaming equals the whole clip exactly.
    """

    def __init__(self, heads: int, head_dim: int, context: int):
        super().__init__()
        self.heads, self.head_dim, self.context = heads, head_dim, context
        self.stream: StreamState | None = None
        self.state_name = ""
        self.moshi_ring = False

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v `[B, H, T, D]` of `x` `[B, T, C]`."""
        raise NotImplementedError

    def rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of `x` `[B, H, T, D]` at float positions `pos` `[T]` or `[B, T]`."""
        raise NotImplementedError

    def output(self, y: torch.Tensor) -> torch.Tensor:
        """`[B, T, H * D]` -> the layer's output `[B, T, C]`."""
        raise NotImplementedError

    def state_shape(self) -> tuple[int, ...]:
        return (1, 2, self.heads, self.context, self.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t = x.shape[:2]
        q, k, v = self.project(x)
        steps = torch.arange(t, dtype=torch.float32)
        if self.stream is None:
            pos_q = pos_k = steps
            q, k = self.rotate(q, pos_q), self.rotate(k, pos_k)
        else:
            c, ring = self.context, self.stream.ring
            offset = self.stream.offset.float()[:, None]  # [B, 1], exact: far below 2**24
            pos_q = offset + steps  # [B, T]
            # Cached keys are already rotated; rotate only the new ones.
            q, k = self.rotate(q, pos_q), self.rotate(k, pos_q)
            cache = self.stream.inputs[self.state_name]
            if ring:
                # Row j holds the one position p of the last `context` with p = j (mod context);
                # the caller writes this step's keys and values at rows `ring_at` (offset + i,
                # mod context: it gives them, as ONNX's Mod is not in every provider's op table).
                r = self.stream.ring_at[:, :1].float()  # offset mod context, [B, 1]
                j = torch.arange(c, dtype=torch.float32)
                back = j - r + c * (r - j).clamp(0, 1)  # (j - offset) mod context, no comparison op
                pos_cache = offset - c + back
                self.stream.outputs[self.state_name] = torch.stack([k, v], 1)
            else:
                # The window `[B, 2, H, context + t, D]`: the state with this step's keys and
                # values appended; the last `context` of it go out.
                pos_cache = offset - c + torch.arange(c, dtype=torch.float32)
                window = torch.cat([cache, torch.stack([k, v], 1)], dim=3)
                self.stream.outputs[self.state_name] = window[:, :, :, t:]
            pos_k = torch.cat([pos_cache, pos_q], 1)
        # Visibility as 0/1 floats from clamps rather than comparisons (none in CoreML's ML
        # Program); positions are whole numbers, so clamp(n, 0, 1) is 1 iff n >= 1.
        delta = pos_q[..., :, None] - pos_k[..., None, :]  # [T, S] or [B, T, S]
        visible = ((delta + 1).clamp(0, 1) * (self.context - delta).clamp(0, 1)
                   * (pos_k + 1).clamp(0, 1)[..., None, :])
        if self.stream is not None and self.moshi_ring:
            visible = visible * (pos_k - pos_q[..., -1:] + self.context).clamp(0, 1)[..., None, :]
        if visible.dim() == 3:
            visible = visible[:, None]  # [B, 1, T, S]: every head alike
        # A finite -3e4 rather than -inf: exp() of it is exactly 0 all the same, and it stays
        # finite in fp16, where 0 * inf would give NaN for the visible keys.
        mask = (visible - 1) * 3e4
        norm = math.sqrt(self.head_dim)
        if self.stream is None:
            scores = torch.matmul(q, k.transpose(2, 3)) / norm + mask
            y = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, H, T, D]
        elif not ring:
            # K and V are read straight out of the stacked window by batched MatMuls over both
            # halves, keeping the unwanted half (t x (context + t) values): slicing K and V out
            # and stacking them back copied the whole cache three more times a step (1.3 ms of
            # the preset's 13 ms one-frame step on 2 cores).
            scores = torch.matmul(q[:, None], window.transpose(-1, -2)).unbind(1)[0] / norm + mask
            y = torch.matmul(torch.softmax(scores, dim=-1)[:, None], window).unbind(1)[1]
        else:
            # The cache is read where it lies (both halves, as above) and the new keys apart:
            # nothing as large as the cache is written in the graph.
            scores = torch.cat([torch.matmul(q[:, None], cache.transpose(-1, -2)).unbind(1)[0],
                                torch.matmul(q, k.transpose(2, 3))], -1) / norm + mask
            p_cache, p_new = torch.softmax(scores, dim=-1).split([c, t], -1)
            y = torch.matmul(p_cache[:, None], cache).unbind(1)[1] + torch.matmul(p_new, v)
        return self.output(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class Attention(WindowAttention):
    """Mimi's attention (moshi's names: `in_proj_weight` holds q, k, v as `(p h d)`), its rotary
    embedding interleaved as moshi's."""

    def __init__(self, dim: int, heads: int, context: int, max_period: float):
        super().__init__(heads, dim // heads, context)
        self.max_period = max_period
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        # Split rather than indexing: CoreML's ML Program has no Gather.
        return tuple(p.transpose(1, 2) for p in F.linear(x, self.in_proj_weight)
                     .reshape(b, t, 3, self.heads, self.head_dim).unbind(2))

    def rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, pos, self.max_period)

    def output(self, y: torch.Tensor) -> torch.Tensor:
        return self.out_proj(y)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class TransformerLayer(nn.Module):
    """`x += ls1 * attn(LN1(x)); x += ls2 * W2 gelu(W1 LN2(x))` (exact erf GELU, no biases)."""

    def __init__(self, dim: int, heads: int, ffn: int, context: int, max_period: float):
        super().__init__()
        self.self_attn = Attention(dim, heads, context, max_period)
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.linear1 = nn.Linear(dim, ffn, bias=False)
        self.linear2 = nn.Linear(ffn, dim, bias=False)
        self.layer_scale_1 = LayerScale(dim)
        self.layer_scale_2 = LayerScale(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.layer_scale_1(self.self_attn(self.norm1(x)))
        return x + self.layer_scale_2(self.linear2(F.gelu(self.linear1(self.norm2(x)))))


class _Layers(nn.Module):
    def __init__(self, layers: list[TransformerLayer]):
        super().__init__()
        self.layers = nn.ModuleList(layers)


class Transformer(nn.Module):
    """`[B, C, T]` -> `[B, C, T]` (moshi's conv layout), keys `transformer.layers.{i}.*`."""

    def __init__(self, dim: int, heads: int, layers: int, ffn: int, context: int, max_period: float):
        super().__init__()
        self.transformer = _Layers([TransformerLayer(dim, heads, ffn, context, max_period)
                                    for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.transpose(1, 2)
        for layer in self.transformer.layers:
            x = layer(x)
        return x.transpose(1, 2)
