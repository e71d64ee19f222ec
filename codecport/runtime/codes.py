"""`Codes`: what every codec's `encode` returns and its `decode` takes.

The codes of one clip are one or more integer arrays `[channels, codebooks, frames]`: one for a
codec whose codebooks share a frame rate (DAC, Mimi), one per time scale for a multi-scale codec,
coarse to fine (SNAC). Beside them travels what it takes to give the original audio back: its
length and sample rate, its loudness where the codec restores it, and which model made them.
`Codes.save` and `load_codes` write and read the files of codefile.py, picked by suffix.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from pathlib import Path

import numpy as np

from ..errors import CodesError
from . import codefile
from .audio import MAX_CHANNELS, RATES

# how the audio went through the graphs (see Codec.modes)
MODES = ("fixed", "chunked", "step", "whole", "windowed")
MAX_SAMPLES = 1 << 40  # an original length past this (25 years at 1 MHz) is a lying file


@dataclass(frozen=True)
class Codes:
    """Codes of one clip.

    arrays: one `[channels, codebooks, frames]` int64 array per time scale (DAC and Mimi have one).
    codec, preset, export_id: the model that made them (None where the file does not say).
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
    preset: str | None = None
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
        if checked[0].shape[0] > MAX_CHANNELS:  # no audio codecport encodes has more
            raise CodesError(f"codes of shape {list(checked[0].shape)} have {checked[0].shape[0]} channels, "
                             f"more than {MAX_CHANNELS}: are they [frames, codebooks, channels] "
                             "(tokens saved as [frames, 1, 1])? pass [channels, codebooks, frames]")
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

    @property
    def fields(self) -> dict:
        """Everything but the arrays, by name."""
        return {f.name: getattr(self, f.name) for f in dataclass_fields(self) if f.name != "arrays"}

    @property
    def bare(self) -> bool:
        """Codes that name no codec (a bare `.npy` or `.npz`): decoded with the folder's."""
        return self.codec is None

    def frames(self, start: int, stop: int | None = None) -> Codes:
        """Bare codes of frames [start, stop) of the coarsest time scale, every time scale cut
        alike (one with r codes a coarse frame keeps [r * start, r * stop))."""
        n = self.n_frames[0]
        stop = n if stop is None else min(stop, n)
        if not 0 <= start < stop:
            raise CodesError(f"frames [{start}, {stop}) are not within the codes' {n} frames")
        return Codes(tuple(a[..., start * (a.shape[2] // n):stop * (a.shape[2] // n)] for a in self.arrays))

    def replace(self, **changes) -> Codes:
        return Codes(**{f.name: changes.get(f.name, getattr(self, f.name)) for f in dataclass_fields(self)})

    # ---- files ---------------------------------------------------------------------------
    def save(self, path: str | Path, layout: str | None = None) -> None:
        """Write to `path` (atomically) in the format its suffix names, or in `layout`
        (codefile.py)."""
        codefile.write(Path(path), list(self.arrays), self.fields, layout)


def load_codes(path: str | Path, layout: str | None = None) -> Codes:
    """Codes from a file `Codes.save` or `codec-run encode` wrote (or the official packages:
    `.dac`, arrays saved with `np.save`/`np.savez`), every field checked."""
    path = Path(path)
    arrays, fields_ = codefile.read(path, layout)
    try:
        return Codes(tuple(arrays), **fields_)
    except CodesError as e:
        raise CodesError(f"{path}: {e}") from None
