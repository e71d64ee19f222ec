"""Audio in and out, block by block: sources that can be read more than once, streamed
resampling, and writers that never leave a half-written file. Memory never grows with the length
of a file. soundfile and soxr are imported where they are used: the CLI's `--help` and the code
files need neither.
"""

from __future__ import annotations

import io
import itertools
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..errors import AudioError

log = logging.getLogger(__name__)

BLOCK = 1 << 16  # frames read, resampled and measured at a time
RATES = (1_000, 1_000_000)  # sample rates codecport takes, in Hz
MAX_CHANNELS = 64
# Samples past this are not audio: audio is in [-1, 1], and int16 PCM passed as floats (a common
# slip, which DAC's peak limit still takes) reaches it at most. Far past it a codec's arithmetic
# overflows into NaN features and codes of nothing, and DAC's loudness leaves what a codes file holds.
MAX_AMPLITUDE = float(1 << 15)
# libvorbis crashes the process (SIGSEGV) on a rate past this instead of refusing it, so an Ogg
# Vorbis file is refused past it before libsndfile is asked.
VORBIS_MAX_RATE = 200_000
# Past this many bytes of samples a RIFF WAV's 32-bit sizes overflow: write RF64 instead.
WAV_LIMIT = 0xFFFFFFFF - (1 << 16)


def check_rate(sample_rate, what: str = "audio") -> int:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or \
            not RATES[0] <= sample_rate <= RATES[1]:
        raise AudioError(f"{what}: sample rate {sample_rate!r} is not one codecport takes "
                         f"({RATES[0]} to {RATES[1]} Hz); pass the rate the audio was recorded at")
    return int(sample_rate)


def check_audio(audio, what: str = "audio") -> np.ndarray:
    """`audio` as `[channels, samples]` float32: 1-D is mono; empty, non-float or non-finite
    audio is an `AudioError`."""
    audio = np.asarray(audio)
    if audio.ndim == 1:
        audio = audio[None]
    if audio.dtype.kind != "f":
        raise AudioError(f"{what}: samples are {audio.dtype}, not floats; pass float audio in "
                         "[-1, 1] (int16 PCM divided by 32768)")
    if audio.ndim != 2:
        raise AudioError(f"{what}: audio must be [samples] or [channels, samples], got shape "
                         f"{list(audio.shape)}")
    if audio.shape[1] == 0 or audio.shape[0] == 0:
        raise AudioError(f"{what}: contains no samples; pass a non-empty recording")
    if audio.shape[0] > MAX_CHANNELS:
        raise AudioError(f"{what}: {audio.shape[0]} channels is more than {MAX_CHANNELS}; is it "
                         "[samples, channels]? pass [channels, samples]")
    check_samples(audio, what)
    return np.ascontiguousarray(audio, dtype=np.float32)


def check_samples(x: np.ndarray, what: str = "audio") -> None:
    """Samples that are audio, else an `AudioError`: none NaN or infinite, none past
    `MAX_AMPLITUDE` (a codec's arithmetic overflows on those into codes of nothing)."""
    peak = float(np.abs(x).max()) if x.size else 0.0  # NaN where any sample is
    if not np.isfinite(peak):
        raise AudioError(f"{what}: contains NaN or infinite samples; fix the input before encoding")
    if peak > MAX_AMPLITUDE:
        raise AudioError(f"{what}: samples reach {peak:.3g}, which no audio in [-1, 1] does; scale "
                         "it to [-1, 1] (integer PCM divided by its full scale, e.g. 32768)")


class ArraySource:
    """Audio held in memory, `[channels, samples]`, read as blocks."""

    def __init__(self, audio, sample_rate, what: str = "audio"):
        self.audio = check_audio(audio, what)
        self.sample_rate = check_rate(sample_rate, what)
        self.channels, self.frames = self.audio.shape
        self.what = what

    def blocks(self) -> Iterator[np.ndarray]:
        for i in range(0, self.frames, BLOCK):
            yield self.audio[:, i:i + BLOCK]


class FileSource:
    """An audio file soundfile reads (WAV, FLAC, OGG, MP3...), read block by block each time
    `blocks()` is called; every block is checked as it is read. `data` holds the file's bytes
    where they come from elsewhere (a row of a Parquet dataset); `path` then only names it."""

    def __init__(self, path: str | Path, data: bytes | None = None):
        self.path, self.data = Path(path), data
        self.what = str(self.path)
        info = self._open()
        with info:
            self.sample_rate = check_rate(info.samplerate, self.what)
            self.channels, self.frames = info.channels, info.frames
        if self.channels > MAX_CHANNELS:
            raise AudioError(f"{self.what}: {self.channels} channels is more than {MAX_CHANNELS}")

    def _open(self):
        import soundfile as sf

        try:
            return sf.SoundFile(str(self.path) if self.data is None else io.BytesIO(self.data))
        except (sf.LibsndfileError, RuntimeError, OSError, TypeError) as e:
            raise AudioError(f"{self.path}: cannot read audio ({e}); pass a WAV, FLAC or OGG file") from e

    def blocks(self) -> Iterator[np.ndarray]:
        import soundfile as sf

        n = 0
        with self._open() as f:
            while True:
                try:
                    block = f.read(BLOCK, dtype="float32", always_2d=True)
                except (sf.LibsndfileError, RuntimeError, OSError) as e:
                    raise AudioError(f"{self.path}: cannot read audio after {n} samples ({e})") from e
                if not len(block):
                    break
                check_samples(block, self.what)
                n += len(block)
                yield np.ascontiguousarray(block.T)
        if n == 0:
            raise AudioError(f"{self.path}: contains no samples; pass a non-empty recording")


