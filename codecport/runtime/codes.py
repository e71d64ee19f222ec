"""`Codes`: what every codec's `encode` returns and its `decode` takes, and the files they live in.

The codes of one clip are one or more integer arrays `[channels, codebooks, frames]`: one for a
codec whose codebooks share a frame rate (DAC, Mimi), one per time scale for a multi-scale codec,
coarse to fine. Beside them travels what it takes to give the original audio back: its length and
sample rate, its loudness where the codec restores it, and which model made them.

Files, picked by suffix (`Codes.save`, `load_codes`):
- `.npy`: the bare array (codecs with one array only); decodes to the model's full frames.
- `.npz`: `codes_0`, `codes_1`, ... plus every other field; what decodes back to the original.
- a codec's own format, declared in its registration (DAC: `.dac`, the official `DACFile`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..errors import CodesError
from .audio import RATES
from .npyfile import read_npy, read_npz

MODES = ("fixed", "chunked", "step", "whole")  # how the audio went through the graphs (see Codec.modes)
MAX_SAMPLES = 1 << 40  # an original length past this (25 years at 1 MHz) is a lying file


@dataclass(frozen=True)
class Codes:
    """Codes of one clip.

    arrays: one `[channels, codebooks, frames]` int64 array per time scale (DAC and Mimi have one).
    codec, variant, export_id: the model that made them (None where the file does not say).
    sample_rate, num_samples: the original audio's rate (Hz) and length (samples at that rate);
        None for bare codes, which decode to the model's rate and full frames.
    loudness_db: the input's loudness (dB LUFS) where the codec restores it on decoding (DAC).
    mode: "fixed", "chunked", "step" or "whole": which graphs made them (DAC's chunked codes must
        be decoded chunk by chunk; "whole" codes are the official whole-clip codes, made in
        overlapping windows); chunk_frames: frames per chunk in chunked mode.
    """

    arrays: tuple[np.ndarray, ...]
    codec: str | None = None
    sample_rate: int | None = None
    num_samples: int | None = None
    loudness_db: float | None = None
    mode: str | None = None
    chunk_frames: int | None = None
    variant: str | None = None
    export_id: str | None = None

    def __post_init__(self):
        arrays = self.arrays if isinstance(self.arrays, (tuple, list)) else (self.arrays,)
        if not arrays:
            raise CodesError("codes hold no arrays")
        checked = []
        for a in arrays:
            a = np.asarray(a)
            if a.ndim == 2:
                a = a[None]
            if a.ndim != 3 or 0 in a.shape:
                raise CodesError(f"codes must be [channels, codebooks, frames], got shape {list(a.shape)}")
            if a.dtype.kind not in "ui":
                raise CodesError(f"codes must be integers, got {a.dtype}")
            checked.append(a.astype(np.int64, copy=False))
        if len({a.shape[0] for a in checked}) != 1:
            raise CodesError(f"the code arrays disagree on the channel count: "
                             f"{[a.shape[0] for a in checked]}")
        object.__setattr__(self, "arrays", tuple(checked))
        self._check_fields()

    def _check_fields(self) -> None:
        if self.sample_rate is not None and not RATES[0] <= self.sample_rate <= RATES[1]:
            raise CodesError(f"original sample rate {self.sample_rate} is not an audio rate "
                             f"({RATES[0]} to {RATES[1]} Hz); the file is damaged, re-encode the audio")
        if self.num_samples is not None and not 1 <= self.num_samples <= MAX_SAMPLES:
            raise CodesError(f"original length {self.num_samples} is impossible; the file is "
                             "damaged, re-encode the audio")
        if (self.sample_rate is None) != (self.num_samples is None):
            raise CodesError("codes need both the original sample rate and length, or neither")
        if self.loudness_db is not None and not -300.0 <= self.loudness_db <= 100.0:
            raise CodesError(f"loudness {self.loudness_db} dB is not a measured level; the file "
                             "is damaged, re-encode the audio")
        if self.mode is not None and self.mode not in MODES:
            raise CodesError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.chunk_frames is not None and not 1 <= self.chunk_frames <= 1 << 31:
            raise CodesError(f"chunk length {self.chunk_frames} frames is impossible")

    # ---- shape ---------------------------------------------------------------------------
    @property
    def data(self) -> np.ndarray:
        """The one array `[channels, codebooks, frames]`, for codecs with a single time scale."""
        if len(self.arrays) != 1:
            raise CodesError(f"these codes have {len(self.arrays)} time scales; use .arrays")
        return self.arrays[0]

    @property
    def channels(self) -> int:
        return self.arrays[0].shape[0]

    @property
    def n_codebooks(self) -> int:
        """Codebooks over every time scale."""
        return sum(a.shape[1] for a in self.arrays)

    @property
    def n_frames(self) -> tuple[int, ...]:
        """Frames of each time scale."""
        return tuple(a.shape[2] for a in self.arrays)

    def replace(self, **changes) -> Codes:
        return Codes(**{f.name: changes.get(f.name, getattr(self, f.name)) for f in fields(self)})

    # ---- files ---------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write to `path` (atomically) in the format its suffix names; see the module doc."""
        path = Path(path)
        if path.suffix == ".npy":
            check_npy(path, len(self.arrays))
            with atomic_path(path) as tmp, open(tmp, "wb") as f:
                np.save(f, self.data)
        elif path.suffix == ".npz":
            with atomic_path(path) as tmp, open(tmp, "wb") as f:
                np.savez(f, **_npz_fields(self))
        else:
            _codec_format(path, self.codec).save(self, path)


