"""DAC on ONNX Runtime: fixed-length graphs plus the numpy RVQ, for audio of any length.

Two ways through the graphs, both from the official package:
- exact: audio whose length rounds up to the padded graph's frames goes through `encoder.onnx`
  in one call, giving the codes of the official `DAC.encode`;
- chunked: anything else follows the official `compress`: padding off, the signal zero-padded by
  `delay` on both sides, fixed windows stepping by the valid output (`chunk_step`). Codes equal
  `compress(win_duration=window/sample_rate, normalize_db=None)`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import CodesError
from .audio import check_audio, loudness, resample
from .dacfile import DacFile
from .rvq import DacRvq, check_export, check_n_codebooks
from .session import GraphFolder

log = logging.getLogger(__name__)

class DacCodec(GraphFolder):
    """The graphs of one `codec-export dac` folder, opened lazily on one provider."""

    codec, label = "dac", "DAC"
    graphs = ("encoder", "decoder", "encoder_chunked", "decoder_chunked")
    sliding = ("encoder_chunked", "decoder_chunked")
    shared = (*GraphFolder.shared, "hop_length")

    def __init__(self, model_dir: Path, provider: str = "cpu", fallback: str | None = None,
                 options: dict[str, str] | None = None):
        super().__init__(model_dir, provider, fallback, options)
        meta = self.meta
        self.sample_rate, self.hop = int(meta["sample_rate"]), int(meta["hop_length"])
        self.n_codebooks, self.codebook_size = int(meta["n_codebooks"]), int(meta["codebook_size"])
        self.rvq = None
        if meta["quantizer"] == "numpy":
            self.rvq = DacRvq.load(self.dir / "rvq.npz")
            check_export(self.rvq, self.dir / "rvq.npz", meta)

    # ---- encoding ----------------------------------------------------------------------
    def _encode_window(self, name: str, x: np.ndarray, k: int) -> np.ndarray:
        """Codes `[k, frames]` for one window `[samples]` through graph `name`."""
        out = self.graph(name)(x[None, None].astype(np.float32))[0]
        return out[:k].astype(np.int64) if self.rvq is None else self.rvq.encode(out, k)

    def fixed_frames(self) -> int | None:
        """Frames of the fixed-length pair, from whichever of them the folder holds (an app may
        ship only the decoders); None with neither."""
        name = next((g for g in ("encoder", "decoder") if g in self.present), None)
        return None if name is None else self.graph(name).int("frames")

    def fits_exact(self, n: int) -> bool:
        """Whether `n` samples go through the fixed-length graph in one exact call."""
        return math.ceil(n / self.hop) == self.fixed_frames()

    def encode_exact(self, audio: np.ndarray, n_codebooks: int | None = None) -> np.ndarray:
        """Official `encode` codes `[C, K, frames]` for `[C, N]` audio that fits the graph."""
        k, g = check_n_codebooks(n_codebooks, self.n_codebooks), self.graph("encoder")
        if not self.fits_exact(audio.shape[1]):
            raise CodesError(f"{audio.shape[1]} samples do not fit the {g.int('samples')}-sample "
                             "graph; use the chunked mode (compress)")
        x = np.pad(audio, ((0, 0), (0, g.int("samples") - audio.shape[1])))
        return np.stack([self._encode_window("encoder", row, k) for row in x])

    def encode_chunked(self, audio: np.ndarray, n_codebooks: int | None = None,
                       progress: bool = False) -> np.ndarray:
        """Official chunked-`compress` codes `[C, K, n_chunks * chunk_frames]`."""
        k, g = check_n_codebooks(n_codebooks, self.n_codebooks), self.graph("encoder_chunked")
        window, step, delay = g.int("window"), g.int("chunk_step"), g.int("delay")
        n = audio.shape[1]
        starts = range(0, n, step)
        x = np.pad(audio, ((0, 0), (delay, delay + window)))  # tail zeros fill the last window
        windows = [(row, i) for row in range(len(x)) for i in starts]

        def codes_of(w: tuple[int, int]) -> np.ndarray:
            return self._encode_window("encoder_chunked", x[w[0], w[1]:w[1] + window], k)

        chunks = list(tqdm(self.map_windows(codes_of, windows), total=len(windows), desc="encode",
                           unit="chunk", disable=None if progress else True))
        per_row = len(starts)
        return np.stack([np.concatenate(chunks[r * per_row:(r + 1) * per_row], axis=-1)
                         for r in range(len(x))])

    def compress(self, audio: np.ndarray, sample_rate: int, n_codebooks: int | None = None,
                 progress: bool = False) -> DacFile:
        """`[C, N]` audio at any rate and length -> `.dac` content, like the official `compress`.

        The official loudness normalisation to -16 dB is not applied (as `normalize_db=None`);
        the input loudness is still measured and stored so `decompress` restores the level.
        """
        audio = check_audio(audio)
        n_in = audio.shape[1]
        if sample_rate != self.sample_rate:
            log.info("resampling %d Hz -> %d Hz", sample_rate, self.sample_rate)
            audio = resample(audio, sample_rate, self.sample_rate)
        input_db = loudness(audio, self.sample_rate)
        peak = np.abs(audio).max(axis=1, keepdims=True)
        audio = audio / np.maximum(peak, 1.0)  # official `ensure_max_of_audio`
        exact = self.fits_exact(audio.shape[1])
        if exact:
            codes = self.encode_exact(audio, n_codebooks)
        else:
            codes = self.encode_chunked(audio, n_codebooks, progress)
        chunk = codes.shape[-1] if exact else self.graph("encoder_chunked").int("chunk_frames")
        return DacFile(codes=codes, chunk_length=chunk, original_length=n_in, input_db=input_db,
                       channels=audio.shape[0], sample_rate=sample_rate, padding=exact)

    # ---- decoding ----------------------------------------------------------------------
    def _decode_window(self, name: str, codes: np.ndarray) -> np.ndarray:
        """Samples for codes `[K, frames]` through decoder graph `name`."""
        if self.rvq is None:
            if codes.shape[0] != self.n_codebooks:
                raise CodesError(f"this decoder has the quantizer inside and takes exactly "
                                 f"{self.n_codebooks} codebooks, got {codes.shape[0]}")
            return self.graph(name)(codes[None].astype(np.int64))[0, 0]
        return self.graph(name)(self.rvq.decode(codes)[None])[0, 0]

    def decode(self, codes: np.ndarray, padding: bool | None = None,
               progress: bool = False) -> np.ndarray:
        """Audio `[C, samples]` at the model rate for codes `[C, K, T]` (or `[K, T]`).

        `padding=True` is the official `decode` (T must be the graph's frames); `False` decodes
        chunked-mode codes `chunk_frames` at a time; `None` picks by T.
        """
        return np.concatenate(list(self.decode_pieces(codes, padding, progress)), axis=1)

    def decode_pieces(self, codes: np.ndarray, padding: bool | None = None,
                      progress: bool = False) -> Iterator[np.ndarray]:
        """`decode`, one chunk `[C, chunk_step]` at a time: memory does not grow with T."""
        codes = self.check_codes(codes)
        t = codes.shape[-1]
        frames = self.fixed_frames()
        if padding is None:
            padding = t == frames
        if padding:
            if t != frames:
                raise CodesError(f"{t} frames given; the fixed-length decoder takes exactly {frames}")
            yield np.stack([self._decode_window("decoder", c) for c in codes])
            return
        chunk = self.graph("decoder_chunked").int("chunk_frames")
        if t % chunk:
            raise CodesError(f"{t} frames is neither the fixed length {frames} nor a multiple of the "
                             f"chunk length {chunk}; re-encode with this model, or export with "
                             "--len / --chunk-len matching the codes")
        pieces = self.map_windows(
            lambda i: np.stack([self._decode_window("decoder_chunked", c[:, i:i + chunk]) for c in codes]),
            range(0, t, chunk))
        yield from tqdm(pieces, total=t // chunk, desc="decode", unit="chunk",
                        disable=None if progress else True)

    def decompress(self, f: DacFile, progress: bool = False) -> tuple[np.ndarray, int]:
        """Audio `[channels, original_length]` at the original rate, like the official one."""
        if f.codes.shape[0] != f.channels:
            raise CodesError(f"the file has {f.codes.shape[0]} code rows for {f.channels} channels")
        if f.padding:
            audio = self.decode(f.codes, padding=True)
        else:
            chunk = self.graph("decoder_chunked").int("chunk_frames")
            if f.chunk_length != chunk:
                raise CodesError(f"the file was made with chunks of {f.chunk_length} frames, this "
                                 f"model decodes {chunk}; export with the --chunk-len it was made with")
            audio = self.decode(f.codes, padding=False, progress=progress)
        gain_db = f.input_db - loudness(audio, self.sample_rate)
        audio = audio * np.float32(10 ** (gain_db / 20))
        audio = resample(audio, self.sample_rate, f.sample_rate)
        if audio.shape[1] < f.original_length:
            audio = np.pad(audio, ((0, 0), (0, f.original_length - audio.shape[1])))
        return audio[:, :f.original_length], f.sample_rate
