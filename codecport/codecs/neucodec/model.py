"""NeuCodec (Neuphonic; NeuTTS Air's codec): the decoder side in torch, written for export.

Codes (one FSQ codebook of 4^8 = 65 536 entries, 50 frames a second) -> FSQ levels -> the
quantizer's `project_out` -> `fc_post_a` -> a Vocos backbone (conv embed, two ResNet blocks,
transformer blocks with full attention over the clip, two ResNet blocks, LayerNorm) -> an
ISTFT head (n_fft = 4 hop, "same" padding) -> 24 kHz audio, `hop` samples a frame.

Module and parameter names mirror the official package's (`generator.backbone.transformers.{i}.
att.c_attn.weight`, `generator.head.out.weight`, `fc_post_a.weight`...), so its `state_dict()`
loads as it is. Two official quirks: the rotary embedding is given `(batch, heads, time, dim)`
where torchtune expects `(batch, time, heads, dim)`, so its "positions" are the head indices and
every time step of a head turns by the same angle, q and k alike, which leaves q.k as it was: the
attention has no position information at all, and this model leaves the rotation out. And
`torch.fft.irfft` reads only the real part of the DC and Nyquist bins (codecs/neucodec/istft.py does too).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...models.layers import FrameMask, PaddedConv1d, set_mask
from .config import PRESETS, NeuCodecConfig  # noqa: F401 (re-exported)
from .distill import DistillCodecEncoder, Hubert
from .encoder import CodecEncoder, SemanticEncoder
from .istft import IstftSame
from .w2vbert import W2vBert


def fsq_codes(indices: torch.Tensor, levels: tuple[int, ...]) -> torch.Tensor:
    """FSQ indices `[...]` -> codes `[..., len(levels)]` in [-1, 1) (vector-quantize-pytorch's
    `_indices_to_codes`: digit i is `(index // prod(levels[:i])) % levels[i]`, centred and scaled
    by `levels // 2`)."""
    basis = np.cumprod([1, *levels[:-1]])
    half = torch.tensor([lv // 2 for lv in levels], dtype=torch.float32)
    digits = (indices[..., None] // torch.from_numpy(basis)) % torch.tensor(levels)
    return (digits.float() - half) / half


class Quantizer(nn.Module):
    """ResidualFSQ(dim=vq_dim, levels, num_quantizers=1)'s projections (its codebook is implicit)."""

    def __init__(self, cfg: NeuCodecConfig):
        super().__init__()
        self.levels = cfg.levels
        self.project_in = nn.Linear(cfg.vq_dim, len(cfg.levels))
        self.project_out = nn.Linear(len(cfg.levels), cfg.vq_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes `[B, frames]` -> `[B, frames, vq_dim]` (`get_output_from_indices`)."""
        return self.project_out(fsq_codes(codes, self.levels))


class GroupNorm(nn.GroupNorm):
    """nn.GroupNorm written out (the same keys): the exporter's InstanceNormalization form
    reshapes through a computed shape, which ORT's CoreML checker cannot see as fixed. With a
    `mask`, its statistics are those of the clip's frames only, as the official model's on the
    clip alone."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mask: FrameMask | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t = x.shape
        g = x.reshape(b, self.num_groups, c // self.num_groups, t)
        if self.mask is None:
            mean = g.mean((-2, -1), keepdim=True)
            d = g - mean
            var = (d * d).mean((-2, -1), keepdim=True)
        else:
            m = self.mask(t)[:, :, None]  # [1, 1, 1, T]
            count = m.sum() * (c // self.num_groups)
            mean = (g * m).sum((-2, -1), keepdim=True) / count
            d = g - mean
            var = (d * d * m).sum((-2, -1), keepdim=True) / count
        y = (d * torch.rsqrt(var + self.eps)).reshape(b, c, t)
        return y * self.weight[:, None] + self.bias[:, None]


class ResnetBlock(nn.Module):
    """GroupNorm -> swish -> conv k3 (twice), identity skip (in = out channels)."""

    def __init__(self, dim: int, groups: int):
        super().__init__()
        self.norm1 = GroupNorm(groups, dim, eps=1e-6)
        self.conv1 = PaddedConv1d(dim, dim, 3, pad=1)
        self.norm2 = GroupNorm(groups, dim, eps=1e-6)
        self.conv2 = PaddedConv1d(dim, dim, 3, pad=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(h)))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim, bias=False)
        self.c_proj = nn.Linear(dim, dim, bias=False)
        self.mask: FrameMask | None = None  # the clip's frames: the keys attended to

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        # "b t (r h d) -> r b h t d"
        q, k, v = (self.c_attn(x).reshape(b, t, 3, self.heads, c // self.heads)
                   .permute(2, 0, 3, 1, 4).unbind(0))
        # No rotary embedding: the official one turns q and k of a head by the same angle at every
        # time step (see the module's docstring), so q.k is what it was; leaving it out changes
        # the scores by float rounding only.
        scores = torch.matmul(q, k.transpose(-1, -2)) / float(np.sqrt(c // self.heads))
        if self.mask is not None:  # exp(-1e9) is exactly 0, as -inf, without NaN in empty rows
            scores = scores + (self.mask(t) - 1.0)[:, None] * 1e9
        y = torch.matmul(torch.softmax(scores, dim=-1), v)  # full attention, as the official SDPA
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim, bias=False)
        self.fc2 = nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.silu(self.fc1(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.att_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)
        self.att = Attention(dim, heads)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.att(self.att_norm(x))
        return x + self.mlp(self.ffn_norm(x))


class VocosBackbone(nn.Module):
    """`[B, T, hidden]` -> `[B, T, hidden]`."""

    def __init__(self, cfg: NeuCodecConfig):
        super().__init__()
        d = cfg.hidden
        self.embed = PaddedConv1d(d, d, 7, pad=3)
        self.prior_net = nn.Sequential(ResnetBlock(d, cfg.groups), ResnetBlock(d, cfg.groups))
        self.transformers = nn.Sequential(*[TransformerBlock(d, cfg.heads) for _ in range(cfg.depth)])
        self.final_layer_norm = nn.LayerNorm(d, eps=1e-6)
        self.post_net = nn.Sequential(ResnetBlock(d, cfg.groups), ResnetBlock(d, cfg.groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.prior_net(self.embed(x.transpose(1, 2)))
        x = self.transformers(x.transpose(1, 2))
        return self.final_layer_norm(self.post_net(x.transpose(1, 2)).transpose(1, 2))


class IstftHead(nn.Module):
    """Linear -> (log-magnitude, phase) -> the inverse STFT (codecs/neucodec/istft.py): `[B, T, hidden]` ->
    audio `[B, T * hop]`."""

    def __init__(self, cfg: NeuCodecConfig):
        super().__init__()
        n_fft = 4 * cfg.hop
        self.out = nn.Linear(cfg.hidden, n_fft + 2)
        self.istft = IstftSame(n_fft, cfg.hop)

    def spectrum(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mag, phase = self.out(x).transpose(1, 2).chunk(2, dim=1)
        # Both bounds (exp is >= 0 anyway): a Clip without its min has an empty input, which
        # ORT's CoreML checker takes for a shape it cannot see.
        return torch.exp(mag).clamp(0.0, 100.0), phase

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.istft(*self.spectrum(x))


class Generator(nn.Module):
    def __init__(self, cfg: NeuCodecConfig):
        super().__init__()
        self.quantizer = Quantizer(cfg)
        self.backbone = VocosBackbone(cfg)
        self.head = IstftHead(cfg)


class NeuCodec(nn.Module):
    """fbank features and 16 kHz audio -> the semantic model (w2v-BERT 2.0's first layers), the
    acoustic and semantic encoders, `fc_prior` and the FSQ projections on the way in; codes
    `[B, 1, frames]` -> audio `[B, 1, frames * hop]` on the way out."""

    # Official keys with nothing to load here: the ISTFT window (a constant of IstftSame).
    IGNORED = ("generator.head.istft.window",)

    def unused(self, key: str) -> bool:
        """Keys of an official state dict this model has no use for: the ISTFT window, and the
        parts of the full w2v-BERT past the layers NeuCodec reads."""
        if key.startswith("semantic_model."):
            return self.semantic_model.unused(key[len("semantic_model."):])
        if key.startswith("codec_encoder.") and self.cfg.distill:
            return self.codec_encoder.unused(key[len("codec_encoder."):])
        return key in self.IGNORED

    def __init__(self, cfg: NeuCodecConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.distill:  # DistilHuBERT on the raw clip, DistillCodecEncoder and its projection
            d = cfg.distill
            self.semantic_model = Hubert(d.hubert)
            self.codec_encoder = DistillCodecEncoder(d, cfg.enc_strides)
            self.fc_sq_prior = nn.Linear(d.feature, cfg.semantic_dim)
            self.SemanticEncoder_module = SemanticEncoder(cfg.semantic_dim, d.semantic_hidden)
            self.fc_prior = nn.Linear(2 * cfg.semantic_dim, cfg.vq_dim)
        else:
            self.semantic_model = W2vBert(cfg.semantic)
            self.CodecEnc = CodecEncoder(cfg)
            self.SemanticEncoder_module = SemanticEncoder(cfg.semantic_dim)
            self.fc_prior = nn.Linear(cfg.semantic_dim + cfg.hidden, cfg.vq_dim)
        self.generator = Generator(cfg)
        self.fc_post_a = nn.Linear(cfg.vq_dim, cfg.hidden)

    def latent_in(self, audio: torch.Tensor, semantic: torch.Tensor,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
        """The FSQ's input `[B, frames, len(levels)]` (quantized by codecs/neucodec/fsq.py) from 16 kHz
        audio `[B, 1, N]` (padded as the official `_prepare_audio` pads it) and w2v-BERT's 16th
        hidden state `[B, T, semantic_dim]`; the longer of the two paths is cut to the shorter.
        `mask` `[1, 1, T]` marks a shorter clip's semantic frames; its audio has
        `cfg.acoustic_extra` frames more (NeuCodec's `_prepare_audio` pads up to a frame past the
        clip, and the features lose one; XCodec2's features, padded, do not)."""
        acoustic_enc = self.codec_encoder if self.cfg.distill else self.CodecEnc
        if mask is not None:
            acoustic_mask = torch.cat([torch.ones_like(mask[..., :1])] * self.cfg.acoustic_extra + [mask], -1)
            set_mask(acoustic_enc, FrameMask(acoustic_mask))
            set_mask(self.SemanticEncoder_module, FrameMask(mask))
        try:
            if self.cfg.distill:  # [B, F, feature] -> the semantic model's width
                acoustic = self.fc_sq_prior(acoustic_enc(audio)).transpose(1, 2)
            else:
                acoustic = acoustic_enc(audio).transpose(1, 2)  # [B, hidden, F]
            sem = self.SemanticEncoder_module(semantic.transpose(1, 2))  # [B, semantic_dim, T]
        finally:
            set_mask(self, None)
        n = min(acoustic.shape[-1], sem.shape[-1])
        z = torch.cat([sem[..., :n], acoustic[..., :n]], 1).transpose(1, 2)
        return self.generator.quantizer.project_in(self.fc_prior(z))

    def encode_latent(self, audio: torch.Tensor, features: torch.Tensor,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
        """`latent_in` with the semantic model run on its `features`: w2v-BERT's fbank features
        `[B, T, 160]` (codecs/neucodec/fbank.py, of the padded audio), or for the distilled variant the
        feature extractor's `input_values` `[B, n]` (codecs/neucodec/fbank.py's `raw_values`)."""
        if not self.cfg.distill:
            return self.latent_in(audio, self.semantic_model(features, mask), mask)
        set_mask(self.semantic_model, None if mask is None else FrameMask(mask))
        try:
            semantic = self.semantic_model(features)
        finally:
            set_mask(self.semantic_model, None)
        return self.latent_in(audio, semantic, mask)

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes `[B, 1, frames]` -> the backbone's input `[B, frames, hidden]`."""
        return self.fc_post_a(self.generator.quantizer.decode(codes[:, 0]))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decode_levels(fsq_codes(codes[:, 0], self.cfg.levels))

    def decode_levels(self, levels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """FSQ levels `[B, frames, len(levels)]` -> audio `[B, 1, frames * hop]`; with `mask`
        `[1, 1, frames]` (1.0 on a shorter clip's frames), the clip's samples are the official
        decode of the clip alone, the rest zero."""
        g = self.generator
        x = self.fc_post_a(g.quantizer.project_out(levels))
        set_mask(g, None if mask is None else FrameMask(mask))
        try:
            return g.head(g.backbone(x))[:, None]
        finally:
            set_mask(g, None)


def init_random(model: NeuCodec, seed: int = 0) -> NeuCodec:
    """Seeded weights that keep activations O(1) and the magnitudes below the head's clip."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif p.dim() == 1:  # norm weights
                p.copy_(1 + torch.randn(p.shape, generator=g) * 0.1)
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(fan_in))
        model.generator.head.out.weight.mul_(0.3)
    return model


MODEL = NeuCodec
