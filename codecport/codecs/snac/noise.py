"""Noise a decoder adds (SNAC's noise blocks), as an input of its graphs: the same value at every
position of a clip, whichever window or stream step computes it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import CodecportError, CodesError

NOISE_HELP = "None (random, as the official decode), an int seed, 'zero', or one array per block"


class Noise:
    """The decoder's noise at every position of a clip, so that any window of it (the whole
    decode's, the stream's) sees the same values. A seed draws each coarse frame's noise of each
    block and channel from its own generator, keyed by its position."""

    def __init__(self, noise, rates: Sequence[int], unit: int, channels: int):
        self.up = list(np.cumprod(rates))  # positions per latent frame at each block
        self.unit, self.arrays, self.zero, self.seed = unit, None, False, None
        if noise is None:
            self.seed = int(np.random.SeedSequence().entropy % (1 << 63))
        elif isinstance(noise, str):
            if noise != "zero":
                raise CodecportError(f"noise {noise!r}: pass {NOISE_HELP}")
            self.zero = True
        elif isinstance(noise, (int, np.integer)) and not isinstance(noise, bool):
            if noise < 0:
                raise CodecportError(f"noise seed {noise} must be >= 0")
            self.seed = int(noise)
        elif isinstance(noise, (list, tuple)) and len(noise) == len(rates):
            try:
                self.arrays = [np.asarray(a, np.float32).reshape(channels, -1) if np.size(a) else None
                               for a in noise]
            except (TypeError, ValueError) as e:
                raise CodecportError(f"noise arrays must be [channels, positions] per block ({e})") from None
        else:
            raise CodecportError(f"noise must be {NOISE_HELP} ({len(rates)} blocks)")

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """The noise as a stream state's arrays and values (a seed, zero, or the arrays)."""
        arrays = {f"noise_{b}": a for b, a in enumerate(self.arrays or []) if a is not None}
        return arrays, {"noise_seed": self.seed, "noise_zero": self.zero}

    def set_state(self, arrays: dict, values: dict) -> None:
        self.seed, self.zero = values.get("noise_seed"), bool(values.get("noise_zero"))
        given = [arrays.get(f"noise_{b}") for b in range(len(self.up))]
        self.arrays = given if any(a is not None for a in given) else None

    def window(self, channel: int, block: int, start: int, frames: int, n: int) -> np.ndarray:
        """`[1, 1, frames * up]` noise of `block` for latent frames [start, start + frames);
        zeros outside the clip's `n` frames (masked there anyway)."""
        up = self.up[block]
        out = np.zeros((1, 1, frames * up), np.float32)
        lo, hi = max(start, 0), min(start + frames, n)
        if self.zero or hi <= lo:
            return out
        if self.arrays is not None:
            a = self.arrays[block]
            if a is None or a.shape[1] < hi * up:
                raise CodesError(f"noise for block {block} must hold {n * up} values a channel")
            out[0, 0, (lo - start) * up:(hi - start) * up] = a[channel, lo * up:hi * up]
            return out
        per = self.unit * up
        for u in range(lo // self.unit, -(-hi // self.unit)):
            rng = np.random.default_rng([self.seed, channel, block, u])
            chunk = rng.standard_normal(per, dtype=np.float32)
            a, b = max(u * self.unit, lo), min((u + 1) * self.unit, hi)
            out[0, 0, (a - start) * up:(b - start) * up] = \
                chunk[(a - u * self.unit) * up:(b - u * self.unit) * up]
        return out

    def positions(self, channel: int, block: int, lo: int, count: int, n: int) -> np.ndarray:
        """`[1, 1, count]` noise of `block` at its own positions [lo, lo + count) (a stream step's,
        which need not start on a latent frame); zeros outside the clip's `n` frames."""
        up = self.up[block]
        first = lo // up
        w = self.window(channel, block, first, -(-(lo + count) // up) - first, n)
        return w[..., lo - first * up:lo - first * up + count]
