"""Audio I/O, resampling and loudness, with one-line errors for bad input."""

from __future__ import annotations

import itertools
import logging
import warnings
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from ..atomic import atomic_path
from ..errors import AudioError

log = logging.getLogger(__name__)

MIN_LOUDNESS = -70.0  # dB LUFS; the BS.1770 absolute gate, so silence gets a finite level


def read_audio(path: Path) -> tuple[np.ndarray, int]:
    """`([channels, samples] float32, sample_rate)`; empty, unreadable or non-finite is an error."""
    try:
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as e:
        raise AudioError(f"{path}: cannot read audio ({e}); pass a WAV, FLAC or OGG file") from e
    return check_audio(data.T, str(path)), sr


def check_audio(audio: np.ndarray, what: str = "audio") -> np.ndarray:
    if audio.ndim != 2 or audio.shape[1] == 0:
        raise AudioError(f"{what}: contains no samples; pass a non-empty recording")
    if not np.isfinite(audio).all():
        raise AudioError(f"{what}: contains NaN or infinite samples; fix the file before encoding")
    return np.ascontiguousarray(audio, dtype=np.float32)


def resample(audio: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """`[channels, samples]` from `sr_in` to `sr_out` with soxr (VHQ)."""
    if sr_in == sr_out:
        return audio
    out = soxr.resample(audio.T, sr_in, sr_out, quality="VHQ")
    return np.ascontiguousarray(out.reshape(-1, audio.shape[0]).T, dtype=np.float32)


def loudness(audio: np.ndarray, sr: int) -> float:
    """Integrated loudness (ITU-R BS.1770, pyloudnorm) in dB LUFS, floored at -70.

    Clips shorter than the 400 ms gating block are measured zero-padded to one block; more than
    five channels are measured as their downmix.
    """
    import pyloudnorm

    meter = pyloudnorm.Meter(sr)
    block = int(np.ceil(meter.block_size * sr)) + 1
    x = audio.T.astype(np.float64)
    if x.shape[1] > 5:  # BS.1770 weights at most 5 channels; measure the downmix instead
        x = x.mean(axis=1, keepdims=True)
    if x.shape[0] < block:
        x = np.pad(x, ((0, block - x.shape[0]), (0, 0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pyloudnorm warns on silence (-inf)
        db = meter.integrated_loudness(x)
    return max(float(db), MIN_LOUDNESS)


def write_audio(path: Path, audio: np.ndarray, sr: int) -> None:
    """Write `[channels, samples]` atomically (temp file + rename); format from the suffix."""
    write_audio_pieces(path, [audio], sr)


def write_audio_pieces(path: Path, pieces: Iterable[np.ndarray], sr: int) -> tuple[int, int]:
    """Write pieces `[channels, n]` one after another, atomically, holding one piece at a time.

    Returns (channels, samples) written."""
    fmt = path.suffix.lstrip(".").upper() or "WAV"
    if fmt not in sf.available_formats():
        raise AudioError(f"{path}: unknown audio format {fmt!r}; use .wav or .flac")
    it = iter(pieces)
    first = next(it)  # before the file exists: a bad first piece leaves nothing behind
    n = 0
    with atomic_path(path) as tmp, sf.SoundFile(tmp, "w", sr, first.shape[0], format=fmt,
                                                 subtype="FLOAT" if fmt == "WAV" else None) as f:
        for piece in itertools.chain([first], it):
            f.write(np.clip(piece, -1.0, 1.0).T)
            n += piece.shape[1]
    return first.shape[0], n

