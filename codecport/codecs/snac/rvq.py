"""SNAC's multi-scale RVQ, numpy: the factorised levels DAC has, each on its own time scale."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...errors import ModelFileError
from ...runtime.rvq import FactorisedRvq, check_code_values, check_latent, load_arrays, normalize


class SnacRvq(FactorisedRvq):
    """SNAC's multi-scale RVQ: DAC's levels, level `i` on the latent averaged over `strides[i]`
    frames and its output repeated back as many times. Arrays as `FactorisedRvq`, plus `strides` `[K]`."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        super().__init__(arrays)
        self.strides = [int(s) for s in arrays["strides"]]

    @classmethod
    def load(cls, path: Path, g) -> SnacRvq:
        k, n, d, lat = (g.int(x) for x in ("n_codebooks", "codebook_size", "codebook_dim", "latent_dim"))
        shapes = {"in_proj_weight": (k, d, lat), "in_proj_bias": (k, d), "out_proj_weight": (k, lat, d),
                  "out_proj_bias": (k, lat), "codebook": (k, n, d), "strides": (k,)}
        arrays = load_arrays(path, g.meta, shapes)
        if [int(s) for s in arrays["strides"]] != g.ints("vq_strides"):
            raise ModelFileError(f"{path}: strides {arrays['strides'].tolist()} are not the graphs' "
                                 f"{g.ints('vq_strides')}; re-export the folder")
        return cls({name: a if name == "strides" else a.astype(np.float32) for name, a in arrays.items()})

    def arrays(self) -> dict[str, np.ndarray]:
        return {**super().arrays(), "strides": np.array(self.strides, np.int64)}

    def encode_levels(self, latent: np.ndarray) -> list[np.ndarray]:
        """Codes of every level (`[T / strides[i]]` int64 each) of a latent `[L, T]`, T a
        multiple of every stride; the official distance formula."""
        check_latent(latent)
        residual = latent.T.astype(np.float32)  # [T, L]
        t = residual.shape[0]
        out = []
        for i, s in enumerate(self.strides):
            pooled = residual.reshape(t // s, s, -1).mean(axis=1) if s > 1 else residual
            e = normalize(pooled @ self.in_w[i].T + self.in_b[i])
            dist = (e ** 2).sum(-1, keepdims=True) - 2 * e @ self._unit_codebook[i].T + self._unit_sq[i]
            codes = np.argmax(-dist, axis=-1).astype(np.int64)
            residual = residual - np.repeat(self._project(i, codes), s, axis=0)
            out.append(codes)
        return out

    def decode_levels(self, codes: list[np.ndarray]) -> np.ndarray:
        """Latent `[L, T]` of every level's codes (level `i` holding `T / strides[i]`)."""
        z = None
        for i, (c, s) in enumerate(zip(codes, self.strides)):
            check_code_values(c, self.codebook_size)
            part = np.repeat(self._project(i, c), s, axis=0)
            z = part if z is None else z + part
        return np.ascontiguousarray(z.T, dtype=np.float32)
