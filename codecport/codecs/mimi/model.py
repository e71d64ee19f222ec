"""Mimi (Kyutai) reference model in torch, written for export.

Module names mirror moshi's (`encoder.model.{i}.conv.conv`, `decoder.model.{i}.convtr.convtr`,
`downsample.conv.conv.conv`, `quantizer.rvq_first.vq.layers.{i}._codebook`, ...), so an official
checkpoint loads without renaming. Every conv is causal with explicit padding; the transposed
convs (including the depthwise frame-rate upsample) are polyphase convs. The same modules run
whole clips and, under `MimiModel.streaming(state)`, one step with explicit state.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from torch import nn

from ...models.layers import zero_pad
from ...models.streaming import (
    CausalConv1d,
    CausalUpConv1d,
    StreamState,
    fold_convs,
    fold_rows,
    stream_rows,
    unfold_rows,
)
from .config import PRESETS, MimiConfig  # noqa: F401 (re-exported)
from .transformer import Attention, Transformer


class ELU(nn.ELU):
    """moshi's ELU (alpha 1), traced for ONNX as relu(x) + exp(clip(x, -100, 0)) - 1: the same
    function (below -100, e^x - 1 is -1 in fp32 as it is at -100), which ONNX Runtime's CPU
    runs 1.8x faster than its own Elu kernel (a fifth of the fixed graphs' time), in ops every
    target's provider takes (max(x, exp(min(x, 0)) - 1) left a node of each ELU outside
    CoreML's, NNAPI's and WebGPU's partitions). Run in torch, it is `nn.ELU`'s, bit for bit."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.onnx.is_in_onnx_export():
            return torch.relu(x) + (torch.exp(x.clamp(-100.0, 0.0)) - 1)
        return super().forward(x)


class ResBlock(nn.Module):
    """ELU -> Conv(dim -> dim/c, k3) -> ELU -> Conv(dim/c -> dim, k1), identity skip."""

    def __init__(self, dim: int, hidden: int, kernel: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(ELU(), CausalConv1d(dim, hidden, kernel, dilation=dilation),
                                   ELU(), CausalConv1d(hidden, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class SeanetEncoder(nn.Module):
    def __init__(self, cfg: MimiConfig):
        super().__init__()
        layers: list[nn.Module] = [CausalConv1d(1, cfg.n_filters, cfg.kernel_size)]
        dim = cfg.n_filters
        for r in reversed(cfg.ratios):
            layers += [ResBlock(dim, dim // cfg.compress, cfg.residual_kernel_size, 1), ELU(),
                       CausalConv1d(dim, 2 * dim, 2 * r, stride=r)]
            dim *= 2
        layers += [ELU(), CausalConv1d(dim, cfg.dimension, cfg.last_kernel_size)]
        self.model = nn.Sequential(*layers)
        fold_convs(self.model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = stream_rows(self.model)  # several streams a step: laid end to end (fold_rows)
        return unfold_rows(self.model(fold_rows(x, rows)), rows)


class SeanetDecoder(nn.Module):
    def __init__(self, cfg: MimiConfig, polyphase: bool):
        super().__init__()
        dim = cfg.n_filters * 2 ** len(cfg.ratios)
        layers: list[nn.Module] = [CausalConv1d(cfg.dimension, dim, cfg.kernel_size)]
        for r in cfg.ratios:
            layers += [ELU(), CausalUpConv1d(dim, dim // 2, r, polyphase=polyphase),
                       ResBlock(dim // 2, dim // 2 // cfg.compress, cfg.residual_kernel_size, 1)]
            dim //= 2
        layers += [ELU(), CausalConv1d(dim, 1, cfg.last_kernel_size)]
        self.model = nn.Sequential(*layers)
        fold_convs(self.model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = stream_rows(self.model)  # as the encoder's
        return unfold_rows(self.model(fold_rows(x, rows)), rows)


class Downsample(nn.Module):
    """Frame-rate conv (k = 2*stride, no bias) with replicate left padding, as moshi."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        s = cfg.downsample_stride
        self.conv = CausalConv1d(cfg.dimension, cfg.dimension, 2 * s, s, bias=False, replicate=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample(nn.Module):
    """Depthwise transposed conv (groups = channels, no bias) back to the SEANet frame rate."""

    def __init__(self, cfg: MimiConfig, polyphase: bool):
        super().__init__()
        self.convtr = CausalUpConv1d(cfg.dimension, cfg.dimension, cfg.downsample_stride,
                                     groups=cfg.dimension, bias=False, polyphase=polyphase)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.convtr(x)


class Codebook(nn.Module):
    """EMA codebook buffers as saved: rows are `embedding_sum / max(cluster_usage, 1e-5)`."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("_initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embedding_sum", torch.zeros(size, dim))

    def rows(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)


class _Levels(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_VQ(size, dim) for _ in range(n)])


class RVQ(nn.Module):
    """input_proj (1x1, no bias) -> residual nearest-row search -> sum of rows -> output_proj."""

    def __init__(self, n: int, cfg: MimiConfig):
        super().__init__()
        self.input_proj = nn.Conv1d(cfg.dimension, cfg.codebook_dim, 1, bias=False)
        self.output_proj = nn.Conv1d(cfg.codebook_dim, cfg.dimension, 1, bias=False)
        self.vq = _Levels(n, cfg.codebook_size, cfg.codebook_dim)

    def encode(self, z: torch.Tensor, k: int) -> torch.Tensor:
        """Codes `[B, k, T]` for latent `[B, C, T]`: Euclidean nearest row, level by level."""
        r = self.input_proj(z).transpose(1, 2)  # [B, T, D]
        codes = []
        for vq in self.vq.layers[:k]:
            rows = vq._codebook.rows()
            dist = (r ** 2).sum(-1, keepdim=True) - 2 * r @ rows.T + (rows ** 2).sum(-1)
            idx = dist.argmin(-1)
            codes.append(idx)
            r = r - rows[idx]
        return torch.stack(codes, 1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Latent `[B, C, T]` for codes `[B, k, T]`."""
        q = sum(vq._codebook.rows()[codes[:, i]] for i, vq in enumerate(self.vq.layers[:codes.shape[1]]))
        return self.output_proj(q.transpose(1, 2))


class SplitRVQ(nn.Module):
    """Semantic RVQ (`rvq_first`) and acoustic RVQ (`rvq_rest`), both fed the same latent."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        self.n_semantic = cfg.n_semantic
        self.rvq_first = RVQ(cfg.n_semantic, cfg)
        self.rvq_rest = RVQ(cfg.n_codebooks - cfg.n_semantic, cfg)

    def encode(self, z: torch.Tensor, k: int) -> torch.Tensor:
        codes = self.rvq_first.encode(z, min(k, self.n_semantic))
        if k > self.n_semantic:
            codes = torch.cat([codes, self.rvq_rest.encode(z, k - self.n_semantic)], 1)
        return codes

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        z = self.rvq_first.decode(codes[:, :self.n_semantic])
        if codes.shape[1] > self.n_semantic:
            z = z + self.rvq_rest.decode(codes[:, self.n_semantic:])
        return z


class MimiModel(nn.Module):
    """Audio `[B, 1, N]` (N a multiple of `frame_size`) <-> codes `[B, K, N / frame_size]`."""

    ENCODER_SIDE = ("encoder.", "encoder_transformer.", "downsample.")

    def __init__(self, cfg: MimiConfig, polyphase: bool = True):
        super().__init__()
        self.cfg = cfg
        tr = (cfg.dimension, cfg.n_heads, cfg.n_layers, cfg.ffn, cfg.context, cfg.max_period)
        self.encoder = SeanetEncoder(cfg)
        self.decoder = SeanetDecoder(cfg, polyphase)
        self.encoder_transformer = Transformer(*tr)
        self.decoder_transformer = Transformer(*tr)
        self.downsample = Downsample(cfg)
        self.upsample = Upsample(cfg, polyphase)
        self.quantizer = SplitRVQ(cfg)
        for name, m in self.named_modules():
            if hasattr(m, "state_name"):
                m.state_name = name.replace(".", "_")

    # ---- whole clips (or one step, inside `streaming`) ----------------------------------
    def encode_latent(self, audio: torch.Tensor) -> torch.Tensor:
        """Latent `[B, C, frames]` before quantization."""
        return self.downsample(self.encoder_transformer(self.encoder(audio)))

    def decode_latent(self, z: torch.Tensor) -> torch.Tensor:
        """Audio `[B, 1, frames * frame_size]` from a (quantized) latent."""
        return self.decoder(self.decoder_transformer(self.upsample(z)))

    def encode(self, audio: torch.Tensor, n_codebooks: int | None = None) -> torch.Tensor:
        return self.quantizer.encode(self.encode_latent(audio), n_codebooks or self.cfg.n_codebooks)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.decode_latent(self.quantizer.decode(codes))

    def pad(self, audio: torch.Tensor) -> torch.Tensor:
        """Zero-pad to whole frames, as moshi (since April 2025) does before encoding."""
        n = audio.shape[-1]
        return zero_pad(audio, 0, -n % self.cfg.frame_size)

    # ---- explicit streaming state -------------------------------------------------------
    def stateful(self, side: str) -> list[nn.Module]:
        """Modules carrying streaming state on the `encoder` or `decoder` side, in a fixed order."""
        enc = side == "encoder"
        return [m for name, m in self.named_modules()
                if hasattr(m, "state_name") and m.state_shape() is not None
                and name.startswith(self.ENCODER_SIDE) == enc]

    def state_shapes(self, side: str) -> dict[str, tuple[int, ...]]:
        """Name -> shape of each state tensor; the initial state is all zeros with offset 0."""
        return {m.state_name: m.state_shape() for m in self.stateful(side)}

    def attention_states(self, side: str) -> list[str]:
        """Names of the attention caches among `state_shapes(side)` (what a ring step carries as a
        ring, see `Attention`)."""
        return [m.state_name for m in self.stateful(side) if isinstance(m, Attention)]

    def zero_state(self, side: str) -> StreamState:
        return StreamState({k: torch.zeros(s) for k, s in self.state_shapes(side).items()},
                           torch.zeros(1, dtype=torch.int64))

    @contextlib.contextmanager
    def streaming(self, state: StreamState, side: str) -> Iterator[StreamState]:
        """Run one step of `side` reading `state.inputs`; `state.outputs` gets the next state."""
        mods = self.stateful(side)
        for m in mods:
            m.stream = state
        try:
            yield state
        finally:
            for m in mods:
                m.stream = None

    def set_moshi_ring(self, on: bool) -> None:
        """Streaming attention as moshi's ring cache (True) or equal to the whole clip (False)."""
        for m in self.modules():
            if isinstance(m, Attention):
                m.moshi_ring = on

    def set_context(self, context: int) -> None:
        """Attention window of every layer, whole clip and streaming (the config's by default)."""
        for m in self.modules():
            if isinstance(m, Attention):
                m.context = context


@torch.no_grad()
def init_random(model: MimiModel, seed: int = 0) -> MimiModel:
    """Seeded weights that give spread-out codes and audio-scale output.

    The official init (layer scale 0.01, zero codebooks) would make the transformers near
    identities and every code 0, so parity tests on it would prove little. Convs and linears get
    fan-in scaling, layer scales 0.1-0.5, and the codebooks are scaled to the projected latents
    of a noise clip, level by level, so every level picks among many rows.
    """
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g)
    for name, p in model.named_parameters():
        if name.endswith(".scale"):
            p.copy_(0.1 + 0.4 * torch.rand(p.shape, generator=g))
        elif name.endswith(("norm1.weight", "norm2.weight")):
            p.copy_(1 + 0.1 * rand(p.shape))
        elif name.endswith(".bias"):
            p.copy_(0.05 * rand(p.shape))
        else:
            fan_in = p[0].numel() if p.dim() > 1 else 1
            if "convtr" in name:  # [C_in, C_out/g, 2s]: each output sees 2 taps of C_in/g inputs
                fan_in = 2 * (p.shape[0] if p.shape[1] > 1 else 1)
            p.copy_(rand(p.shape) / math.sqrt(fan_in))
    for block in [m for m in model.modules() if isinstance(m, ResBlock)]:
        block.block[3].conv.conv.weight.mul_(0.3)  # damp residual branches
    model.decoder.model[-1].conv.conv.weight.mul_(0.1)  # audio-scale output
    cfg = model.cfg
    noise = 0.1 * rand(1, 1, 8 * cfg.frame_size)
    z = model.encode_latent(noise)
    for rvq in (model.quantizer.rvq_first, model.quantizer.rvq_rest):
        r = rvq.input_proj(z)[0].T  # [T, D]
        for i, vq in enumerate(rvq.vq.layers):
            cb = vq._codebook
            # Rows spread like the residual each level sees (as k-means would leave them): rows
            # much smaller than the residual would make the distances differ by less than fp32
            # rounding, and codes would hinge on summation order rather than on the model.
            rows = (r.mean(0) if i == 0 else 0) + r.std(0) * rand(cb.embedding_sum.shape)
            cb.cluster_usage.copy_(0.5 + 2 * torch.rand(cb.cluster_usage.shape, generator=g))
            cb.embedding_sum.copy_(rows * cb.cluster_usage[:, None])
            r = r - rows[torch.cdist(r, rows).argmin(-1)]
    return model


MODEL = MimiModel
