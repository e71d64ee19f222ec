"""Orpheus TTS's flat layout of SNAC 24 kHz codes (`codec-run encode/decode --layout orpheus`):
seven codes a coarse frame, in the order Orpheus's language model emits them (without its token
offsets). The arrays are `Codes.arrays`: three time scales `[channels, 1, frames_l]`, coarse first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...atomic import atomic_path
from ...errors import CodesError
from ...runtime.codefile import Layout
from ...runtime.npyfile import read_npy


def to_orpheus(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """`[channels, 7 * coarse frames]`: per coarse frame j, c0[j], c1[2j], c2[4j], c2[4j+1],
    c1[2j+1], c2[4j+2], c2[4j+3], as Orpheus orders them."""
    if len(arrays) != 3 or any(a.ndim != 3 or a.shape[1] != 1 for a in arrays):
        raise CodesError(f"the Orpheus layout is for 3 time scales of one codebook each (SNAC 24 kHz), "
                         f"these codes are {[list(a.shape) for a in arrays]}")
    c0, c1, c2 = (a[:, 0] for a in arrays)
    j = c0.shape[1]
    if c1.shape[1] != 2 * j or c2.shape[1] != 4 * j:
        raise CodesError("the Orpheus layout needs 1, 2 and 4 codes a coarse frame (SNAC 24 kHz)")
    flat = np.stack([c0, c1[:, 0::2], c2[:, 0::4], c2[:, 1::4], c1[:, 1::2], c2[:, 2::4], c2[:, 3::4]],
                    axis=-1)
    return flat.reshape(c0.shape[0], 7 * j)


def from_orpheus(flat: np.ndarray) -> list[np.ndarray]:
    """The three time scales `[channels, 1, frames_l]` of an Orpheus sequence `[7 * frames]`
    (mono) or `[channels, 7 * frames]`."""
    flat = np.asarray(flat)
    if flat.dtype.kind not in "ui":
        raise CodesError(f"an Orpheus sequence holds integer codes, got {flat.dtype}")
    flat = flat[None] if flat.ndim == 1 else flat
    if flat.ndim != 2 or 0 in flat.shape or flat.shape[1] % 7:
        raise CodesError(f"an Orpheus sequence is 7 codes a coarse frame, [channels, 7 * frames]; got "
                         f"shape {list(flat.shape)}")
    g = flat.reshape(flat.shape[0], -1, 7).astype(np.int64)
    c0 = g[..., 0]
    c1 = np.stack([g[..., 1], g[..., 4]], axis=-1).reshape(flat.shape[0], -1)
    c2 = np.stack([g[..., 2], g[..., 3], g[..., 5], g[..., 6]], axis=-1).reshape(flat.shape[0], -1)
    return [c0[:, None], c1[:, None], c2[:, None]]


def write(path: Path, arrays: Sequence[np.ndarray], fields: dict) -> None:
    """The flat sequence as a bare `.npy` (`[7 * frames]` for mono): the layout has no room for
    the original length and rate, so it decodes to the model's full frames."""
    flat = to_orpheus(arrays)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, flat[0] if flat.shape[0] == 1 else flat)


def read(path: Path) -> tuple[list[np.ndarray], dict]:
    flat = read_npy(path, CodesError)  # (its errors name the file)
    try:
        return from_orpheus(flat), {}
    except CodesError as e:
        raise CodesError(f"{path}: {e}") from None


# runtime/codefile.py, where the registry adds it: `codec-run encode --layout orpheus`.
LAYOUTS = (Layout("orpheus", ".npy", "snac", "the flat sequence Orpheus TTS uses, 7 codes a coarse frame",
                  read, write),)
