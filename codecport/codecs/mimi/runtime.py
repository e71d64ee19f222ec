"""Mimi on ONNX Runtime: fixed-length and streaming step graphs plus the numpy split RVQ.

Mimi is causal end to end, so both ways through the graphs (`mode`) give moshi's codes exactly:
- fixed: audio up to the graph's length is zero-padded to it (moshi pads to whole frames the
  same way; later padding cannot change earlier frames) and the first frames are kept;
- step: anything longer goes through `encoder_step`/`decoder_step`, carrying the state between
  calls, which equals the whole-clip result with no seams (the step graphs are validated
  against the whole clip at export). The state stays on the provider's device between steps
  through IO binding (see `StepRunner`).

Both sides stream (`encoder_stream`, `decoder_stream`): one step graph call per `step_frames`
code frames, the state carried between calls.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
from tqdm import tqdm

from ...errors import CodesError, ModelFileError
from ...runtime.audio import Counted
from ...runtime.codec import Codec
from ...runtime.codes import Codes
from ...runtime.graph import Graph
from ...runtime.plan import WindowPlan
from ...runtime.rvq import SplitRvq, check_code_values
from ...runtime.step import StepRunner
from ...runtime.stream import DecoderStream, Duplex, EncoderStream, Latency, Stepped, as_levels, as_pcm

MOSHI_CODEBOOKS = 8  # what Moshi uses; the default unless asked for more (up to all 32)


class MimiCodec(Codec):
    """The graphs of one `codec-export mimi` folder, opened lazily on one provider.

    `options={"io_binding": "0"}` (CLI: `--provider-option io_binding=0`) makes every stream
    carry its state as numpy arrays instead of through IO binding; see `StepRunner`.
    """

    name, label = "mimi", "Mimi"
    graphs: ClassVar = {"encoder": ("encoder", "fixed"), "decoder": ("decoder", "fixed"),
              "encoder_step": ("encoder", "step"), "decoder_step": ("decoder", "step"),
              "encoder_slots": ("encoder", "slots"), "decoder_slots": ("decoder", "slots")}
    default_codebooks = MOSHI_CODEBOOKS
    batchable = ("encoder",)
    streams = ("encoder", "decoder")
    causal = True

    def load_rvq(self) -> SplitRvq:
        return SplitRvq.load(self.dir / "rvq.npz", self.first)

    def missing(self, name: str) -> str:
        return "re-export with codec-export mimi (it writes the step graphs for any length)" \
            if "step" in name else "export with --len for the fixed graphs"

    def check_graph(self, name: str, g: Graph) -> None:
        role, mode = self.graphs[name]
        width = g.int("latent_dim") if g.meta.get("quantizer") == "numpy" else g.int("n_codebooks")
        frames, samples = g.int("frames"), g.int("samples")
        if role == "encoder" and math.ceil(samples / g.int("frame_size")) != frames:
            raise ModelFileError(f"{g.path}: {samples} samples cannot give {frames} frames; the "
                                 "file is damaged, re-export the folder")
        b = g.int("slots") if mode == "slots" else g.batch
        audio, codes = (b, 1, samples), (b, width, frames)
        ins, outs = g.shapes()
        got = (ins[:1], outs[:1])
        want = ([audio], [codes]) if role == "encoder" else ([codes], [audio])
        if got != want or (mode != "fixed" and (ins[1], outs[1]) != ((b,), (b,))):
            raise ModelFileError(f"{g.path}: its inputs/outputs are {g.shapes()}, its metadata says "
                                 f"{want}; the file is damaged, re-export the folder")
        if mode != "fixed":
            g.int("positions_per_step")

    # ---- codes <-> what the graphs take --------------------------------------------------
    def decoder_input(self, codes: np.ndarray) -> np.ndarray:
        """Codes `[K, T]` -> decoder input `[1, C|K, T]`."""
        if self.rvq is None:
            if codes.shape[0] != self.n_codebooks:
                raise CodesError(f"this decoder has the quantizer inside and takes exactly "
                                 f"{self.n_codebooks} codebooks, got {codes.shape[0]}")
            return codes[None].astype(np.int64)
        return self.rvq.decode(codes)[None]

    def need_steps(self, side: str) -> None:
        if f"{side}_step" not in self.present:
            raise ModelFileError(f"{self.dir} has no {side}_step.onnx (or .ort) to stream through "
                                 "(an export older than codecport 0.2?); re-export it with "
                                 "codec-export mimi, which writes the step graphs for any length")

    # ---- encoding ------------------------------------------------------------------------
    def _head(self, source, mode: str | None):
        """(blocks read, samples in them, whether the clip fits the fixed graph, the rest of the
        blocks, the counter): up to one sample past the fixed graph is read."""
        if mode == "fixed":
            self.graph("encoder")  # refuses, saying what to do, when there is none
        limit = self.graph("encoder").int("samples") if "encoder" in self.present and mode != "step" else 0
        counter = Counted(source)
        blocks = self.model_rate(counter)
        head, n, fits = [], 0, True
        for block in blocks:
            head.append(block)
            n += block.shape[1]
            if n > limit:
                fits = False
                break
        return head, n, fits, blocks, counter

    def _fixed_plan(self, head, n: int, source, counter, k: int) -> WindowPlan:
        """One call per channel, zero-padded to the graph (Mimi is causal: the padding cannot
        change the frames before it), keeping the clip's frames."""
        limit, frames = self.graph("encoder").int("samples"), math.ceil(n / self.frame_size)
        x = np.pad(np.concatenate(head, axis=1), ((0, 0), (0, limit - n)))
        return WindowPlan("encoder", iter(x), k, lambda codes: self.codes(
            [np.stack([c[:, :frames] for c in codes])], source, counter.counted, mode="fixed"))

    def window_plan(self, source, n_codebooks, mode=None) -> WindowPlan | None:
        """Clips that fit the fixed graph; longer ones stream (None)."""
        k = self.codebooks(n_codebooks)
        head, n, fits, _, counter = self._head(source, mode)
        return self._fixed_plan(head, n, source, counter, k) if fits else None

    def encode_source(self, source, n_codebooks, mode, progress) -> Codes:
        """Codes `[C, K, ceil(N' / frame_size)]` (N' samples at 24 kHz); each channel is encoded
        on its own (Mimi is mono). Clips that fit the fixed graph take it unless `mode` is
        "step"; anything longer streams through the step graphs."""
        k = self.codebooks(n_codebooks)
        head, n, fits, blocks, counter = self._head(source, mode)
        if fits:
            return self.run_plan(self._fixed_plan(head, n, source, counter, k))
        if mode == "fixed":
            raise CodesError(f"the audio is longer than the fixed {self.graph('encoder').int('samples')}"
                             "-sample encoder; use the step mode (or leave the mode out)")
        streams = [self.encoder_stream(k) for _ in range(source.channels)]
        out: list[list[np.ndarray]] = [[] for _ in streams]
        bar = tqdm(total=source.frames, desc="encode", unit="sample", unit_scale=True,
                   disable=None if progress else True)
        with bar:
            for block in itertools.chain(head, blocks):
                for s, row, o in zip(streams, block, out):
                    o.append(s.push(row))
                bar.update(block.shape[1] * source.sample_rate / self.sample_rate)
        codes = np.stack([np.concatenate([*o, s.flush()], axis=1) for s, o in zip(streams, out)])
        return self.codes([codes], source, counter.counted, mode="step")

    # ---- decoding ------------------------------------------------------------------------
    def expected_frames(self, n: int, mode: str | None) -> int:
        return math.ceil(n / self.frame_size)

    def raw_pieces(self, codes: Codes, mode: str | None, progress: bool) -> Iterator[np.ndarray]:
        """Audio `[C, T * frame_size]` at 24 kHz: one fixed call when the codes fit the fixed
        decoder (unless `mode` is "step"), else one step at a time."""
        data = codes.data
        frames = data.shape[2]
        if mode != "step" and "decoder" in self.present and frames <= self.graph("decoder").int("frames"):
            g = self.graph("decoder")
            # Code 0 pads the tail; being causal, the decoder's first samples do not see it.
            padded = np.pad(data, ((0, 0), (0, 0), (0, g.int("frames") - frames)))
            yield np.stack([g(self.decoder_input(c))[0, 0, :frames * self.frame_size] for c in padded])
            return
        if mode == "fixed":
            raise CodesError(f"{frames} frames are more than the fixed decoder's "
                             f"{self.graph('decoder').int('frames')}; use the step mode")
        streams = [self.decoder_stream() for _ in data]
        n = streams[0].step_frames
        for i in tqdm(range(0, frames, n), desc="decode", unit="step", disable=None if progress else True):
            yield np.stack([s.push(c[:, i:i + n]) for s, c in zip(streams, data)])
        yield np.stack([s.flush() for s in streams])

    # ---- streaming -----------------------------------------------------------------------
    def encoder_stream(self, n_codebooks: int | None = None,
                       io_binding: bool | None = None) -> MimiEncoderStream:
        return MimiEncoderStream(self, n_codebooks, io_binding)

    def decoder_stream(self, io_binding: bool | None = None) -> MimiDecoderStream:
        return MimiDecoderStream(self, io_binding)

    def stream(self, n_codebooks: int | None = None, io_binding: bool | None = None) -> Duplex:
        return Duplex(self.encoder_stream(n_codebooks, io_binding), self.decoder_stream(io_binding))


