"""SNAC's decoder as a streaming step with explicit state: each layer computes each position once.

SNAC's decoder is not causal: every conv reaches `pad` positions to the right. Run one step at a
time, each layer here keeps the inputs it still needs from earlier steps (its state) and gives
its output `pad` positions late, so the right context it needs has arrived. The delays add up
through the decoder, scaled by every upsampling: the audio of a step is that of the positions
`delay` samples before the step's own (`StepPlan.delay`), the smallest lookahead the
architecture allows. The local attention (the music models') keeps its input until a whole
window of it has arrived, which rounds its delay up to whole windows.

Each layer's state starts as zeros; the positions before the clip and past its end (`end`, in
latent frames; huge while the clip goes on) are masked to zero at every conv's input, as the
whole-clip decode pads them. So pushing the latent frames step by step, then steps of anything
until the delay has drained, gives exactly the whole-clip decode (`SNAC.decode_latent`) with
the same noise. Every input and state has a batch of independent slots, each with its own
`offset` (latent frames it has run) and `end`.

Positions in the masks are computed in small floats: `offset` is clamped to [0, horizon] and
`end - offset` to [-horizon, horizon] latent frames first (past the horizon every position of a
step is inside the clip, or every one past its end), which keeps every value exact in float32
however long a stream runs, and needs no comparison op (CoreML's ML Program has none):
`clamp(n, 0, 1)` is 1 iff the whole number n >= 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ...models.layers import PaddedConv1d, ResidualUnit, Snake, UpConv1d
from .model import SNAC, DecoderBlock, LocalMHA, NoiseBlock


@dataclass
class StepPlan:
    """What a walk through the decoder found: the state tensors (name -> shape without the batch
    axis, in order), each noise block's delay (positions at its rate) and the audio's (samples):
    a step's noise and audio are those of the positions that many before the step's own."""

    states: dict[str, tuple[int, ...]] = field(default_factory=dict)
    noise_delays: list[int] = field(default_factory=list)
    delay: int = 0


class _Walk:
    """One step's bookkeeping as the layers are walked: the resolution (positions per latent
    frame) and delay (positions) of the current tensor, the state read and written."""

    def __init__(self, states: dict[str, torch.Tensor] | None, off: torch.Tensor, rem: torch.Tensor,
                 plan: StepPlan):
        self.states, self.off, self.rem, self.plan = states, off, rem, plan
        self.out: dict[str, torch.Tensor] = {}
        self.rate, self.delay, self.n = 1, 0, 0

    def read(self, name: str, like: torch.Tensor, length: int) -> torch.Tensor:
        """State `name`: the last `length` positions of the input `like` had."""
        shape = (like.shape[1], length)
        self.plan.states.setdefault(name, shape)
        if self.states is None:  # the planning walk: zeros of the right shape
            return like.new_zeros(like.shape[0], *shape)
        return self.states[name]

    def hold(self, name: str, x: torch.Tensor, length: int) -> torch.Tensor:
        """`x` preceded by the `length` positions before it (the state), which becomes the
        last `length` positions of the concatenation."""
        buf = torch.cat([self.read(name, x, length), x], -1)
        self.out[name] = buf[..., -length:]
        return buf

    def valid(self, positions: int) -> torch.Tensor:
        """`[B, 1, positions]`: 1.0 where the current tensor's positions lie in the clip."""
        i = torch.arange(positions, dtype=torch.float32) - self.delay
        return ((self.off * self.rate + i + 1).clamp(0, 1) * (self.rem * self.rate - i).clamp(0, 1))


