"""Mimi on ONNX Runtime: fixed-length and streaming step graphs plus the numpy split RVQ.

Mimi is causal end to end, so both ways through the graphs give moshi's codes exactly:
- fixed: audio up to the graph's length is zero-padded to it (moshi pads to whole frames the
  same way; later padding cannot change earlier frames) and the first frames are kept;
- streaming: anything longer goes through `encoder_step`/`decoder_step`, carrying the state
  between calls, which equals the whole-clip result with no seams (the step graphs are validated
  against the whole clip at export). The state stays on the provider's device between steps
  through IO binding (see `MimiStream`).
"""

from __future__ import annotations

import logging
import math
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..atomic import atomic_path
from ..errors import AudioError, CodesError, ModelFileError
from .audio import check_audio, resample
from .rvq import MimiRvq, check_export, check_n_codebooks
from .session import GraphFolder, StepRunner

log = logging.getLogger(__name__)

MOSHI_CODEBOOKS = 8  # what Moshi uses; the default unless asked for more (up to all 32)


class MimiCodec(GraphFolder):
    """The graphs of one `codec-export mimi` folder, opened lazily on one provider.

    `options={"io_binding": "0"}` (CLI: `--provider-option io_binding=0`) makes every stream
    carry its state as numpy arrays instead of through IO binding; see `MimiStream`.
    """

    codec, label = "mimi", "Mimi"
    graphs = ("encoder", "decoder", "encoder_step", "decoder_step")
    shared = (*GraphFolder.shared, "frame_size")

    def __init__(self, model_dir: Path, provider: str = "cpu", fallback: str | None = None,
                 options: dict[str, str] | None = None):
        super().__init__(model_dir, provider, fallback, options)
        meta = self.meta
        self.sample_rate, self.frame_size = int(meta["sample_rate"]), int(meta["frame_size"])
        self.n_codebooks, self.codebook_size = int(meta["n_codebooks"]), int(meta["codebook_size"])
        self.rvq = None
        if meta["quantizer"] == "numpy":
            self.rvq = MimiRvq.load(self.dir / "rvq.npz")
            check_export(self.rvq, self.dir / "rvq.npz", meta)

    def expected(self, name: str) -> dict[str, str]:
        return {"role": name.split("_")[0], "mode": "step" if "step" in name else "fixed"}

    def missing(self, name: str) -> str:
        return f"export with {'--streaming' if 'step' in name else '--len'}"

    def default_codebooks(self, n_codebooks: int | None) -> int:
        default = min(MOSHI_CODEBOOKS, self.n_codebooks)
        return check_n_codebooks(default if n_codebooks is None else n_codebooks, self.n_codebooks)

    def fits_fixed(self, n: int) -> bool:
        """Whether `n` samples at 24 kHz go through the fixed-length encoder in one call."""
        return self._fits("encoder", "samples", n)

    # ---- codes <-> what the graphs take --------------------------------------------------
    def _to_codes(self, y: np.ndarray, k: int) -> np.ndarray:
        """Encoder output `[1, C|K, T]` -> codes `[k, T]`."""
        return y[0, :k].astype(np.int64) if self.rvq is None else self.rvq.encode(y[0], k)

    def _from_codes(self, codes: np.ndarray) -> np.ndarray:
        """Codes `[K, T]` -> decoder input `[1, C|K, T]`."""
        if self.rvq is None:
            if codes.shape[0] != self.n_codebooks:
                raise CodesError(f"this decoder has the quantizer inside and takes exactly "
                                 f"{self.n_codebooks} codebooks, got {codes.shape[0]}")
            return codes[None].astype(np.int64)
        return self.rvq.decode(codes)[None]

    def _fits(self, name: str, key: str, n: int) -> bool:
        """Whether `n` samples/frames fit the fixed-length graph `name` (when there is one)."""
        return name in self.present and n <= self.graph(name).int(key)

    # ---- encoding ------------------------------------------------------------------------
    def encode(self, audio: np.ndarray, sample_rate: int, n_codebooks: int | None = None,
               streaming: bool = False, progress: bool = False) -> np.ndarray:
        """Codes `[C, K, ceil(N' / frame_size)]` for audio `[C, N]` at any rate (N' at 24 kHz).

        Each channel is encoded on its own (Mimi is mono). `n_codebooks` defaults to Moshi's 8.
        `streaming` forces the step graphs.
        """
        k = self.default_codebooks(n_codebooks)
        audio = check_audio(audio)
        if sample_rate != self.sample_rate:
            log.info("resampling %d Hz -> %d Hz", sample_rate, self.sample_rate)
            audio = resample(audio, sample_rate, self.sample_rate)
        frames = math.ceil(audio.shape[1] / self.frame_size)
        if not streaming and self.fits_fixed(audio.shape[1]):
            g = self.graph("encoder")
            x = np.pad(audio, ((0, 0), (0, g.int("samples") - audio.shape[1])))
            return np.stack([self._to_codes(g(row[None, None]), k)[:, :frames] for row in x])
        self._need_steps("encoder", streaming, lambda: f"{audio.shape[1]} samples are longer than "
                         f"the fixed {self.graph('encoder').int('samples')}-sample encoder")
        out = []
        for row in audio:
            stream = MimiStream(self, k)
            steps = range(0, row.shape[0], stream.step_samples)
            codes = [stream.encode_step(row[i:i + stream.step_samples])
                     for i in tqdm(steps, desc="encode", unit="step", disable=None if progress else True)]
            out.append(np.concatenate([*codes, stream.flush_encoder()], axis=1))
        return np.stack(out)

    def _need_steps(self, side: str, streaming: bool, too_long: Callable[[], str]) -> None:
        """Refuse, saying why, when the step graphs of `side` are needed but not exported
        (`too_long` is called only then: it may open the fixed graph)."""
        if f"{side}_step" in self.present:
            return
        if streaming:
            raise ModelFileError(f"{self.dir} has no step graphs ({side}_step.onnx or .ort) to "
                                 "stream through; export with --streaming")
        raise CodesError(f"{too_long()}; export with --streaming to handle any length")

    # ---- decoding ------------------------------------------------------------------------
    def decode_file(self, path: Path, streaming: bool = False,
                    progress: bool = False) -> tuple[np.ndarray, int]:
        """Audio `[C, length]` at the original rate from a `.npz` written by `save_codes`."""
        codes, length, sr = load_codes(path)
        codes = self.check_codes(codes)
        frames = math.ceil(math.ceil(length * self.sample_rate / sr) / self.frame_size)
        if abs(codes.shape[2] - frames) > 1:  # resampling may round by a sample
            raise CodesError(f"{path}: {codes.shape[2]} frames cannot be {length} samples at {sr} Hz "
                             f"({frames} frames); the file is inconsistent, re-encode the audio")
        audio = resample(self.decode(codes, streaming, progress), self.sample_rate, sr)
        return np.pad(audio, ((0, 0), (0, max(0, length - audio.shape[1]))))[:, :length], sr

    def decode(self, codes: np.ndarray, streaming: bool = False, progress: bool = False) -> np.ndarray:
        """Audio `[C, T * frame_size]` at 24 kHz for codes `[C, K, T]` (or `[K, T]`)."""
        codes = self.check_codes(codes)
        frames = codes.shape[2]
        if not streaming and self._fits("decoder", "frames", frames):
            g = self.graph("decoder")
            # Code 0 pads the tail; being causal, the decoder's first samples do not see it.
            padded = np.pad(codes, ((0, 0), (0, 0), (0, g.int("frames") - frames)))
            return np.stack([g(self._from_codes(c))[0, 0, :frames * self.frame_size] for c in padded])
        self._need_steps("decoder", streaming, lambda: f"{frames} frames are more than the fixed "
                         f"decoder's {self.graph('decoder').int('frames')}")
        return np.concatenate(list(self._stream_pieces(codes, progress)), axis=1)

    def decode_pieces(self, codes: np.ndarray, streaming: bool = False,
                      progress: bool = False) -> Iterator[np.ndarray]:
        """`decode`, one step `[C, samples]` at a time when streaming: memory does not grow
        with T. Codes that fit the fixed decoder come in one piece."""
        codes = self.check_codes(codes)
        if not streaming and self._fits("decoder", "frames", codes.shape[2]):
            yield self.decode(codes)
        else:
            yield from self._stream_pieces(codes, progress)

    def _stream_pieces(self, codes: np.ndarray, progress: bool) -> Iterator[np.ndarray]:
        """Every channel through its own stream, in lockstep, one step of audio at a time."""
        streams = [MimiStream(self) for _ in codes]
        n = streams[0].step_frames
        for i in tqdm(range(0, codes.shape[2], n), desc="decode", unit="step",
                      disable=None if progress else True):
            yield np.stack([s.decode_step(c[:, i:i + n]) for s, c in zip(streams, codes)])
        yield np.stack([s.flush_decoder() for s in streams])