class _Steps(Stepped):
    """What both of Mimi's streams share: one step graph, its state, and a buffer of the input
    of a step not yet whole. Partial steps wait in the buffer until the next push, or until
    `flush()` pads them (zeros, code 0, as moshi pads) and returns the rest, trimmed."""

    def _steps(self, codec: MimiCodec, side: str, io_binding: bool | None) -> None:
        codec.need_steps(side)
        g = codec.graph(f"{side}_step")
        self.step_frames = g.int("frames")
        self.step_samples = self.step_frames * codec.frame_size
        self.io_binding = codec.io_binding if io_binding is None else io_binding
        self.runner = StepRunner(g, self.io_binding)
        self._ending = False  # flush asked: the buffered rest makes one padded step
        self._keep: int | None = None  # frames of the padded step that are the input's

    @property
    def latency(self) -> Latency:
        """A frame's result waits for the rest of its step: `step_frames - 1` frames at most."""
        return Latency(self.step_frames - 1, (self.step_frames - 1) * self.codec.frame_size)

    def end(self) -> None:
        # Nothing buffered: nothing to pad, and the stream goes on as it was.
        self._ending = self._buffered() > 0

    def ready(self) -> bool:
        have = self._buffered()
        return have >= self._step_len() or (self._ending and have > 0)

    def _cut(self, buf: np.ndarray, pad) -> tuple[np.ndarray, np.ndarray]:
        """(the next step's input, the rest), padding the last one with `pad`."""
        n = self._step_len()
        if buf.shape[-1] >= n:
            return buf[..., :n], buf[..., n:]
        self._keep = math.ceil(buf.shape[-1] / self._frame_len())
        widths = [(0, 0)] * (buf.ndim - 1) + [(0, n - buf.shape[-1])]
        return np.pad(buf, widths, constant_values=pad), buf[..., :0]

    def _trimmed(self, out: np.ndarray, frame: int) -> np.ndarray:
        """The padded last step's output, cut to the frames that were input; the stream goes on
        after it as if nothing was padded (a new push starts a new step)."""
        if self._keep is None:
            return out
        out, self._keep = out[..., :self._keep * frame], None
        self._ending = False
        return out

    def reset(self) -> None:
        self.runner.reset()
        self._ending, self._keep = False, None
        self._clear()


