"""Qwen3-TTS tokenizer on ONNX Runtime: Mimi's runtime (codecs/mimi/runtime.py) on a qwen3tts
export, 24 kHz, 16 codebooks of 2048 at 12.5 Hz, the quantizers in the graphs.

- encode: a clip up to the fixed encoder's length in one call, its `mask` marking the clip (the
  codes are the official `encode`'s, last frame included). The encoder's attention sees the whole
  clip, so there is no exact window past the graph: a longer clip is refused, and a longer
  `--len` export takes it.
- decode: the whole clip's audio (`model.decoder(codes)`), through the fixed decoder when the codes
  fit, else a step at a time through the step graph, exactly; or `mode="chunked"`, the official
  `decode`'s chunks (300 frames, 25 before each as context: not the whole clip's audio past 300
  frames), through a fixed decoder of 325 frames or more.
- stream: a decoder stream on the step graph (Mimi's); there is no encoder stream.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import ClassVar

import numpy as np

from ...errors import CodesError
from ...runtime.audio import Counted
from ...runtime.codes import Codes
from ...runtime.plan import WindowPlan
from ...runtime.stream import EncoderStream
from ..mimi.runtime import MimiCodec, MimiDecoderStream

CHUNK, CONTEXT = 300, 25  # the official `chunked_decode`'s frames a chunk, and of context before it


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

    @property
    def modes(self) -> tuple[str, ...]:
        return (*super().modes, *(("chunked",) if "decoder" in self.present else ()))

    # ---- encoding ------------------------------------------------------------------------
    def window_plan(self, source, n_codebooks, mode=None) -> WindowPlan:
        """One call per channel: the clip, zeros after it, and the mask of its samples."""
        if mode not in (None, "fixed"):
            raise CodesError(f"{self.label} encodes in the fixed mode only (its attention sees the whole clip)")
        k = self.codebooks(n_codebooks)
        head, n, fits, _, counter = self._head(source, "fixed")
        samples = self.graph("encoder").int("samples")
        if not fits:
            raise CodesError(f"the clip is longer than this export's encoder ({samples} samples, "
                             f"{samples / self.sample_rate:g} s): its attention sees the whole clip, so it "
                             "has no exact window; export with a longer --len")
        frames = math.ceil(n / self.frame_size)
        audio = np.pad(np.concatenate(head, axis=1), ((0, 0), (0, samples - n)))
        mask = (np.arange(samples) < n).astype(np.float32)[None, None]
        feeds = ({"audio": row[None, None].astype(np.float32), "mask": mask} for row in audio)
        return WindowPlan("encoder", feeds, k, lambda codes: self.codes(
            [np.stack([c[:, :frames] for c in codes])], source, counter.counted, mode="fixed"))

    def encode_source(self, source, n_codebooks, mode, progress) -> Codes:
        return self.run_plan(self.window_plan(source, n_codebooks, mode), progress)

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
