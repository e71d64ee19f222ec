"""Finite scalar quantization (FSQ) in numpy: NeuCodec's and XCodec2's one codebook, torch-free.

The same arithmetic as vector-quantize-pytorch's `ResidualFSQ(levels, num_quantizers=1)` (the
official packages' quantizer), in float32: a projected latent is bounded with
`tanh(z + shift) * half_l - offset`, twice (ResidualFSQ bounds its residual, then its one FSQ
layer bounds that again), rounded half to even, and read as digits of a mixed-radix number
(digit i of `levels[i]` values, least significant first). The projections around it are
linear layers of the graphs.
"""

from __future__ import annotations

import numpy as np

from ...runtime.rvq import check_latent


class Fsq:
    """`levels` (e.g. `[4] * 8`: 65 536 codes)."""

    EPS = 1e-3  # vector-quantize-pytorch's `bound(z, eps=1e-3)`

    def __init__(self, levels):
        self.levels = np.asarray(levels, np.int64)
        if self.levels.ndim != 1 or len(self.levels) == 0 or (self.levels < 2).any():
            raise ValueError(f"FSQ levels must be integers >= 2, got {list(levels)}")
        self.basis = np.cumprod(np.concatenate([[1], self.levels[:-1]]))
        self.size = int(np.prod(self.levels))
        self.half_width = (self.levels // 2).astype(np.float32)
        lv = self.levels.astype(np.float32)
        self._half_l = ((lv - 1) * np.float32(1 + self.EPS) / 2).astype(np.float32)
        self._offset = np.where(self.levels % 2 == 0, 0.5, 0.0).astype(np.float32)
        self._shift = np.arctanh(self._offset / self._half_l).astype(np.float32)

    @property
    def dim(self) -> int:
        return len(self.levels)

    def arrays(self) -> None:
        """What an export writes beside its graphs for this quantizer (rvq.npz for an RVQ):
        nothing, the codebook is implicit in the levels, which the graphs' metadata holds."""
        return

    def _bound(self, z: np.ndarray) -> np.ndarray:
        return np.tanh(z + self._shift) * self._half_l - self._offset

    def indices(self, z: np.ndarray) -> np.ndarray:
        """Projected latents `[..., dim]` (float32) -> codes `[...]` (int64)."""
        z = np.asarray(z, np.float32)
        if z.shape[-1] != self.dim:
            raise ValueError(f"FSQ of {self.dim} levels takes [..., {self.dim}], got {list(z.shape)}")
        check_latent(z)
        q = np.round(self._bound(self._bound(z)))  # half to even, as torch.round
        return ((q + self.half_width).astype(np.int64) * self.basis).sum(-1)

    def codes(self, indices: np.ndarray) -> np.ndarray:
        """Codes `[...]` in `[0, size)` -> the levels `[..., dim]` in [-1, 1) (float32), what the
        decoder's `project_out` takes."""
        idx = np.asarray(indices, np.int64)[..., None]
        digits = (idx // self.basis) % self.levels
        return ((digits - self.half_width) / self.half_width).astype(np.float32)