class MimiStream:
    """Streaming encode and decode through the step graphs, carrying their state between steps.

    `encode_step(pcm)` takes any number of 24 kHz samples and returns the codes `[K, t]` of every
    step completed so far (t may be 0); `decode_step(codes)` takes any number of code frames and
    returns the audio of every completed step. Partial steps wait in a buffer until the next call,
    or until `flush_encoder()`/`flush_decoder()` pads them with zeros and returns the rest.
    `reset()` starts a new stream. Codes have `n_codebooks` levels (default Moshi's 8).

    `io_binding` (default: the codec's `io_binding` option, on unless `options` say
    `io_binding=0`) keeps the state as OrtValues on the provider's device through IO binding:
    on CUDA it never leaves GPU memory, only the step's audio or codes cross to the host.
    Without it the state is numpy arrays passed to `session.run`. The results are the same bits.
    """

    def __init__(self, codec: MimiCodec, n_codebooks: int | None = None, io_binding: bool | None = None):
        self.codec = codec
        self.k = codec.default_codebooks(n_codebooks)
        self.step_frames = codec.graph("encoder_step" if "encoder_step" in codec.present
                                       else "decoder_step").int("frames")
        self.step_samples = self.step_frames * codec.frame_size
        self.io_binding = codec.io_binding if io_binding is None else io_binding
        self._runners = {side: StepRunner(codec.graph(f"{side}_step"), self.io_binding)
                         for side in ("encoder", "decoder") if f"{side}_step" in codec.present}
        self._clear_buffers()

    def reset(self) -> None:
        for runner in self._runners.values():
            runner.reset()
        self._clear_buffers()

    def _clear_buffers(self) -> None:
        self._pcm = np.zeros(0, np.float32)
        self._codes = np.zeros((self.k, 0), np.int64)

    def _step(self, side: str, x: np.ndarray) -> np.ndarray:
        runner = self._runners.get(side)
        if runner is None:
            raise ModelFileError(f"{self.codec.dir} has no {side}_step.onnx (or .ort); export with "
                                 "--streaming")
        return runner(x)

    def encode_step(self, pcm: np.ndarray) -> np.ndarray:
        """Codes `[K, t]` for every whole step now buffered; the rest waits for more samples."""
        pcm = np.asarray(pcm, np.float32).reshape(-1)
        if not np.isfinite(pcm).all():
            raise AudioError("audio contains NaN or infinite samples; fix the input before encoding")
        self._pcm = np.concatenate([self._pcm, pcm])
        n = len(self._pcm) // self.step_samples * self.step_samples
        out = [self.codec._to_codes(self._step("encoder", self._pcm[i:i + self.step_samples][None, None]), self.k)
               for i in range(0, n, self.step_samples)]
        self._pcm = self._pcm[n:]
        return np.concatenate(out, axis=1) if out else np.zeros((self.k, 0), np.int64)

    def flush_encoder(self) -> np.ndarray:
        """Codes of the buffered remainder, zero-padded to whole frames (moshi's padding)."""
        rem = len(self._pcm)
        if rem == 0:
            return np.zeros((self.k, 0), np.int64)
        codes = self.encode_step(np.zeros(self.step_samples - rem, np.float32))
        return codes[:, :math.ceil(rem / self.codec.frame_size)]

    def decode_step(self, codes: np.ndarray) -> np.ndarray:
        """Audio for every whole step of codes now buffered; the rest waits for more frames."""
        codes = self.codec.check_codes(codes)
        if codes.shape[0] != 1:
            raise CodesError(f"a stream decodes one channel; got codes for {codes.shape[0]} "
                             "(use one MimiStream per channel)")
        codes = codes[0]
        if self._codes.shape[1] == 0:
            self._codes = np.zeros((codes.shape[0], 0), np.int64)
        elif codes.shape[0] != self._codes.shape[0]:
            raise CodesError(f"this stream is decoding {self._codes.shape[0]} codebooks, got "
                             f"{codes.shape[0]}")
        self._codes = np.concatenate([self._codes, codes], axis=1)
        n = self._codes.shape[1] // self.step_frames * self.step_frames
        out = [self._step("decoder", self.codec._from_codes(self._codes[:, i:i + self.step_frames]))[0, 0]
               for i in range(0, n, self.step_frames)]
        self._codes = self._codes[:, n:]
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def flush_decoder(self) -> np.ndarray:
        """Audio of the buffered remainder (padded with code 0, then trimmed)."""
        rem = self._codes.shape[1]
        if rem == 0:
            return np.zeros(0, np.float32)
        pad = np.zeros((self._codes.shape[0], self.step_frames - rem), np.int64)
        return self.decode_step(pad)[:rem * self.codec.frame_size]


# ---- .npz codes: the codes plus what it takes to give the original audio back ------------
def save_codes(path: Path, codes: np.ndarray, length: int, sample_rate: int) -> None:
    """codes `[C, K, T]` with the original length and rate, written atomically."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, codes=codes.astype(np.int64), length=np.int64(length),
                 sample_rate=np.int64(sample_rate), codec=np.array("mimi"))


def load_codes(path: Path) -> tuple[np.ndarray, int, int]:
    """(codes, original length, original sample rate) from a file written by `save_codes`."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["codec"]) != "mimi":
                raise CodesError(f"{path}: holds {z['codec']} codes, not mimi")
            codes, length, sr = z["codes"], int(z["length"]), int(z["sample_rate"])
    # BadZipFile: a truncated .npz; TypeError: a plain .npy, or a non-scalar length/rate.
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as e:
        raise CodesError(f"{path}: not a codes file written by codec-run encode ({e})") from e
    if length < 1 or not 1_000 <= sr <= 1_000_000:
        raise CodesError(f"{path}: impossible original length {length} or sample rate {sr}; "
                         "re-encode the audio")
    return codes, length, sr
