"""Qwen3-TTS tokenizer's decoder in torch, written for export: codes `[B, 16, F]` -> audio
`[B, 1, F * 1920]`, causal end to end, so the same modules run the whole clip and a step of a few
frames with explicit state (`StreamState`, models/streaming.py), which gives exactly the whole
clip's audio.

Module and parameter names mirror the official `Qwen3TTSTokenizerV2Decoder`'s but for the causal
convs, whose weights sit one level deeper (`conv.conv.weight`, as Mimi's: weights.py maps them).
The pipeline: the split RVQ's rows through its output projections -> `pre_conv` (causal k3) ->
`pre_transformer` (RMSNorm, SwiGLU, rotate-half RoPE, a causal window of `window` keys including
the query's own) -> two upsamplers (a transposed conv of kernel = stride, then a causal ConvNeXt
block) -> a causal conv, four blocks (SnakeBeta, a causal transposed conv of kernel 2r trimmed to
T*r, three residual units of dilation 1, 3, 9), SnakeBeta, a causal conv to one channel, clamped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...models.streaming import CausalConv1d, CausalUpConv1d, StreamState
from ..mimi.transformer import WindowAttention
from .config import Qwen3Config


class SnakeBeta(nn.Module):
    """`x + sin(e^alpha x)^2 / (e^beta + 1e-9)`, per channel (alpha and beta stored as logs)."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = torch.exp(self.alpha)[:, None], torch.exp(self.beta)[:, None]
        return x + torch.sin(x * a) ** 2 / (b + 1e-9)


