"""Qwen3-TTS tokenizer on ONNX Runtime: Mimi's runtime (codecs/mimi/runtime.py) on a qwen3tts
export, 24 kHz, 16 codebooks of 2048 at 12.5 Hz, the quantizers in the graphs.

- encode: a clip up to the fixed encoder's length in one call, its `mask` marking the clip (the
  codes are the official `encode`'s, last frame included). The encoder's attention sees the whole
  clip, so there is no exact window past the graph: a longer clip goes through overlapping
  windows (`windowed`, close to the official codes, not equal; said when it happens), and a
  longer `--len` export takes it exactly.
- decode: the whole clip's audio (`model.decoder(codes)`), through the fixed decoder when the codes
  fit, else a step at a time through the step graph, exactly; or `mode="chunked"`, the official
  `decode`'s chunks (300 frames, 25 before each as context: not the whole clip's audio past 300
  frames), through a fixed decoder of 325 frames or more.
- stream: a decoder stream on the step graph (Mimi's); there is no encoder stream.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from ...errors import CodesError
from ...runtime.codes import Codes
from ...runtime.plan import WindowPlan
from ...runtime.stream import EncoderStream
from ..mimi.runtime import MimiCodec, MimiDecoderStream

log = logging.getLogger(__name__)

CHUNK, CONTEXT = 300, 25  # the official `chunked_decode`'s frames a chunk, and of context before it


def windows(frames: int, width: int) -> tuple[list[int], list[tuple[int, int]]]:
    """(first frame of each window, the frames [a, b) it keeps) over `frames` frames with windows
    of `width`: the first keeps all of itself, each next one begins `width // 2` frames before the
    frames it keeps (its context) and keeps the rest."""
    context = width // 2
    starts, keeps, done = [0], [(0, min(width, frames))], min(width, frames)
    while done < frames:
        start = done - context
        end = min(start + width, frames)
        starts.append(start)
        keeps.append((done, end))
        done = end
    return starts, keeps


class Qwen3Codec(MimiCodec):
    """The graphs of one `codec-export qwen3tts` folder, opened lazily on one provider."""

    name, label = "qwen3tts", "Qwen3-TTS tokenizer"
    graphs: ClassVar = {"encoder": ("encoder", "fixed"), "decoder": ("decoder", "fixed"),
                        "decoder_step": ("decoder", "step"), "decoder_slots": ("decoder", "slots")}
    default_codebooks = None
    batchable = ()
    streams = ("decoder",)

    def missing(self, name: str) -> str:
        return "re-export it with codec-export qwen3tts"

    # ---- encoding ------------------------------------------------------------------------
    def window_plan(self, source, n_codebooks, mode=None) -> WindowPlan:
        """A clip the fixed encoder holds: one call per channel, zeros after it and the mask of its
        samples (the official codes). A longer one (`windowed`): windows of the encoder's length,
        each after the first starting half a window before the frames it keeps, so every frame
        is coded with at least half a window of the past before it; the official model attends
        to the whole clip, so past the first window the codes are close to, not equal to, its
        own (docs/qwen3tts.md measures how close)."""
        if mode not in (None, "fixed", "windowed"):
            raise CodesError(f"{self.label} encodes in the fixed or windowed mode (its attention sees "
                             "the whole clip)")
        k = self.codebooks(n_codebooks)
        head, n, fits, rest, counter = self._head(source, "fixed")
        g = self.graph("encoder")
        samples, width = g.int("samples"), g.int("frames")
        if not fits and mode == "fixed":
            raise CodesError(f"the clip is longer than this export's encoder ({samples} samples, "
                             f"{samples / self.sample_rate:g} s), whose attention sees the whole clip: "
                             "export with a longer --len, or use the windowed mode (close to, not equal "
                             "to, the official codes)")
        audio = np.concatenate([*head, *rest], axis=1)
        n = audio.shape[1]
        frames = math.ceil(n / self.frame_size)
        if fits:
            starts, keeps = [0], [(0, frames)]
        else:
            log.warning("%d samples are more than the %d the encoder holds: windowed, each window after "
                        "the first with %d frames of context (not the official codes exactly)", n, samples,
                        width // 2)
            starts, keeps = windows(frames, width)
        hop, x = self.frame_size, np.pad(audio, ((0, 0), (0, max(starts) * self.frame_size + samples - n)))
        mask = (np.arange(x.shape[1]) < n).astype(np.float32)

        def feeds():
            for row in x:
                for s in starts:
                    cut = slice(s * hop, s * hop + samples)
                    yield {"audio": row[None, None, cut].astype(np.float32), "mask": mask[None, None, cut]}

        def finish(codes):
            per = len(starts)
            return self.codes([np.stack([np.concatenate(codes[c * per:(c + 1) * per], axis=1)
                                         for c in range(len(x))])], source, counter.counted,
                              mode="fixed" if fits else "windowed")

        def keep(y, i):
            s, (a, b) = starts[i % len(starts)], keeps[i % len(starts)]
            return self.latent_codes(y, k)[:, a - s:b - s]

        return WindowPlan("encoder", feeds(), k, finish, codes=keep)

    def encode_source(self, source, n_codebooks, mode, progress) -> Codes:
        return self.run_plan(self.window_plan(source, n_codebooks, mode), progress)

    @property
    def modes(self) -> tuple[str, ...]:
        dec = ("chunked",) if "decoder" in self.present else ()
        return (*super().modes, *(("windowed",) if "encoder" in self.present else ()), *dec)

    def expected_frames(self, n: int, mode: str | None) -> int:
        return math.ceil(n / self.frame_size)

    # ---- decoding ------------------------------------------------------------------------
    def raw_pieces(self, codes: Codes, mode: str | None, progress: bool) -> Iterator[np.ndarray]:
        """The whole clip's audio (Mimi's: fixed when it fits, else steps), or the official chunks."""
        if mode != "chunked":
            yield from super().raw_pieces(codes, mode, progress)
            return
        g = self.graph("decoder")
        width = g.int("frames")
        if width < CHUNK + CONTEXT:
            raise CodesError(f"the official chunks need a fixed decoder of {CHUNK + CONTEXT} frames or more; "
                             f"this one has {width}: export with --len {(CHUNK + CONTEXT) * self.frame_size}")
        data, frames = codes.data, codes.data.shape[2]
        for start in range(0, frames, CHUNK):
            ctx = min(CONTEXT, start)
            part = data[:, :, start - ctx:min(start + CHUNK, frames)]
            padded = np.pad(part, ((0, 0), (0, 0), (0, width - part.shape[2])))
            keep = slice(ctx * self.frame_size, part.shape[2] * self.frame_size)
            yield np.stack([g(self.decoder_input(c))[0, 0, keep] for c in padded])

    # ---- streaming -----------------------------------------------------------------------
    def encoder_stream(self, n_codebooks: int | None = None, io_binding: bool | None = None) -> EncoderStream:
        raise self.no_stream("encoder")

    def decoder_stream(self, io_binding: bool | None = None) -> Qwen3DecoderStream:
        return Qwen3DecoderStream(self, io_binding)


class Qwen3DecoderStream(MimiDecoderStream):
    """`push(codes)`: code frames `[16, t]` in, the audio of every whole step out, a frame's 1920
    samples as soon as its step has run (the decoder is causal: no latency but the step's own);
    `flush()`: the rest (a partial step padded with code 0, then trimmed). Pushed in any split,
    the pieces are the whole clip's audio."""
