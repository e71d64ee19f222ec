"""The distilled NeuCodec's encoder in torch (`neuphonic/distill-neucodec`), written for export:
DistilHuBERT (the semantic model) and `DistillCodecEncoder` (the acoustic one), under the
official key names (`semantic_model.`, transformers' HubertModel's; `codec_encoder.`). Sizes in
codecs/neucodec/distill_config.py; codecs/neucodec/model.py assembles them with NeuCodec's decoder.

Both take a `mask` (`FrameMask`, layers.py) for a clip shorter than the graph, and then give what
the official model gives on the clip alone:
- HuBERT's GroupNorm (one group a channel: statistics over time) counts the clip's conv frames
  only, its position conv sees zeros past the clip, its attention the clip's keys;
- the acoustic stem's pools and every conv with reach see zeros past the clip, and GRN's norm
  is over the clip's frames. Its local attention is causal (lucidrains' `local-attention`:
  each position attends to itself and what precedes it in its window and the window before),
  so what lies past the clip never reaches the clip's frames and needs no mask.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...models.layers import FrameMask, PaddedConv1d, zero_pad
from .distill_config import DistillConfig, HubertConfig


def _masked(x: torch.Tensor, mask: FrameMask | None) -> torch.Tensor:
    return x if mask is None else x * mask(x.shape[-1])


# ---- DistilHuBERT ------------------------------------------------------------------------
class HubertConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, norm: bool):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride=stride, bias=False)
        if norm:  # GroupNorm(c_out, c_out): each channel normalised over time
            self.layer_norm = nn.GroupNorm(c_out, c_out, affine=True)


class HubertAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.v_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None) -> torch.Tensor:
        b, t, c = x.shape
        split = lambda y: y.reshape(b, t, self.heads, c // self.heads).transpose(1, 2)
        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        scores = q @ k.transpose(-1, -2) * (c // self.heads) ** -0.5
        if keys is not None:  # exp(-1e9) is exactly 0, without NaN in empty rows
            scores = scores + (keys - 1.0)[:, None] * 1e9
        return self.out_proj((torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, t, c))


class HubertFeedForward(nn.Module):
    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.intermediate_dense, self.output_dense = nn.Linear(dim, inner), nn.Linear(inner, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_dense(F.gelu(self.intermediate_dense(x)))


class HubertLayer(nn.Module):
    """transformers' HubertEncoderLayer (post-norm)."""

    def __init__(self, cfg: HubertConfig):
        super().__init__()
        self.attention = HubertAttention(cfg.hidden, cfg.heads)
        self.layer_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.feed_forward = HubertFeedForward(cfg.hidden, cfg.intermediate)
        self.final_layer_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)

    def forward(self, x: torch.Tensor, keys: torch.Tensor | None) -> torch.Tensor:
        x = self.layer_norm(x + self.attention(x, keys))
        return self.final_layer_norm(x + self.feed_forward(x))