class Counted:
    """A source whose blocks are counted as they are read: `counted` samples at its own rate
    (a file's header may promise more than it holds)."""

    def __init__(self, source):
        self.source, self.counted = source, 0
        self.sample_rate, self.channels, self.frames = source.sample_rate, source.channels, source.frames

    def blocks(self) -> Iterator[np.ndarray]:
        for b in self.source.blocks():
            self.counted += b.shape[1]
            yield b


def resampled(blocks: Iterable[np.ndarray], sr_in: int, sr_out: int, channels: int) -> Iterator[np.ndarray]:
    """Blocks `[channels, n]` at `sr_in` as blocks at `sr_out` (soxr VHQ, streamed: the same
    samples as one `soxr.resample` call over the whole signal, whatever the blocks)."""
    if sr_in == sr_out:
        yield from blocks
        return
    import soxr

    stream = soxr.ResampleStream(sr_in, sr_out, channels, dtype="float32", quality="VHQ")
    it = iter(blocks)
    block = next(it, None)
    while block is not None:
        nxt = next(it, None)
        out = stream.resample_chunk(np.ascontiguousarray(block.T), last=nxt is None)
        if len(out):
            yield np.ascontiguousarray(out.T)
        block = nxt


def resample(audio: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """`[channels, samples]` from `sr_in` to `sr_out` with soxr (VHQ)."""
    if sr_in == sr_out:
        return audio
    import soxr

    out = soxr.resample(audio.T, sr_in, sr_out, quality="VHQ")
    return np.ascontiguousarray(out.reshape(-1, audio.shape[0]).T, dtype=np.float32)


def resampled_length(n: int, sr_in: int, sr_out: int) -> int:
    """Samples soxr gives for `n` samples from `sr_in` to `sr_out` (give or take one)."""
    return round(n * sr_out / sr_in)


def read_audio(path: str | Path) -> tuple[np.ndarray, int]:
    """`([channels, samples] float32, sample_rate)` of a whole file; empty, unreadable or
    non-finite audio is an `AudioError`."""
    src = FileSource(path)
    return np.concatenate(list(src.blocks()), axis=1), src.sample_rate


def audio_format(path: Path, channels: int = 1, frames: int = 0, sample_rate: int | None = None) -> str:
    """The soundfile format for `path` by its suffix; a WAV too big for RIFF's 32-bit sizes
    becomes RF64 (which players and soundfile read as WAV). With `sample_rate`, libsndfile is
    asked whether the format holds `channels` channels at that rate (FLAC holds 8, MP3 takes a
    few rates...): an `AudioError` naming the limit where it does not, before any work."""
    import soundfile as sf

    fmt = path.suffix.lstrip(".").upper()
    if fmt not in sf.available_formats() or fmt == "RAW":
        raise AudioError(f"{path}: {fmt or 'no suffix'} is not an audio format codecport writes; "
                         "use .wav or .flac")
    if sample_rate is not None and _unwritable(fmt, channels, sample_rate):
        if _unwritable(fmt, 1, sample_rate) is None:  # the channels: the most the format holds
            most = next(c for c in range(channels - 1, 0, -1) if _unwritable(fmt, c, sample_rate) is None)
            raise AudioError(f"{path}: {fmt} holds at most {most} channels, this audio has {channels}; "
                             "write a .wav")
        raise AudioError(f"{path}: {fmt} cannot be written at {sample_rate} Hz "
                         f"({_unwritable(fmt, 1, sample_rate)}); write a .wav")
    if fmt == "WAV" and channels * frames * 4 > WAV_LIMIT:
        return "RF64"
    return fmt


def _subtype(fmt: str) -> str | None:
    return "FLOAT" if fmt in ("WAV", "RF64") else None


def _unwritable(fmt: str, channels: int, sample_rate: int) -> str | None:
    """Why libsndfile cannot write `fmt` with `channels` at `sample_rate` (its words), or None
    where it can: it is asked by opening such a file in memory."""
    import soundfile as sf

    if fmt == "OGG" and sample_rate > VORBIS_MAX_RATE:
        return f"Ogg Vorbis takes at most {VORBIS_MAX_RATE} Hz"
    try:
        with sf.SoundFile(io.BytesIO(), "w", sample_rate, channels, format=fmt, subtype=_subtype(fmt)):
            pass
    except (sf.LibsndfileError, RuntimeError, ValueError, TypeError) as e:
        return (getattr(e, "error_string", None) or str(e)).strip().removeprefix("Error : ").rstrip(".")
    return None


def write_audio(path: Path, audio: np.ndarray, sr: int) -> None:
    """Write `[channels, samples]` atomically (temp file + rename); format from the suffix."""
    write_audio_pieces(path, [audio], sr, audio.shape[1])


def write_audio_pieces(path: Path, pieces: Iterable[np.ndarray], sr: int,
                       frames: int | None = None) -> tuple[int, int]:
    """Write pieces `[channels, n]` one after another, atomically, holding one piece at a time.
    `frames`, the total when known, picks RF64 for a WAV past 4 GiB.

    Returns (channels, samples) written."""
    import soundfile as sf

    it = iter(pieces)
    first = next(it)  # before the file exists: a bad first piece leaves nothing behind
    fmt = audio_format(path, first.shape[0], frames or 0, sr)
    n = 0
    with atomic_path(path) as tmp, sf.SoundFile(tmp, "w", sr, first.shape[0], format=fmt,
                                                 subtype=_subtype(fmt)) as f:
        for piece in itertools.chain([first], it):
            f.write(np.clip(piece, -1.0, 1.0).T)
            n += piece.shape[1]
    return first.shape[0], n