class SnacStepDecoder(nn.Module):
    """`(latent [B, L, n], offset [B], end [B], *noise, *states) -> (audio [B, 1, n * hop],
    offset + n, *states)`: one step of `n` latent frames (a whole number of `unit_frames`)."""

    def __init__(self, snac: SNAC, step: int, batch: int = 1):
        super().__init__()
        cfg = snac.cfg
        if step < 1 or step % cfg.unit_frames:
            raise ValueError(f"a step is a whole number of {cfg.unit_frames}-frame units, got {step}")
        self.snac, self.step, self.batch = snac, step, batch
        self.plan = StepPlan()
        with torch.no_grad():  # walk once to learn the state and the delay
            self._walk(torch.zeros(1, cfg.latent, step), None, torch.zeros(1, 1, 1), torch.zeros(1, 1, 1),
                       [torch.zeros(1, 1, step * u) for u in self.noise_rates()])
        # Past this many latent frames from the clip's start or end, every position of a step
        # is inside it (delay / rate only grows through the layers, so the audio's is the most).
        self.horizon = step + math.ceil(self.plan.delay / cfg.hop_length) + 1

    def noise_rates(self) -> list[int]:
        """Positions per latent frame of each noise block (none without noise)."""
        return [math.prod(self.snac.cfg.decoder_rates[:i + 1])
                for i in range(len(self.snac.cfg.decoder_rates))] \
            if self.snac.cfg.noise else []

    @property
    def state_names(self) -> list[str]:
        return list(self.plan.states)

    def forward(self, latent: torch.Tensor, offset: torch.Tensor, end: torch.Tensor, *rest: torch.Tensor):
        k = len(self.plan.noise_delays)
        noise, states = list(rest[:k]), rest[k:]
        b = latent.shape[0]
        off = offset.float().reshape(b, 1, 1).clamp(0, self.horizon)
        rem = (end - offset).float().reshape(b, 1, 1).clamp(-self.horizon, self.horizon)
        audio, out = self._walk(latent, dict(zip(self.state_names, states)), off, rem, noise)
        return (audio, offset + self.step, *[out[n] for n in self.state_names])

    def _walk(self, x, states, off, rem, noise):
        w = _Walk(states, off, rem, self.plan)
        w.n = x.shape[-1]
        block = 0
        for i, layer in enumerate(self.snac.decoder.model):
            name = f"model_{i}"
            if isinstance(layer, DecoderBlock):
                x = self._block(w, layer, x, noise[block] if noise else None, name)
                block += 1
            else:
                x = self._layer(w, layer, x, name)
        if states is None:
            self.plan.delay = w.delay
        return x, w.out

    def _layer(self, w: _Walk, layer: nn.Module, x: torch.Tensor, name: str) -> torch.Tensor:
        if isinstance(layer, PaddedConv1d):
            return _conv(w, layer, x, name)
        if isinstance(layer, LocalMHA):
            return _attention(w, layer, x, name)
        if isinstance(layer, ResidualUnit):
            return _residual(w, layer, x, name)
        if isinstance(layer, (Snake, nn.Tanh)):
            return layer(x)
        raise TypeError(f"no streaming form for {type(layer).__name__}")

    def _block(self, w: _Walk, blk: DecoderBlock, x: torch.Tensor, noise, name: str) -> torch.Tensor:
        for j, layer in enumerate(blk.block):
            sub = f"{name}_{j}"
            if isinstance(layer, UpConv1d):
                x = _upconv(w, layer, x, sub)
            elif isinstance(layer, NoiseBlock):
                if len(self.plan.noise_delays) < len(self.noise_rates()):
                    self.plan.noise_delays.append(w.delay)
                x = x + noise * F.conv1d(x, layer.linear.weight)
            else:
                x = self._layer(w, layer, x, sub)
        return x


def _conv(w: _Walk, m: PaddedConv1d, x: torch.Tensor, name: str) -> torch.Tensor:
    """A symmetric conv made causal: the last `2 pad` inputs held, the output `pad` late."""
    span = (m.kernel_size[0] - 1) * m.dilation[0]
    if span == 0:
        return F.conv1d(x, m.weight, m.bias, groups=m.groups)
    if span != 2 * m.pad:
        raise ValueError(f"{name}: a conv padded {m.pad} with a span of {span} is not centred")
    x = x * w.valid(x.shape[-1])
    y = F.conv1d(w.hold(name, x, span), m.weight, m.bias, dilation=m.dilation[0], groups=m.groups)
    w.delay += m.pad
    return y


def _residual(w: _Walk, ru: ResidualUnit, x: torch.Tensor, name: str) -> torch.Tensor:
    """The unit's conv delays its output by its pad: the skip is held as long."""
    before = w.delay
    y = x
    for j, layer in enumerate(ru.block):
        y = _conv(w, layer, y, f"{name}_{j}") if isinstance(layer, PaddedConv1d) else layer(y)
    lag = w.delay - before
    skip = w.hold(f"{name}_skip", x, lag)[..., :x.shape[-1]] if lag else x
    return skip + y


def _upconv(w: _Walk, m: UpConv1d, x: torch.Tensor, name: str) -> torch.Tensor:
    """The polyphase transposed conv: block j from input frames (j-1, j), the previous frame
    held; its right crop `pad` becomes a delay at the output rate."""
    s, t = m.stride[0], x.shape[-1]
    x = x * w.valid(t)
    y = F.conv1d(w.hold(name, x, 1), m.phase_weight(), m.bias.repeat_interleave(s))
    y = y.reshape(x.shape[0], m.out_channels, s, t).transpose(2, 3).reshape(x.shape[0], m.out_channels, t * s)
    w.rate, w.delay = w.rate * s, w.delay * s + m.pad
    return y


def _attention(w: _Walk, m: LocalMHA, x: torch.Tensor, name: str) -> torch.Tensor:
    """Local attention needs whole windows: its input is held until the window it belongs to
    has arrived, which rounds the delay up to whole windows (positions are latent frames)."""
    late = -(-w.delay // m.window) * m.window
    if late > w.delay:
        x = w.hold(name, x, late - w.delay)[..., :x.shape[-1]]
        w.delay = late
    return m(x)