class Hubert(nn.Module):
    """transformers' `HubertModel` (`feat_extract_norm="group"`, post-norm layers) in eval:
    the feature extractor's `input_values` `[B, n]` -> `last_hidden_state` `[B, frames, hidden]`,
    one frame per `prod(conv_strides)` samples."""

    def __init__(self, cfg: HubertConfig):
        super().__init__()
        self.cfg = cfg
        dims = [1] + [cfg.conv_dim] * len(cfg.conv_kernels)
        self.feature_extractor = nn.Module()
        self.feature_extractor.conv_layers = nn.ModuleList(
            HubertConv(dims[i], dims[i + 1], k, s, norm=i == 0)
            for i, (k, s) in enumerate(zip(cfg.conv_kernels, cfg.conv_strides)))
        self.feature_projection = nn.Module()
        self.feature_projection.layer_norm = (nn.LayerNorm(cfg.conv_dim, eps=cfg.eps) if cfg.proj_norm
                                              else nn.Identity())
        self.feature_projection.projection = nn.Linear(cfg.conv_dim, cfg.hidden)
        self.encoder = nn.Module()
        self.encoder.pos_conv_embed = nn.Module()
        self.encoder.pos_conv_embed.conv = PaddedConv1d(cfg.hidden, cfg.hidden, cfg.pos_kernel,
                                                        pad=cfg.pos_kernel // 2, groups=cfg.pos_groups)
        self.encoder.layer_norm = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.encoder.layers = nn.ModuleList(HubertLayer(cfg) for _ in range(cfg.layers))
        self.mask: FrameMask | None = None  # the clip's frames, at the output rate

    @staticmethod
    def unused(key: str) -> bool:
        """Keys of transformers' HubertModel with no use in inference (the masked-prediction
        embedding)."""
        return key == "masked_spec_embed"

    def _first_frames(self, length: int) -> torch.Tensor:
        """The clip's frames after the first conv, `[B, 1, length]`: the conv stack loses
        `receptive field - hop` samples' worth of them at the end, so the clip's `v` frames
        there are `v * r + extra`, the mask shifted by `extra` (`r`: first-conv frames a frame)."""
        m, frames = self.mask, self.mask.frames.shape[-1]
        r = math.prod(self.cfg.conv_strides[1:])
        extra = length - r * frames
        ones = torch.ones_like(m.frames[..., :1]).repeat(1, 1, extra)
        return torch.cat([ones, m(r * frames)], -1) if extra else m(length)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        x = values[:, None]
        for i, layer in enumerate(self.feature_extractor.conv_layers):
            x = layer.conv(x)
            if i == 0:
                x = self._group_norm(x, layer.layer_norm)
            x = F.gelu(x)
        x = self.feature_projection.projection(self.feature_projection.layer_norm(x.transpose(1, 2)))
        keys = None if self.mask is None else self.mask(x.shape[1])  # [B, 1, T]
        pos = self.encoder.pos_conv_embed.conv(x.transpose(1, 2))  # zeros past the clip (its mask)
        x = x + F.gelu(pos[..., :x.shape[1]]).transpose(1, 2)  # an even kernel: its last output dropped
        x = self.encoder.layer_norm(x)
        for layer in self.encoder.layers:
            x = layer(x, keys)
        return x

    def _group_norm(self, x: torch.Tensor, norm: nn.GroupNorm) -> torch.Tensor:
        if self.mask is None:
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
        else:
            m = self._first_frames(x.shape[-1])
            count = m.sum(-1, keepdim=True)
            mean = (x * m).sum(-1, keepdim=True) / count
            var = ((x - mean) ** 2 * m).sum(-1, keepdim=True) / count
        return (x - mean) * torch.rsqrt(var + norm.eps) * norm.weight[:, None] + norm.bias[:, None]


# ---- DistillCodecEncoder -----------------------------------------------------------------
class TrendPool(nn.Module):
    """`avg_pool(max_pool(|x|))`, both `k` wide, stride 1, "same" (the average counts the pad)."""

    def __init__(self, kernel: int):
        super().__init__()
        self.kernel = kernel
        self.mask: FrameMask | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, h = self.kernel, self.kernel // 2
        # |x| >= 0, so zeros pad the max as the official -inf does (a window always holds its centre).
        # |x| as relu(x) + relu(-x), exactly: CoreML's ML Program has no Abs nor Neg, WebGPU no Max.
        x = F.max_pool1d(zero_pad(F.relu(x) + F.relu(x * -1.0), h, h), k, 1)
        return F.avg_pool1d(zero_pad(_masked(x, self.mask), h, h), k, 1)


class FirstBlock(nn.Module):
    """The stem (`tconv/t_first.py`'s V3FirstBlock): per pool width a trend pool and a k7 conv
    to 4 channels, then 1x1 convs over those and the audio."""

    def __init__(self, out: int, pools: tuple[int, ...]):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(TrendPool(p) if p > 1 else nn.Identity(),
                                                  PaddedConv1d(1, 4, 7, pad=3))
                                    for p in pools)
        self.conv_1 = nn.Conv1d(4 * len(pools), 16 * len(pools), 1)
        self.conv_2 = nn.Conv1d(16 * len(pools) + 1, out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.conv_1(torch.cat([b(x) for b in self.blocks], 1)))
        return self.conv_2(torch.cat([h, x], 1))


