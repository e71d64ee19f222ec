"""The toy codec on ONNX Runtime (no torch): clips through the fixed graphs (its frames are coded
apart, so a longer clip is several calls, exactly), and a decoder stream on the step graph."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np

from codecport.errors import CodesError, ModelFileError
from codecport.runtime.audio import Counted
from codecport.runtime.codec import Codec
from codecport.runtime.codes import Codes
from codecport.runtime.plan import WindowPlan
from codecport.runtime.step import StepRunner
from codecport.runtime.stream import DecoderStream, Latency, Stepped, as_levels


class ToyCodec(Codec):
    name, label = "toy", "Toy"
    graphs: ClassVar = {"encoder": ("encoder", "fixed"), "decoder": ("decoder", "fixed"),
                        "decoder_step": ("decoder", "step")}
    streams = ("decoder",)
    causal = True

    def check_graph(self, name: str, g) -> None:
        role, mode = self.graphs[name]
        frames, samples, k = g.int("frames"), g.int("samples"), g.int("n_codebooks")
        if samples != frames * g.int("frame_size"):
            raise ModelFileError(f"{g.path}: {samples} samples are not {frames} frames; re-export it")
        audio, codes = (1, 1, samples), (1, k, frames)
        want = [audio] if role == "encoder" else [codes]
        if g.shapes()[0][:1] != want:
            raise ModelFileError(f"{g.path}: its inputs are {g.shapes()[0]}, its metadata says {want}; "
                                 "re-export it")

    def expected_frames(self, n: int, mode: str | None) -> int:
        return math.ceil(n / self.frame_size)

    def window_plan(self, source, n_codebooks, mode=None) -> WindowPlan:
        """Windows of the fixed encoder's length, the last zero-padded: each frame is coded alone."""
        k = self.codebooks(n_codebooks)
        samples = self.graph("encoder").int("samples")
        counted = Counted(source)
        audio = np.concatenate(list(self.model_rate(counted)), axis=1)
        n, channels = audio.shape[1], audio.shape[0]
        calls = max(1, math.ceil(n / samples))
        padded = np.pad(audio, ((0, 0), (0, calls * samples - n)))
        windows = (padded[c, i * samples:(i + 1) * samples] for c in range(channels) for i in range(calls))

        def finish(codes: list[np.ndarray]) -> Codes:
            keep = self.expected_frames(n, None)
            rows = [np.concatenate(codes[c * calls:(c + 1) * calls], axis=1)[:, :keep]
                    for c in range(channels)]
            return self.codes([np.stack(rows)], source, counted.counted, mode="fixed")

        return WindowPlan("encoder", windows, k, finish)

    def raw_pieces(self, codes: Codes, mode: str | None, progress: bool) -> Iterator[np.ndarray]:
        data = codes.data
        frames = data.shape[2]
        if data.shape[1] != self.n_codebooks:
            raise CodesError(f"the toy decoder takes all {self.n_codebooks} codebooks, got {data.shape[1]}")
        fixed = self.graph("decoder").int("frames") if "decoder" in self.present else 0
        if mode != "step" and frames <= fixed:
            padded = np.pad(data, ((0, 0), (0, 0), (0, fixed - frames)))  # causal: the tail changes nothing
            yield np.stack([self.graph("decoder")(c[None])[0, 0, :frames * self.frame_size] for c in padded])
            return
        if mode == "fixed":
            raise CodesError(f"{frames} frames are more than the fixed decoder's {fixed}; use the step mode")
        streams = [self.decoder_stream() for _ in data]
        yield np.stack([s.push(c) for s, c in zip(streams, data)])

    def decoder_stream(self, io_binding: bool | None = None) -> ToyDecoderStream:
        return ToyDecoderStream(self, io_binding)


def _wait_while_wedged() -> None:
    """A step that does not return while the file TOYCODEC_WEDGE names exists: what a hung ONNX
    Runtime call looks like to a server (tests/test_ray.py wedges a replica with it)."""
    flag = os.environ.get("TOYCODEC_WEDGE")
    while flag and Path(flag).exists():
        time.sleep(0.05)


class ToyDecoderStream(Stepped, DecoderStream):
    """Code frames in, their audio out at once: a frame's audio needs nothing after it."""

    def __init__(self, codec: ToyCodec, io_binding: bool | None = None):
        super().__init__(codec)
        binding = codec.io_binding if io_binding is None else io_binding
        self.runner = StepRunner(codec.graph("decoder_step"), binding)
        self.reset()

    @property
    def latency(self) -> Latency:
        return Latency(0.0, 0)

    def reset(self) -> None:
        self.runner.reset()
        self._codes = np.zeros((self.codec.n_codebooks, 0), np.int64)

    def feed(self, codes) -> None:
        codes = as_levels(codes, 1)[0]
        if codes.shape[1]:
            codes = self.codec.check_codes(codes).data[0]
            if codes.shape[0] != self.codec.n_codebooks:
                raise CodesError(f"the toy decoder takes all {self.codec.n_codebooks} codebooks, got "
                                 f"{codes.shape[0]}")
            self._codes = np.concatenate([self._codes, codes], axis=1)

    def end(self) -> None:
        pass

    def ready(self) -> bool:
        return self._codes.shape[1] > 0

    def next_step(self):
        _wait_while_wedged()
        x, self._codes = self._codes[:, :1], self._codes[:, 1:]
        return x[None], {}

    def take(self, y: np.ndarray) -> np.ndarray:
        return y[0, 0]

    def join(self, pieces: list) -> np.ndarray:
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def _get_state(self):
        return {**self.runner.state, "codes": self._codes}, {}

    def _set_state(self, arrays, values) -> None:
        arrays = dict(arrays)
        codes = arrays.pop("codes", None)
        if codes is None or codes.ndim != 2:
            raise CodesError("this state holds no [codebooks, frames] codes: it is not a toy decoder "
                             "stream's")
        self.runner.state = arrays
        self._codes = np.array(codes, np.int64)
