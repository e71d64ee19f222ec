"""SNAC (multi-scale neural audio codec, the codec of Orpheus TTS) reference model in torch,
written for export.

Module names and `nn.Sequential` indices follow the official `snac.SNAC`, so an official state
dict (after folding weight norm) loads with the same keys. Beyond the official model:
- the transposed convs are polyphase plain convs and every padding is explicit (layers.py);
- the decoder's noise is an input (`noise`: one `[B, 1, T_i]` tensor per decoder block) instead
  of `torch.randn` inside, so a graph, a test and the official model can be fed the same noise;
- `mask` (valid latent frames of the window, see `layers.FrameMask`) makes a fixed window compute
  the official result of any shorter clip inside it, which is what lets one fixed-shape graph
  serve every length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...models.layers import (
    FrameMask,
    PaddedConv1d,
    ResidualUnit,
    Snake,
    UpConv1d,
    init_fan_in,
    set_mask,
    zero_pad,
)
from .config import PRESETS, SnacConfig  # noqa: F401 (re-exported)


class LocalMHA(nn.Module):
    """Attention within non-overlapping windows of `window` frames, with rotary positions
    counted from each window's start (the official `LocalMHA`, xpos off)."""

    def __init__(self, dim: int, window: int, dim_head: int = 64):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.heads, self.dim_head, self.window = dim // dim_head, dim_head, window
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.rel_pos = _Rotary(dim_head, window)
        self.to_out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t = x.shape
        w, n, h, d = t // self.window, self.window, self.heads, self.dim_head
        q, k, v = self.to_qkv(self.norm(x.transpose(1, 2))).chunk(3, dim=-1)
        # [B, T, H*D] -> [B, H, W, N, D]
        q, k, v = (y.reshape(b, w, n, h, d).permute(0, 3, 1, 2, 4) for y in (q, k, v))
        cos, sin = self.rel_pos.cos_sin()
        q, k = (y * cos + _rotate_half(y) * sin for y in (q, k))
        att = torch.softmax(q @ k.transpose(-1, -2) * d ** -0.5, dim=-1)
        out = (att @ v).permute(0, 2, 3, 1, 4).reshape(b, t, h * d)
        return self.to_out(out).transpose(1, 2) + x