class ConvUnit(nn.Module):
    """Depthwise k7 conv, 1x1 up (x4), Snake, GRN, 1x1 down; the residual's `module`."""

    EPS = 1.1920928955078125e-07  # float32's eps: Snake's and GRN's

    def __init__(self, dim: int):
        super().__init__()
        self.dw_conv = PaddedConv1d(dim, dim, 7, pad=3, groups=dim)
        self.pw_conv1, self.pw_conv2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.act = nn.Module()
        self.act.alpha = nn.Parameter(torch.ones(1, 1, 4 * dim))
        self.grn = nn.Module()
        self.grn.gamma, self.grn.beta = (nn.Parameter(torch.zeros(1, 4 * dim)),
                                         nn.Parameter(torch.zeros(1, 4 * dim)))
        self.mask: FrameMask | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pw_conv1(self.dw_conv(x).transpose(1, 2))
        a = self.act.alpha
        h = h + (a + self.EPS).reciprocal() * torch.sin(a * h) ** 2
        # GRN: the norm over time and channels of the clip's frames, over itself (plus eps).
        sq = h * h if self.mask is None else h * h * self.mask(h.shape[1]).transpose(1, 2)
        g = torch.sqrt(sq.sum((1, 2), keepdim=True))
        h = self.grn.gamma * (h * (g / (g + self.EPS))) + self.grn.beta + h
        return self.pw_conv2(h).transpose(1, 2)