class MimiEncoderStream(_Steps, EncoderStream):
    """`push(pcm)`: any number of 24 kHz samples in, the codes `[K, t]` of every whole step out
    (t may be 0); `flush()`: the codes of the rest, zero-padded to whole frames (moshi's padding).
    Codes have `n_codebooks` levels (default Moshi's 8)."""

    def __init__(self, codec: MimiCodec, n_codebooks: int | None = None, io_binding: bool | None = None):
        super().__init__(codec)
        self.k = codec.codebooks(n_codebooks)
        self._steps(codec, "encoder", io_binding)
        self._clear()

    def settings(self) -> str:
        return f"codebooks={self.k}"

    def _clear(self) -> None:
        self._pcm = np.zeros(0, np.float32)

    def _buffered(self) -> int:
        return len(self._pcm)

    def _step_len(self) -> int:
        return self.step_samples

    def _frame_len(self) -> int:
        return self.codec.frame_size

    def feed(self, pcm) -> None:
        self._pcm = np.concatenate([self._pcm, as_pcm(pcm)])

    def next_step(self):
        x, self._pcm = self._cut(self._pcm, 0.0)
        return x[None, None], {}

    def take(self, y: np.ndarray) -> np.ndarray:
        return self._trimmed(self.codec.latent_codes(y[0], self.k), 1)

    def join(self, pieces: list) -> np.ndarray:
        return np.concatenate(pieces, axis=1) if pieces else np.zeros((self.k, 0), np.int64)

    def _get_state(self):
        return {**self.runner.state, "pcm": self._pcm}, {}

    def _set_state(self, arrays, values) -> None:
        arrays = dict(arrays)
        pcm = arrays.pop("pcm", None)
        # A slot's state may hold steps its pool has not run yet (slots.py): any length.
        if pcm is None or pcm.ndim != 1:
            raise CodesError("this stream state has no buffered audio; it is not a Mimi encoder stream's")
        pcm = as_pcm(pcm)  # what push takes: floats, finite, audio
        self.runner.state = arrays
        self._pcm = np.array(pcm, np.float32)