class _Rotary(nn.Module):
    """The official `SinusoidalEmbeddings`: `inv_freq` is a checkpoint buffer; the cos/sin
    table over one window is computed from it (a constant in the graph)."""

    def __init__(self, dim_head: int, window: int):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim_head, 2).float() / dim_head)))
        self.window = window

    def cos_sin(self) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.arange(self.window, dtype=torch.float32)[:, None] * self.inv_freq[None]
        freqs = torch.cat([freqs, freqs], dim=-1)
        return freqs.cos(), freqs.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x2 * -1.0, x1], dim=-1)  # a Mul: CoreML's ML Program has no Neg


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int, groups: int):
        super().__init__()
        half = dim // 2
        self.block = nn.Sequential(
            ResidualUnit(half, 1, groups), ResidualUnit(half, 3, groups), ResidualUnit(half, 9, groups),
            Snake(half), PaddedConv1d(half, dim, 2 * stride, stride=stride, pad=math.ceil(stride / 2)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, cfg: SnacConfig):
        super().__init__()
        d = cfg.encoder_dim
        layers: list[nn.Module] = [PaddedConv1d(1, d, 7, pad=3)]
        for stride in cfg.encoder_rates:
            d *= 2
            layers.append(EncoderBlock(d, stride, d // 2 if cfg.depthwise else 1))
        if cfg.attn_window_size:
            layers.append(LocalMHA(d, cfg.attn_window_size))
        layers.append(PaddedConv1d(d, d, 7, pad=3, groups=d if cfg.depthwise else 1))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class NoiseBlock(nn.Module):
    """`x + noise * linear(x)`, the noise `[B, 1, T]` given by the caller."""

    def __init__(self, dim: int):
        super().__init__()
        self.linear = PaddedConv1d(dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return x + noise * self.linear(x)


class DecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, noise: bool, groups: int):
        super().__init__()
        layers: list[nn.Module] = [
            Snake(c_in),
            UpConv1d(c_in, c_out, stride, pad=math.ceil(stride / 2), output_padding=stride % 2),
        ]
        if noise:
            layers.append(NoiseBlock(c_out))
        layers += [ResidualUnit(c_out, 1, groups), ResidualUnit(c_out, 3, groups),
                   ResidualUnit(c_out, 9, groups)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        for layer in self.block:
            if isinstance(layer, NoiseBlock):
                x = layer(x, torch.randn(x.shape[0], 1, x.shape[-1]) if noise is None else noise)
            else:
                x = layer(x)
        return x


class Decoder(nn.Module):
    def __init__(self, cfg: SnacConfig):
        super().__init__()
        latent, d = cfg.latent, cfg.decoder_dim
        if cfg.depthwise:
            layers: list[nn.Module] = [PaddedConv1d(latent, latent, 7, pad=3, groups=latent),
                                       PaddedConv1d(latent, d, 1)]
        else:
            layers = [PaddedConv1d(latent, d, 7, pad=3)]
        if cfg.attn_window_size:
            layers.append(LocalMHA(d, cfg.attn_window_size))
        for i, stride in enumerate(cfg.decoder_rates):
            out = d // 2 ** (i + 1)
            layers.append(DecoderBlock(d // 2**i, out, stride, cfg.noise, out if cfg.depthwise else 1))
        layers += [Snake(out), PaddedConv1d(out, 1, 7, pad=3), nn.Tanh()]
        self.model = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor, noise: list[torch.Tensor] | None = None) -> torch.Tensor:
        i = 0
        for layer in self.model:
            if isinstance(layer, DecoderBlock):
                z = layer(z, noise[i] if noise else None)
                i += 1
            else:
                z = layer(z)
        return z


class VectorQuantizer(nn.Module):
    """One level: average-pooled by `stride`, projected, nearest L2-normalised code, projected
    back and repeated `stride` times."""

    def __init__(self, cfg: SnacConfig, stride: int):
        super().__init__()
        self.stride = stride
        self.in_proj = nn.Conv1d(cfg.latent, cfg.codebook_dim, 1)
        self.out_proj = nn.Conv1d(cfg.codebook_dim, cfg.latent, 1)
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)

    def encode(self, z: torch.Tensor) -> torch.Tensor:
        """Codes `[B, T / stride]` of a residual `[B, latent, T]`."""
        if self.stride > 1:
            z = F.avg_pool1d(z, self.stride, self.stride)
        enc = F.normalize(self.in_proj(z).transpose(1, 2), dim=-1)  # [B, T, D]
        cb = F.normalize(self.codebook.weight, dim=-1)
        dist = enc.pow(2).sum(-1, keepdim=True) - 2 * enc @ cb.t() + cb.pow(2).sum(-1)
        return (-dist).max(-1)[1]

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """`[B, latent, T_l * stride]` of codes `[B, T_l]` (the raw, un-normalised rows)."""
        z = self.out_proj(self.codebook(codes).transpose(1, 2))
        return z.repeat_interleave(self.stride, dim=-1) if self.stride > 1 else z


class ResidualVectorQuantizer(nn.Module):
    def __init__(self, cfg: SnacConfig):
        super().__init__()
        self.quantizers = nn.ModuleList(VectorQuantizer(cfg, s) for s in cfg.vq_strides)

    def encode(self, z: torch.Tensor) -> list[torch.Tensor]:
        residual, codes = z, []
        for q in self.quantizers:
            c = q.encode(residual)
            residual = residual - q.decode(c)
            codes.append(c)
        return codes

    def decode(self, codes: list[torch.Tensor]) -> torch.Tensor:
        return sum(q.decode(c) for q, c in zip(self.quantizers, codes))


class SNAC(nn.Module):
    """Encoder, multi-scale RVQ and decoder; audio is `[B, 1, T]` in [-1, 1], codes a list of
    `[B, T_l]` tensors, coarse first (as the official `encode` returns them)."""

    def __init__(self, cfg: SnacConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quantizer = ResidualVectorQuantizer(cfg)
        self.decoder = Decoder(cfg)

    def preprocess(self, audio: torch.Tensor) -> torch.Tensor:
        """Right-pad to whole coarse frames (and attention windows), as the official model does."""
        unit = self.cfg.hop_length * self.cfg.unit_frames
        return zero_pad(audio, 0, -audio.shape[-1] % unit)

    def encode_latent(self, audio: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Latent `[B, latent, frames]` of audio `[B, 1, frames * hop]`; `mask` `[B, 1, frames]`
        marks the frames of the window that are the clip."""
        set_mask(self.encoder, None if mask is None else FrameMask(mask))
        try:
            return self.encoder(audio)
        finally:
            set_mask(self.encoder, None)

    def decode_latent(self, z: torch.Tensor, noise: list[torch.Tensor] | None = None,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
        """Audio `[B, 1, frames * hop]` of a latent; `noise` per decoder block (None: drawn)."""
        set_mask(self.decoder, None if mask is None else FrameMask(mask))
        try:
            return self.decoder(z, noise)
        finally:
            set_mask(self.decoder, None)

    def encode(self, audio: torch.Tensor) -> list[torch.Tensor]:
        return self.quantizer.encode(self.encode_latent(self.preprocess(audio)))

    def decode(self, codes: list[torch.Tensor], noise: list[torch.Tensor] | None = None) -> torch.Tensor:
        return self.decode_latent(self.quantizer.decode(codes), noise)

    def noise_shapes(self, frames: int, batch: int = 1) -> list[tuple[int, int, int]]:
        """Shapes of the decoder's noise inputs for `frames` latent frames: one per block, in
        the order the official decoder draws them."""
        out, n = [], frames
        for s in self.cfg.decoder_rates:
            n *= s
            out.append((batch, 1, n))
        return out if self.cfg.noise else []


def init_random(model: SNAC, seed: int = 0) -> SNAC:
    """Seeded random weights scaled so activations stay O(1) and codes spread over the
    codebooks: not a trained model (layers.init_fan_in, plus the attention's layers)."""
    def other(m: nn.Module, randn) -> None:
        if isinstance(m, nn.Linear):
            randn(m.weight, m.in_features ** -0.5)
        elif isinstance(m, nn.LayerNorm):
            m.weight.copy_(1 + 0.1 * torch.randn(m.weight.shape, generator=g))
            randn(m.bias, 0.05)

    g = torch.Generator().manual_seed(seed)
    init_fan_in(model, g, other)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, NoiseBlock):
                m.linear.weight.mul_(0.3)
            elif isinstance(m, LocalMHA):
                m.to_out.weight.mul_(0.3)
        model.decoder.model[-2].weight.mul_(0.1)  # keep the output tanh mostly linear
    return model


MODEL = SNAC