class Residual(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.module = ConvUnit(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.module(x)


class ConvEncoder(nn.Module):
    """`Encoder`: stem, per stride a stage of units and a strided conv (k = stride), a last
    stage, a k3 conv to `feature` channels."""

    def __init__(self, cfg: DistillConfig, strides: tuple[int, ...]):
        super().__init__()
        dims = cfg.dims
        blocks: list[nn.Module] = [FirstBlock(dims[0], cfg.pool_kernels)]
        for d_in, d_out, s, depth in zip(dims[:-1], dims[1:], strides, cfg.depths):
            blocks += [nn.Sequential(*[Residual(d_in) for _ in range(depth)]),
                       nn.Sequential(nn.Conv1d(d_in, d_out, s, stride=s))]
        blocks += [nn.Sequential(*[Residual(dims[-1]) for _ in range(cfg.depths[-1])]),
                   PaddedConv1d(dims[-1], cfg.feature, 3, pad=1)]
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


def toeplitz(z: torch.Tensor, rows: int, shift: int) -> torch.Tensor:
    """`[..., rows, D - 1]` whose `(i, j)` is `z[..., D - 1 - shift - i + j]` (`z` `[..., D]`),
    where that index is in range: a bias that depends on `i - j` only, by static slices and
    reshapes of `z` repeated (no Gather; the copies a broadcast Add, which every target runs,
    where Tile is not on CoreML's list)."""
    d = z.shape[-1]
    flat = (z[..., None, :] + torch.zeros(rows + 1, 1)).reshape(*z.shape[:-1], (rows + 1) * d)
    start = d - 1 - shift
    return flat[..., start:start + rows * (d - 1)].reshape(*z.shape[:-1], rows, d - 1)


class LocalAttention(nn.Module):
    """`local_attention.LocalMHA` (prenorm, causal, look back one window, not exact) with the
    `DynamicPositionBias` of its `LocalTrans`: position `p` attends to `p` and what precedes it
    in its window of `window` and the window before, each key biased by an MLP of `p - key`."""

    def __init__(self, dim: int, heads: int, window: int):
        super().__init__()
        self.heads, self.window, self.dim_head = heads, window, dim // 4
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, 3 * heads * self.dim_head, bias=False)
        self.to_out = nn.Linear(heads * self.dim_head, dim, bias=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        w, h, d = self.window, self.heads, self.dim_head
        q, k, v = (y.reshape(b, t, h, d).transpose(1, 2) for y in self.to_qkv(self.norm(x)).chunk(3, -1))
        q = q * d ** -0.5
        if t <= w:  # one window: causal attention over the whole graph
            masks = [(np.tril(np.ones((t, t), np.float32)) - 1.0) * 1e9]
        else:  # windows of `w`, each with the one before (zeros, masked, before the first)
            n = (t + w - 1) // w  # positive: the tracer divides shape tensors truncating
            q, k, v = (zero_pad(y.transpose(-1, -2), 0, n * w - t).transpose(-1, -2).reshape(b, h, n, w, d)
                       for y in (q, k, v))
            k, v = (torch.cat([zero_pad(y.transpose(2, -1), 1, 0)[..., :-1].transpose(2, -1), y], 3)
                    for y in (k, v))
            # Causal within each pair of windows, the same for every window ([w, 2 w]); the
            # first window's keys before it, which do not exist, masked apart ([n, 1, 2 w]): two
            # small constants rather than one that grows with the graph.
            masks = [(np.tril(np.ones((w, 2 * w), np.float32), w) - 1.0) * 1e9,
                     np.pad(np.full((1, 1, w), -1e9, np.float32), ((0, n - 1), (0, 0), (0, w)))]
        scores = q @ k.transpose(-1, -2) + bias
        for m in masks:  # added one by one: each stays its own small constant
            scores = scores + torch.from_numpy(m.astype(np.float32))
        y = torch.softmax(scores, -1) @ v
        return self.to_out(y.reshape(b, h, -1, d)[:, :, :t].transpose(1, 2).reshape(b, t, h * d))


class LocalTrans(nn.Module):
    """`LocalTrans`: pre-norm local-attention layers and GEGLU feed-forwards, one position bias."""

    def __init__(self, dim: int, depth: int, heads: int, window: int):
        super().__init__()
        inner = int(dim * 4 * 2 / 3)
        self.layers = nn.ModuleList(nn.ModuleList([
            LocalAttention(dim, heads, window),
            nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * inner, bias=False), nn.Identity(),
                          nn.Identity(), nn.Linear(inner, dim, bias=False))]) for _ in range(depth))
        self.dynamic_pos_bias = nn.Module()
        self.dynamic_pos_bias.mlp = nn.Sequential(nn.Linear(1, dim // 2), nn.SiLU(),
                                                  nn.Linear(dim // 2, dim // 2), nn.SiLU(),
                                                  nn.Linear(dim // 2, heads))

    def bias(self, x: torch.Tensor) -> torch.Tensor:
        """What each layer adds to its scores for `x` `[B, T, dim]`: the MLP of the distance
        `shift + i - j`, `[heads, T, T]` within one window, `[heads, 1, w, 2 w]` over windows."""
        t, w = x.shape[1], self.layers[0][0].window
        rows, shift = (t, 0) if t <= w else (w, w)
        d = rows + shift + 1
        dist = torch.arange(d - 1, -1, -1, dtype=torch.float32)[:, None]  # reversed: toeplitz reads it so
        # Plus a zero the graph computes from its input: a bias of constants only would be folded
        # by the exporter into one constant of heads x w x 2 w floats (108 MB at the released
        # window); this way the file holds the MLP and the graph builds the bias once a call.
        dist = dist + x[:1, :1, :1].reshape(1, 1) * 0.0
        bias = toeplitz(self.dynamic_pos_bias.mlp(dist).T, rows, shift)
        return bias if t <= w else bias[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias(x)
        for attn, ff in self.layers:
            x = x + attn(x, bias)
            inner, gate = ff[1](ff[0](x)).chunk(2, -1)
            x = x + ff[4](inner * F.gelu(gate))
        return x


class DistillCodecEncoder(nn.Module):
    """16 kHz audio `[B, 1, n]` -> `[B, n / prod(enc_strides), feature]`."""

    def __init__(self, cfg: DistillConfig, strides: tuple[int, ...]):
        super().__init__()
        *down, compress = strides
        self.encoder = ConvEncoder(cfg, tuple(down))
        self.en_encoder = nn.Module()
        self.en_encoder.down_trans = nn.Module()
        self.en_encoder.down_trans.trans = LocalTrans(cfg.feature, 2, cfg.heads, cfg.window * compress)
        self.en_encoder.down_trans.down_layer = nn.Conv1d(cfg.feature, cfg.feature, compress, stride=compress)
        self.en_encoder.local_trans = LocalTrans(cfg.feature, cfg.depth - 2, cfg.heads, cfg.window)

    @staticmethod
    def unused(key: str) -> bool:
        """The official's cache tokens: empty (`cache_size=0`)."""
        return key == "en_encoder.cache_token"

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        e = self.en_encoder
        x = e.down_trans.trans(self.encoder(audio).transpose(1, 2))
        return e.local_trans(e.down_trans.down_layer(x.transpose(1, 2)).transpose(1, 2))
