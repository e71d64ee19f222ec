"""Qwen3-TTS tokenizer in torch: Mimi's encoder (codecs/mimi/model.py) whose attention sees the
whole clip, keeping the first `n_codebooks` of its quantizer's levels, and the causal decoder of
decoder.py. Parameter names are ours for the encoder (Mimi's) and the official ones for the
decoder; weights.py maps the official file onto both."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...models.streaming import CausalConv1d
from ..mimi.model import Downsample, SeanetEncoder, SplitRVQ
from ..mimi.model import init_random as init_mimi
from ..mimi.transformer import Transformer
from .config import PRESETS, Qwen3Config  # noqa: F401 (re-exported)
from .decoder import Decoder


class Encoder(nn.Module):
    """Audio `[B, 1, N]` (N a multiple of `frame_size`) -> codes `[B, K, N / frame_size]`: the
    encoder side of a `MimiModel`, under the same names (its weights map as Mimi's)."""

    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        m = cfg.encoder
        self.cfg = m
        self.encoder = SeanetEncoder(m)
        self.encoder_transformer = Transformer(m.dimension, m.n_heads, m.n_layers, m.ffn, m.context,
                                               m.max_period)
        self.downsample = Downsample(m)
        self.quantizer = SplitRVQ(m)

    def latent(self, audio: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The latent `[B, C, frames]` the quantizer takes, of audio `[B, 1, N]` of whole frames
        whose first samples `mask` `[B, 1, N]` marks (1) as the clip: computed as the official
        model computes the clip alone, which pads inside each strided conv (zeros past the clip
        at that conv's own rate; the downsample repeats the clip's last position). Without a
        mask, the clip is all of `audio`, padded here to whole frames."""
        if mask is None:
            n = audio.shape[-1]
            audio = F.pad(audio, (0, -n % self.cfg.frame_size))
            mask = F.pad(torch.ones_like(audio[..., :n]), (0, -n % self.cfg.frame_size))
        x, rate = audio, 1
        for layer in self.encoder.model:
            if isinstance(layer, CausalConv1d) and layer.conv.conv.stride[0] > 1:
                x = x * _at_rate(mask, rate)  # (causal stride-1 convs never read past an output)
                rate *= layer.conv.conv.stride[0]
            x = layer(x)
        x = self.encoder_transformer(x)
        m = _at_rate(mask, rate)
        last = x * (m - F.pad(m[..., 1:], (0, 1)))  # the clip's last position, alone
        return self.downsample(x * m + F.pad(last[..., :-1], (1, 0)))

    def forward(self, audio: torch.Tensor, n_codebooks: int,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.quantizer.encode(self.latent(audio, mask), n_codebooks)


def _at_rate(mask: torch.Tensor, rate: int) -> torch.Tensor:
    """The valid positions of a signal `rate` times slower than `mask`'s: those holding a valid
    sample (a prefix mask gives ceil(n / rate) of them, as the official convs' lengths)."""
    return mask if rate == 1 else F.max_pool1d(mask, rate, rate)


class Qwen3Model(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    def encode(self, audio: torch.Tensor, n_codebooks: int | None = None) -> torch.Tensor:
        """codes `[B, K, ceil(N / frame_size)]` (K the config's 16) of audio `[B, 1, N]`, N a
        multiple of the frame (the official pads inside each conv: equal for whole frames)."""
        return self.encoder(audio, n_codebooks or self.cfg.n_codebooks)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """audio `[B, 1, F * frame_size]` of codes `[B, K, F]`: `model.decoder(codes)`, the whole clip."""
        return self.decoder(codes)


@torch.no_grad()
def init_random(model: Qwen3Model, seed: int = 0) -> Qwen3Model:
    """Seeded weights that give spread-out codes and audio neither silent nor clipped (the
    official init has every codebook zero: every code 0, and silence). The encoder as Mimi's
    (`init_mimi` on a Mimi of the encoder's parts); the decoder as the reference doc's recipe:
    fan-in scaled weights, layer scales and ConvNeXt gammas 0.1, SnakeBeta's logs N(0, 0.2), the
    residual units' second conv and the last conv damped."""
    from ..mimi.model import MimiModel

    mimi = MimiModel(model.cfg.encoder)
    init_mimi(mimi, seed)
    own = model.encoder.state_dict()
    model.encoder.load_state_dict({k: v for k, v in mimi.state_dict().items() if k in own})
    g = torch.Generator().manual_seed(seed + 1)
    rand = lambda *s: torch.randn(*s, generator=g)
    # A transposed conv's output sample sees kernel/stride taps of each input channel.
    transposed = {id(m.weight): m.in_channels * m.kernel_size[0] // m.stride[0]
                  for m in model.decoder.modules() if isinstance(m, nn.ConvTranspose1d)}
    for name, p in model.decoder.named_parameters():
        if name.endswith((".scale", ".gamma")):
            p.fill_(0.1)
        elif name.endswith((".alpha", ".beta")):
            p.copy_(0.2 * rand(p.shape))
        elif name.endswith(("norm.weight", "layernorm.weight")):
            p.copy_(1 + 0.05 * rand(p.shape))
        elif name.endswith(".bias"):
            p.copy_(0.02 * rand(p.shape))
        elif name.endswith("embedding_sum"):
            p.copy_(rand(p.shape))
        elif name.endswith("cluster_usage"):
            p.copy_(1 + 0.1 * rand(p.shape).abs())
        else:
            p.copy_(rand(p.shape) / math.sqrt(transposed.get(id(p), p[0].numel())))
    for unit in (m for m in model.decoder.modules() if m.__class__.__name__ == "ResidualUnit"):
        unit.conv2.conv.conv.weight.mul_(0.25)
    model.decoder.decoder[-1].conv.conv.weight.mul_(0.05)
    return model


MODEL = Qwen3Model
