"""DAC (Descript Audio Codec) reference model in torch, written for export.

Module names and `nn.Sequential` indices follow the official `dac.model.dac.DAC`, so an official
state dict (after folding weight norm) loads with the same keys.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...models.layers import PaddedConv1d, ResidualUnit, Snake, UpConv1d, init_fan_in, set_padding, zero_pad
from .config import PRESETS, DacConfig  # noqa: F401 (re-exported)


class EncoderBlock(nn.Module):
    def __init__(self, dim: int, stride: int):
        super().__init__()
        self.block = nn.Sequential(
            ResidualUnit(dim // 2, 1), ResidualUnit(dim // 2, 3), ResidualUnit(dim // 2, 9),
            Snake(dim // 2),
            PaddedConv1d(dim // 2, dim, 2 * stride, stride=stride, pad=math.ceil(stride / 2)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, cfg: DacConfig):
        super().__init__()
        d = cfg.encoder_dim
        layers: list[nn.Module] = [PaddedConv1d(cfg.channels, d, 7, pad=3)]
        for stride in cfg.encoder_rates:
            d *= 2
            layers.append(EncoderBlock(d, stride))
        layers += [Snake(d), PaddedConv1d(d, cfg.latent_dim, 3, pad=1)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class DecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, polyphase: bool):
        super().__init__()
        self.block = nn.Sequential(
            Snake(c_in),
            UpConv1d(c_in, c_out, stride, pad=math.ceil(stride / 2), polyphase=polyphase),
            ResidualUnit(c_out, 1), ResidualUnit(c_out, 3), ResidualUnit(c_out, 9),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Decoder(nn.Module):
    def __init__(self, cfg: DacConfig, polyphase: bool):
        super().__init__()
        d = cfg.decoder_dim
        layers: list[nn.Module] = [PaddedConv1d(cfg.latent_dim, d, 7, pad=3)]
        for i, stride in enumerate(cfg.decoder_rates):
            layers.append(DecoderBlock(d // 2**i, d // 2 ** (i + 1), stride, polyphase))
        out = d // 2 ** len(cfg.decoder_rates)
        layers += [Snake(out), PaddedConv1d(out, cfg.channels, 7, pad=3), nn.Tanh()]
        self.model = nn.Sequential(*layers)
        for m in self.modules():  # TSAC's decoder (only) indexes alpha by flat position
            if isinstance(m, Snake):
                m.flat = cfg.snake == "tsac"

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.model(z)


class VectorQuantizer(nn.Module):
    def __init__(self, cfg: DacConfig):
        super().__init__()
        self.in_proj = nn.Conv1d(cfg.latent_dim, cfg.codebook_dim, 1)
        self.out_proj = nn.Conv1d(cfg.codebook_dim, cfg.latent_dim, 1)
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)

    def nearest(self, e: torch.Tensor) -> torch.Tensor:
        """Codes `[B, T]` for projected latents `[B, D, T]` (official cosine-distance formula)."""
        enc = F.normalize(e.transpose(1, 2), dim=-1)  # [B, T, D]
        cb = F.normalize(self.codebook.weight, dim=-1)  # [N, D]
        dist = enc.pow(2).sum(-1, keepdim=True) - 2 * enc @ cb.t() + cb.pow(2).sum(-1)
        return (-dist).argmax(-1)

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """Projected-back latent `[B, latent, T]` of codes `[B, T]` (raw, un-normalised rows)."""
        return self.out_proj(self.codebook(codes).transpose(1, 2))


class ResidualVectorQuantizer(nn.Module):
    def __init__(self, cfg: DacConfig):
        super().__init__()
        self.quantizers = nn.ModuleList(VectorQuantizer(cfg) for _ in range(cfg.n_codebooks))

    def encode(self, z: torch.Tensor, n_codebooks: int | None = None) -> torch.Tensor:
        """Codes `[B, K, T]` for latents `[B, latent, T]`."""
        residual, codes = z, []
        for q in self.quantizers[:n_codebooks]:
            c = q.nearest(q.in_proj(residual))
            residual = residual - q.lookup(c)
            codes.append(c)
        return torch.stack(codes, dim=1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Latent `[B, latent, T]` from codes `[B, K, T]`, K <= n_codebooks."""
        return sum(self.quantizers[i].lookup(codes[:, i]) for i in range(codes.shape[1]))


class DAC(nn.Module):
    """Encoder, residual vector quantizer and decoder; audio is `[B, channels, T]` in [-1, 1]
    (one channel but for TSAC's stereo model, whose codes are those of both channels at once)."""

    def __init__(self, cfg: DacConfig, polyphase: bool = True):
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quantizer = ResidualVectorQuantizer(cfg)
        self.decoder = Decoder(cfg, polyphase)
        self.padding = True

    def set_padding(self, value: bool) -> None:
        """Official padding (`True`) or the padding-off mode of chunked compression."""
        set_padding(self, value)
        self.padding = value

    def preprocess(self, audio: torch.Tensor) -> torch.Tensor:
        """Right-pad to a hop multiple, as the official `preprocess` does."""
        hop = self.cfg.hop_length
        return zero_pad(audio, 0, -audio.shape[-1] % hop)

    def encode(self, audio: torch.Tensor, n_codebooks: int | None = None) -> torch.Tensor:
        """Codes `[B, K, frames]` for audio `[B, channels, T]`."""
        return self.quantizer.encode(self.encoder(self.preprocess(audio)), n_codebooks)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Audio `[B, channels, samples]` from codes `[B, K, frames]`."""
        return self.decoder(self.quantizer.decode(codes))

    def output_length(self, n: int) -> int:
        """Samples out of encode+decode with padding off (official `get_output_length`)."""
        return self.cfg.output_length(n)

    def delay(self) -> int:
        """Zero padding put on both sides of the signal in chunked mode (official `get_delay`)."""
        return self.cfg.delay()


def init_random(model: DAC, seed: int) -> DAC:
    """Seeded random weights scaled so activations stay O(1): not a trained model (layers.init_fan_in)."""
    init_fan_in(model, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.decoder.model[-2].weight.mul_(0.1)  # keep the output tanh mostly linear, as trained
    return model


MODEL = DAC