def check_npy(path: Path, levels: int) -> None:
    """A bare `.npy` holds one array: codes of several time scales need `.npz` or a layout."""
    if levels > 1:
        from .. import registry

        names = registry.layout_names()
        hint = f" (or a flat layout: --layout {' / '.join(names)})" if names else ""
        raise CodesError(f"{path}: codes of {levels} time scales do not fit one .npy; write .npz{hint}")


def _level_arrays(codec: str | None) -> bool:
    """Whether `codec` keeps one codebook per time scale, written `[channels, frames]` (SNAC's
    official shape) rather than `[channels, codebooks, frames]`."""
    from .. import registry

    return codec in registry.names() and registry.get(codec).level_arrays


def _npz_fields(codes: Codes) -> dict[str, np.ndarray]:
    flat = _level_arrays(codes.codec) and all(a.shape[1] == 1 for a in codes.arrays)
    out = {f"codes_{i}": a[:, 0] if flat else a for i, a in enumerate(codes.arrays)}
    for f in fields(codes):
        value = getattr(codes, f.name)
        if f.name != "arrays" and value is not None:
            out[f.name] = np.array(value)
    return out


_INTS, _FLOATS, _TEXTS = ("sample_rate", "num_samples", "chunk_frames"), ("loudness_db",), \
    ("codec", "mode", "variant", "export_id")


def _codes_from_npz(path: Path, z: dict[str, np.ndarray]) -> Codes:
    names = list(itertools.takewhile(z.__contains__, (f"codes_{i}" for i in itertools.count())))
    if not names and "codes" in z:  # written before codecport 0.2: one array, `length`
        names, z = ["codes"], {**z, "num_samples": z.get("length")}
    if not names:
        raise CodesError(f"{path}: not a codes file written by codec-run encode (no codes_0 array)")
    if "codec" not in z:
        raise CodesError(f"{path}: not a codes file written by codec-run encode (it names no codec)")
    kw = {}
    for key in (*_INTS, *_FLOATS, *_TEXTS):
        if key not in z or z[key] is None:
            continue
        v = z[key]
        if v.shape != ():
            raise CodesError(f"{path}: {key} must be one value, got shape {list(v.shape)}")
        if key in _TEXTS:
            if v.dtype.kind != "U":
                raise CodesError(f"{path}: {key} must be text, got {v.dtype}")
            kw[key] = str(v)
        elif key in _INTS:
            if v.dtype.kind not in "ui":
                raise CodesError(f"{path}: {key} must be an integer, got {v.dtype}")
            kw[key] = int(v)
        else:
            if v.dtype.kind != "f" or not math.isfinite(float(v)):
                raise CodesError(f"{path}: {key} must be a finite number, got {v}")
            kw[key] = float(v)
    arrays = [z[n] for n in names]
    if _level_arrays(kw.get("codec")):  # [channels, frames] per time scale
        arrays = [a[:, None] if a.ndim == 2 else a for a in arrays]
    try:
        return Codes(tuple(arrays), **kw)
    except CodesError as e:
        raise CodesError(f"{path}: {e}") from None


def load_codes(path: str | Path) -> Codes:
    """Codes from a `.npy`, `.npz` or codec-format file (see the module doc), every field checked."""
    path = Path(path)
    if not path.is_file():
        raise CodesError(f"{path}: no such codes file")
    if path.suffix == ".npy":
        array = read_npy(path, CodesError)
        try:
            return Codes((array,))
        except CodesError as e:
            raise CodesError(f"{path}: {e}") from None
    if path.suffix == ".npz":
        try:
            z = read_npz(path, CodesError)
        except CodesError as e:
            raise CodesError(f"{e}; not a codes file written by codec-run encode") from None
        return _codes_from_npz(path, z)
    return _codec_format(path, None).load(path)


def _codec_format(path: Path, codec: str | None):
    """The codec-declared format for `path`'s suffix (from the registry)."""
    from .. import registry

    fmt = registry.code_format(path.suffix, codec)
    if fmt is None:
        known = sorted({".npy", ".npz", *registry.code_suffixes()})
        raise CodesError(f"{path}: {path.suffix or 'no suffix'} is not a codes format; use "
                         f"{', '.join(known)}")
    return fmt
