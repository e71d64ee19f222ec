"""Mimi on ONNX Runtime: fixed-length and streaming step graphs plus the numpy split RVQ.

Mimi is causal end to end, so both ways through the graphs (`mode`) give moshi's codes exactly:
- fixed: audio up to the graph's length is zero-padded to it (moshi pads to whole frames the
  same way; later padding cannot change earlier frames) and the first frames are kept;
- step: anything longer goes through `encoder_step`/`decoder_step`, carrying the state between
  calls, which equals the whole-clip result with no seams (the step graphs are validated
  against the whole clip at export). The state stays on the provider's device between steps
  through IO binding (see `MimiStream`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
from tqdm import tqdm

from ..errors import AudioError, CodesError, ModelFileError
from ..registry import CodecSpec, Option, register
from .audio import Counted
from .batch import WindowPlan
from .codec import Codec
from .codes import Codes
from .graph import Graph, StepRunner
from .rvq import MimiRvq

MOSHI_CODEBOOKS = 8  # what Moshi uses; the default unless asked for more (up to all 32)


class MimiCodec(Codec):
    """The graphs of one `codec-export mimi` folder, opened lazily on one provider.

    `options={"io_binding": "0"}` (CLI: `--provider-option io_binding=0`) makes every stream
    carry its state as numpy arrays instead of through IO binding; see `MimiStream`.
    """

    name, label = "mimi", "Mimi"
    graphs: ClassVar = {"encoder": ("encoder", "fixed"), "decoder": ("decoder", "fixed"),
              "encoder_step": ("encoder", "step"), "decoder_step": ("decoder", "step")}
    default_codebooks = MOSHI_CODEBOOKS
    batchable = ("encoder",)

    def load_rvq(self) -> MimiRvq:
        return MimiRvq.load(self.dir / "rvq.npz", self.first)

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
        audio, codes = (g.batch, 1, samples), (g.batch, width, frames)
        ins, outs = g.shapes()
        got = (ins[:1], outs[:1])
        want = ([audio], [codes]) if role == "encoder" else ([codes], [audio])
        if got != want or (mode == "step" and (ins[1], outs[1]) != ((1,), (1,))):
            raise ModelFileError(f"{g.path}: its inputs/outputs are {g.shapes()}, its metadata says "
                                 f"{want}; the file is damaged, re-export the folder")
        if mode == "step":
            g.int("positions_per_step")

    def fits_fixed(self, n: int) -> bool:
        """Whether `n` samples at 24 kHz go through the fixed-length encoder in one call."""
        return "encoder" in self.present and n <= self.graph("encoder").int("samples")

    # ---- codes <-> what the graphs take --------------------------------------------------
    def _to_codes(self, y: np.ndarray, k: int) -> np.ndarray:
        """Encoder output `[1, C|K, T]` -> codes `[k, T]`."""
        return self.latent_codes(y[0], k)

    def _from_codes(self, codes: np.ndarray) -> np.ndarray:
        """Codes `[K, T]` -> decoder input `[1, C|K, T]`."""
        if self.rvq is None:
            if codes.shape[0] != self.n_codebooks:
                raise CodesError(f"this decoder has the quantizer inside and takes exactly "
                                 f"{self.n_codebooks} codebooks, got {codes.shape[0]}")
            return codes[None].astype(np.int64)
        return self.rvq.decode(codes)[None]

    def _need_steps(self, side: str) -> None:
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
        self._need_steps("encoder")
        streams = [MimiStream(self, k) for _ in range(source.channels)]
        out: list[list[np.ndarray]] = [[] for _ in streams]
        bar = tqdm(total=source.frames, desc="encode", unit="sample", unit_scale=True,
                   disable=None if progress else True)
        with bar:
            for block in itertools.chain(head, blocks):
                for s, row, o in zip(streams, block, out):
                    o.append(s.encode_step(row))
                bar.update(block.shape[1] * source.sample_rate / self.sample_rate)
        codes = np.stack([np.concatenate([*o, s.flush_encoder()], axis=1) for s, o in zip(streams, out)])
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
            yield np.stack([g(self._from_codes(c))[0, 0, :frames * self.frame_size] for c in padded])
            return
        if mode == "fixed":
            raise CodesError(f"{frames} frames are more than the fixed decoder's "
                             f"{self.graph('decoder').int('frames')}; use the step mode")
        self._need_steps("decoder")
        streams = [MimiStream(self) for _ in data]
        n = streams[0].step_frames
        for i in tqdm(range(0, frames, n), desc="decode", unit="step", disable=None if progress else True):
            yield np.stack([s.decode_step(c[:, i:i + n]) for s, c in zip(streams, data)])
        yield np.stack([s.flush_decoder() for s in streams])

    def stream(self, n_codebooks: int | None = None, io_binding: bool | None = None) -> MimiStream:
        """A live stream through the step graphs (see `MimiStream`)."""
        return MimiStream(self, n_codebooks, io_binding)


class MimiStream:
    """Streaming encode and decode through the step graphs, carrying their state between steps.

    `encode_step(pcm)` takes any number of 24 kHz samples and returns the codes `[K, t]` of every
    step completed so far (t may be 0); `decode_step(codes)` takes any number of code frames and
    returns the audio of every completed step. Partial steps wait in a buffer until the next call,
    or until `flush_encoder()`/`flush_decoder()` pads them with zeros and returns the rest.
    `reset()` starts a new stream. Codes have `n_codebooks` levels (default Moshi's 8).
    `latency_frames` is how many code frames a step holds back: `step_frames - 1` at most.

    `io_binding` (default: the codec's `io_binding` option, on unless `options` say
    `io_binding=0`) keeps the state as OrtValues on the provider's device through IO binding:
    on CUDA it never leaves GPU memory, only the step's audio or codes cross to the host.
    Without it the state is numpy arrays passed to `session.run`. The results are the same bits.
    """

    def __init__(self, codec: MimiCodec, n_codebooks: int | None = None, io_binding: bool | None = None):
        self.codec = codec
        self.k = codec.codebooks(n_codebooks)
        sides = [s for s in ("encoder", "decoder") if f"{s}_step" in codec.present]
        if not sides:
            codec._need_steps("encoder")
        self.step_frames = codec.graph(f"{sides[0]}_step").int("frames")
        self.step_samples = self.step_frames * codec.frame_size
        self.io_binding = codec.io_binding if io_binding is None else io_binding
        self._runners = {side: StepRunner(codec.graph(f"{side}_step"), self.io_binding) for side in sides}
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
            self.codec._need_steps(side)
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
        """Audio for every whole step of codes `[K, t]` now buffered; the rest waits for more frames."""
        codes = np.asarray(codes)
        if codes.ndim == 3 and codes.shape[0] == 1:  # [1, K, t]: one channel's
            codes = codes[0]
        if codes.ndim != 2:
            raise CodesError(f"codes must be [codebooks, frames] of one channel, got shape "
                             f"{list(codes.shape)}; use one stream per channel")
        codes = self.codec.check_codes(codes).data[0]
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

    @property
    def latency_frames(self) -> int:
        return self.step_frames - 1


register(CodecSpec(
    runtime=MimiCodec,
    default_variant="mimi",
    web=True,
    export_options=(
        Option("--frames", int, 1, "Code frames per streaming step (80 ms each for the released "
                                   "Mimi).", minimum=1),
        Option("--window", ("whole-clip", "moshi-stream", "rustymimi"), "whole-clip",
               "Attention past 250 frames (10 s): equal to the whole clip (moshi's encode), moshi's "
               "streaming mode (step graphs), whose ring cache drops a step's oldest keys, or "
               "Kyutai's Rust Mimi (fixed and step graphs), which sees one key more."),
    ),
    # 0.1 s: the tiny preset's attention masks are constants of frames squared, so a short fixed
    # pair keeps the folder small (1.7 MiB at 0.2 s); the step graphs take any length.
    smoke=("--variant", "tiny", "--len", "2400"),
))
