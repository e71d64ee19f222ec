"""w2v-BERT 2.0's first layers (Meta's conformer speech encoder; transformers' `Wav2Vec2BertModel`),
written for export: the semantic model NeuCodec and XCodec2 read the 16th hidden state of.

Parameter names are transformers' (`feature_projection.projection.weight`,
`encoder.layers.{i}.self_attn.distance_embedding.weight`...), so facebook/w2v-bert-2.0's
`model.safetensors` and the `semantic_model.*` keys of a NeuCodec state dict load as they are.
transformers stays a test dependency: tests/test_w2vbert.py checks this against it.

Its attention adds a learned bias per clamped relative distance (`relative_key`: keys up to 64
frames behind and 8 ahead, the rest clamped). transformers looks the bias up as a `[T, T, head]`
table, which a static export turns into a constant of T² entries per layer (a gigabyte for 16
layers of 10 s); here each query's products with the 73 distance embeddings are widened to every
distance of the window by repeating the clamped ends and skewed into place with static slices and
reshapes (Transformer-XL's relative shift), so the graph holds the tables only.

`mask` `[1, 1, T]` (1.0 on the clip's frames) hides the frames past a clip shorter than the graph
from the attention's keys; the convolution is causal, so frames past the clip never reach the
clip's own, and the clip's frames come out as transformers computes them on the clip alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...models.layers import zero_pad
from .w2vbert_config import W2vBertConfig


class FeedForward(nn.Module):
    def __init__(self, cfg: W2vBertConfig):
        super().__init__()
        self.intermediate_dense = nn.Linear(cfg.hidden, cfg.intermediate)
        self.output_dense = nn.Linear(cfg.intermediate, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_dense(F.silu(self.intermediate_dense(x)))


def relative_bias(q: torch.Tensor, table: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """`q . table[clamp(r - l, -left, right) + left]` for every query `l` and key `r`: `[B, H, T, T]`
    from `q` `[B, H, T, D]` and the distance embeddings `[left + right + 1, D]`."""
    t = q.shape[2]
    per = torch.matmul(q, table.t())  # [B, H, T, left + right + 1]: one column per distance
    if t == 1:  # one frame: distance 0 only (the skew below needs two)
        return per[..., left:left + 1]
    # Columns for distances -(T-1) .. T-1: the clamped ends repeated (or cut, for a short window).
    lo, hi = min(left, t - 1), min(right, t - 1)
    cols = per[..., left - lo:left + hi + 1]
    parts = [per[..., :1].repeat(1, 1, 1, t - 1 - lo)] if t - 1 > lo else []
    parts += [cols] + ([per[..., -1:].repeat(1, 1, 1, t - 1 - hi)] if t - 1 > hi else [])
    wide = torch.cat(parts, -1) if len(parts) > 1 else cols  # [B, H, T, 2T - 1]
    # Row l needs columns T-1-l .. 2T-2-l: in the flattened rows that is a stride of 2T-2 from T-1.
    b, h = q.shape[:2]
    flat = wide.reshape(b, h, t * (2 * t - 1))[..., t - 1:t - 1 + t * (2 * t - 2)]
    return flat.reshape(b, h, t, 2 * t - 2)[..., :t]


class SelfAttention(nn.Module):
    def __init__(self, cfg: W2vBertConfig):
        super().__init__()
        self.heads, self.left, self.right = cfg.heads, cfg.left, cfg.right
        self.linear_q = nn.Linear(cfg.hidden, cfg.hidden)
        self.linear_k = nn.Linear(cfg.hidden, cfg.hidden)
        self.linear_v = nn.Linear(cfg.hidden, cfg.hidden)
        self.linear_out = nn.Linear(cfg.hidden, cfg.hidden)
        self.distance_embedding = nn.Embedding(cfg.left + cfg.right + 1, cfg.hidden // cfg.heads)

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor | None) -> torch.Tensor:
        b, t, c = x.shape
        d = c // self.heads
        q, k, v = (lin(x).reshape(b, t, self.heads, d).transpose(1, 2)
                   for lin in (self.linear_q, self.linear_k, self.linear_v))
        scale = d ** -0.5
        scores = torch.matmul(q, k.transpose(2, 3)) * scale
        scores = scores + relative_bias(q, self.distance_embedding.weight, self.left, self.right) * scale
        if key_bias is not None:
            scores = scores + key_bias
        y = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.linear_out(y.transpose(1, 2).reshape(b, t, c))


class ConvolutionModule(nn.Module):
    def __init__(self, cfg: W2vBertConfig):
        super().__init__()
        h = cfg.hidden
        self.layer_norm = nn.LayerNorm(h, eps=cfg.eps)
        self.pointwise_conv1 = nn.Conv1d(h, 2 * h, 1, bias=False)
        self.depthwise_conv = nn.Conv1d(h, h, cfg.kernel, groups=h, bias=False)
        self.depthwise_layer_norm = nn.LayerNorm(h, eps=cfg.eps)
        self.pointwise_conv2 = nn.Conv1d(h, h, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.glu(self.pointwise_conv1(self.layer_norm(x).transpose(1, 2)), dim=1)
        y = self.depthwise_conv(zero_pad(y, self.depthwise_conv.kernel_size[0] - 1))  # causal
        y = F.silu(self.depthwise_layer_norm(y.transpose(1, 2)).transpose(1, 2))
        return self.pointwise_conv2(y).transpose(1, 2)


class ConformerLayer(nn.Module):
    def __init__(self, cfg: W2vBertConfig):
        super().__init__()
        h = cfg.hidden
        self.ffn1_layer_norm = nn.LayerNorm(h, eps=cfg.eps)
        self.ffn1 = FeedForward(cfg)
        self.self_attn_layer_norm = nn.LayerNorm(h, eps=cfg.eps)
        self.self_attn = SelfAttention(cfg)
        self.conv_module = ConvolutionModule(cfg)
        self.ffn2_layer_norm = nn.LayerNorm(h, eps=cfg.eps)
        self.ffn2 = FeedForward(cfg)
        self.final_layer_norm = nn.LayerNorm(h, eps=cfg.eps)

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor | None) -> torch.Tensor:
        x = x + 0.5 * self.ffn1(self.ffn1_layer_norm(x))
        x = x + self.self_attn(self.self_attn_layer_norm(x), key_bias)
        x = x + self.conv_module(x)
        x = x + 0.5 * self.ffn2(self.ffn2_layer_norm(x))
        return self.final_layer_norm(x)


class FeatureProjection(nn.Module):
    def __init__(self, cfg: W2vBertConfig):
        super().__init__()
        self.layer_norm = nn.LayerNorm(cfg.features, eps=cfg.eps)
        self.projection = nn.Linear(cfg.features, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(self.layer_norm(x))


class Encoder(nn.Module):
    def __init__(self, cfg: W2vBertConfig):
        super().__init__()
        self.layers = nn.ModuleList([ConformerLayer(cfg) for _ in range(cfg.layers)])


class W2vBert(nn.Module):
    """fbank features `[B, T, features]` (and the clip's frames `mask` `[B, 1, T]`) -> the last
    layer's hidden state `[B, T, hidden]` (transformers' `hidden_states[layers]`)."""

    def __init__(self, cfg: W2vBertConfig):
        super().__init__()
        self.cfg = cfg
        self.feature_projection = FeatureProjection(cfg)
        self.encoder = Encoder(cfg)

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # Past the clip, a large negative rather than -inf: exp gives exactly 0 either way, and a
        # finite bias keeps an all-masked row (frames past the clip) free of NaN.
        key_bias = None if mask is None else ((mask - 1.0) * 1e9)[:, None]  # [B, 1, 1, T]
        x = self.feature_projection(features)
        for layer in self.encoder.layers:
            x = layer(x, key_bias)
        return x

    # Keys of the full w2v-BERT 2.0 that the first `layers` do not use.
    def unused(self, key: str) -> bool:
        if key.startswith("encoder.layers."):
            return int(key.split(".")[2]) >= self.cfg.layers
        return not key.startswith("feature_projection.")