class MimiDecoderStream(_Steps, DecoderStream):
    """`push(codes)`: any number of code frames `[K, t]` in, the audio of every whole step out;
    `flush()`: the audio of the rest (padded with code 0, then trimmed)."""

    def __init__(self, codec: MimiCodec, io_binding: bool | None = None):
        super().__init__(codec)
        self._steps(codec, "decoder", io_binding)
        self._clear()

    def _clear(self) -> None:
        self._codes: np.ndarray | None = None  # frames of a step not yet whole, [K, t]

    def _buffered(self) -> int:
        return 0 if self._codes is None else self._codes.shape[1]

    def _step_len(self) -> int:
        return self.step_frames

    def _frame_len(self) -> int:
        return 1

    def feed(self, codes) -> None:
        codes = as_levels(codes, 1)[0]
        if codes.shape[1] == 0:  # nothing new (an encoder stream's push may give no frames)
            return
        codes = self.codec.check_codes(codes).data[0]
        if self._codes is None:
            self._codes = np.zeros((codes.shape[0], 0), np.int64)
        elif codes.shape[0] != self._codes.shape[0]:
            raise CodesError(f"this stream is decoding {self._codes.shape[0]} codebooks, got "
                             f"{codes.shape[0]}")
        self._codes = np.concatenate([self._codes, codes], axis=1)

    def next_step(self):
        x, self._codes = self._cut(self._codes, 0)
        return self.codec.decoder_input(x), {}

    def take(self, y: np.ndarray) -> np.ndarray:
        return self._trimmed(y[0, 0], self.codec.frame_size)

    def join(self, pieces: list) -> np.ndarray:
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def _get_state(self):
        codes = {} if self._codes is None else {"codes": self._codes}
        return {**self.runner.state, **codes}, {}

    def _set_state(self, arrays, values) -> None:
        arrays = dict(arrays)
        codes = arrays.pop("codes", None)
        if codes is not None and codes.ndim != 2:
            raise CodesError("this stream state's codes are not [codebooks, frames]; it is not a Mimi "
                             "decoder stream's")
        if codes is not None:
            check_code_values(codes, self.codec.codebook_size)
        self.runner.state = arrays
        self._codes = None if codes is None else np.array(codes, np.int64)