class StrideUpConv1d(nn.Module):
    """ConvTranspose1d with kernel = stride: each input frame gives `stride` output samples of
    its own, so it is a 1x1 conv to `C_out * stride` channels, interleaved (no ConvTranspose in
    the graph, no state when streaming)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, stride, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ct = self.conv
        s, (b, _, t) = ct.stride[0], x.shape
        w = ct.weight.permute(1, 2, 0).reshape(ct.out_channels * s, ct.in_channels, 1)  # row oc*s + p
        y = F.conv1d(x, w, ct.bias.repeat_interleave(s))
        return y.reshape(b, ct.out_channels, s, t).transpose(2, 3).reshape(b, ct.out_channels, t * s)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.dwconv(x).transpose(1, 2))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, rate: int):
        super().__init__()
        self.block = nn.ModuleList([SnakeBeta(c_in), CausalUpConv1d(c_in, c_out, rate),
                                    *(ResidualUnit(c_out, d) for d in (1, 3, 9))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.block:
            x = m(x)
        return x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE (transformers' layout): dims i and i + D/2 rotate by `pos * theta^(-2i/D)`,
    the frequencies as transformers computes them. x `[B, H, T, D]`, pos `[T]` or `[B, T]`."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    ang = pos[..., None] * inv_freq
    if ang.dim() == 3:
        ang = ang[:, None]  # [B, 1, T, D/2]: every head alike
    ang = torch.cat([ang, ang], -1)
    x1, x2 = x.split(d // 2, -1)  # Split, not Gather (CoreML)
    return x * torch.cos(ang) + torch.cat([-x2, x1], -1) * torch.sin(ang)


class Attention(WindowAttention):
    """q, k, v, o projections without bias, heads of `head_dim`, rotate-half RoPE; a query sees
    the `window` keys up to its own (Mimi's window: `context` = window)."""

    def __init__(self, cfg: Qwen3Config):
        super().__init__(cfg.n_heads, cfg.head_dim, cfg.window)
        inner = cfg.n_heads * cfg.head_dim
        self.theta = cfg.rope_theta
        self.q_proj = nn.Linear(cfg.hidden, inner, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, inner, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, inner, bias=False)
        self.o_proj = nn.Linear(inner, cfg.hidden, bias=False)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        return tuple(p(x).reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
                     for p in (self.q_proj, self.k_proj, self.v_proj))

    def rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return rotate_half(x, pos, self.theta)

    def output(self, y: torch.Tensor) -> torch.Tensor:
        return self.o_proj(y)


class _Scale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class _Mlp(nn.Module):
    def __init__(self, dim: int, ffn: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn, bias=False)
        self.up_proj = nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = _Mlp(cfg.hidden, cfg.ffn)
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.self_attn_layer_scale = _Scale(cfg.hidden)
        self.mlp_layer_scale = _Scale(cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x)))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    """`[B, T, latent_dim]` -> `[B, T, latent_dim]`: in, the layers, the final norm, out."""

    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.input_proj = nn.Linear(cfg.latent_dim, cfg.hidden)
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.output_proj = nn.Linear(cfg.hidden, cfg.latent_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.input_proj(x)
        for layer in self.layers:
            x = layer(x)
        return self.output_proj(self.norm(x))


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def rows(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _Levels(nn.Module):
    def __init__(self, n: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_VQ(size, dim) for _ in range(n)])


class _Rvq(nn.Module):
    """Levels of rows summed, then `output_proj` (1x1, no bias); `input_proj` is in the file and
    unused (the decoder never quantizes)."""

    def __init__(self, n: int, cfg: Qwen3Config):
        super().__init__()
        dim = cfg.codebook_dim // 2
        self.input_proj = nn.Conv1d(cfg.codebook_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, cfg.codebook_dim, 1, bias=False)
        self.vq = _Levels(n, cfg.codebook_size, dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        rows = sum(vq._codebook.rows()[codes[:, i]] for i, vq in enumerate(self.vq.layers))  # [B, T, D]
        return self.output_proj(rows.transpose(1, 2))


class SplitRvq(nn.Module):
    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.rvq_first = _Rvq(1, cfg)
        self.rvq_rest = _Rvq(cfg.n_codebooks - 1, cfg)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes `[B, K, T]` (all K) -> `[B, codebook_dim, T]`."""
        z = self.rvq_first.decode(codes[:, :1])
        return z + self.rvq_rest.decode(codes[:, 1:]) if codes.shape[1] > 1 else z


class Decoder(nn.Module):
    """codes `[B, K, F]` -> audio `[B, 1, F * frame_size]` in [-1, 1]."""

    def __init__(self, cfg: Qwen3Config):
        super().__init__()
        self.cfg = cfg
        self.quantizer = SplitRvq(cfg)
        self.pre_conv = CausalConv1d(cfg.codebook_dim, cfg.latent_dim, 3)
        self.pre_transformer = Transformer(cfg)
        self.upsample = nn.ModuleList([nn.ModuleList([StrideUpConv1d(cfg.latent_dim, cfg.latent_dim, r),
                                                      ConvNeXtBlock(cfg.latent_dim)])
                                       for r in cfg.upsampling_ratios])
        dim = cfg.decoder_dim
        layers: list[nn.Module] = [CausalConv1d(cfg.latent_dim, dim, 7)]
        for r in cfg.upsample_rates:
            layers.append(DecoderBlock(dim, dim // 2, r))
            dim //= 2
        layers += [SnakeBeta(dim), CausalConv1d(dim, 1, 7)]
        self.decoder = nn.ModuleList(layers)
        for name, m in self.named_modules():
            if hasattr(m, "state_name"):
                m.state_name = "decoder_" + name.replace(".", "_")

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        """The quantizer's output `[B, codebook_dim, F]`: the step graph's input."""
        return self.quantizer.decode(codes)

    def from_latent(self, z: torch.Tensor) -> torch.Tensor:
        h = self.pre_transformer(self.pre_conv(z).transpose(1, 2)).transpose(1, 2)
        for up, block in self.upsample:
            h = block(up(h))
        for m in self.decoder:
            h = m(h)
        return h.clamp(-1, 1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.from_latent(self.latent(codes))

    # ---- explicit streaming state (as MimiModel's) ----------------------------------------
    def stateful(self) -> list[nn.Module]:
        """Modules carrying streaming state, in a fixed order."""
        return [m for m in self.modules() if hasattr(m, "state_name") and m.state_shape() is not None]

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of each state tensor (batch 1); the initial state is zeros, offset 0."""
        return {m.state_name: m.state_shape() for m in self.stateful()}

    def attention_states(self) -> list[str]:
        return [m.state_name for m in self.stateful() if isinstance(m, WindowAttention)]

    def zero_state(self) -> StreamState:
        return StreamState({k: torch.zeros(s) for k, s in self.state_shapes().items()},
                           torch.zeros(1, dtype=torch.int64))

    def streaming(self, state: StreamState):
        """A context in which each call is the next step of the stream `state` holds: the
        stateful modules read `state.inputs` and write the next state to `state.outputs`."""
        return _Streaming(self.stateful(), state)


class _Streaming:
    def __init__(self, mods: list[nn.Module], state: StreamState):
        self.mods, self.state = mods, state

    def __enter__(self) -> StreamState:
        for m in self.mods:
            m.stream = self.state
        return self.state

    def __exit__(self, *exc) -> None:
        for m in self.mods:
            m.stream = None
