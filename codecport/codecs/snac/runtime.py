"""SNAC on ONNX Runtime: window graphs plus the numpy multi-scale RVQ, any length, the official
whole-clip codes and audio.

SNAC is not causal: cutting a clip into windows that do not overlap changes the codes near the
cuts. Here a clip goes through the fixed window graph in windows that overlap by the receptive
field (`margin` frames, in the metadata, computed from the config): each window keeps only the
frames whose every input lies inside it, and the graph's `mask` input makes the clip's own edges
behave as in one call on the whole clip. The codes then equal the official `SNAC.encode` of the
whole clip, and the audio its `decode` (fed the same noise), with memory bounded by the window.

Codes are multi-scale: level `l` is `[channels, 1, frames_l]`, coarse first, as the official
`encode` returns them (one codebook per level). The decoder's noise is an input: drawn per
position from a seed (`noise=SEED`), random (`None`, as the official decode), zero (`"zero"`), or
given (one array per decoder block over the whole clip).

The decoder streams (`decoder_stream`): codes a coarse frame at a time, as a language model
emits them, through `decoder_step.onnx`, a step with explicit state that computes each position
once (`SnacStepStream`; codecs/snac/export.py). Folders of codecport 0.3 and older hold a window graph
there instead (`decoder_stream.onnx` in 0.2), which `SnacWindowStream` re-runs a window a push.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
from tqdm import tqdm

from ...errors import AudioError, CodesError, ModelFileError
from ...runtime.audio import Counted
from ...runtime.codec import Codec
from ...runtime.codes import Codes
from ...runtime.graph import Graph
from ...runtime.plan import WindowPlan, overlap_windows
from .noise import Noise
from .rvq import SnacRvq
from .stream import SnacStepStream, SnacWindowStream

log = logging.getLogger(__name__)


class SnacCodec(Codec):
    """The graphs of one `codec-export snac` folder, opened lazily on one provider."""

    name, label = "snac", "SNAC"
    graphs: ClassVar = {"encoder": ("encoder", "whole"), "decoder": ("decoder", "whole"),
                        "decoder_step": ("decoder", "step"), "decoder_slots": ("decoder", "slots")}
    old_names: ClassVar = {"decoder_step": "decoder_stream"}
    shared = (*Codec.shared, "vq_strides", "unit_frames", "decoder_rates", "noise", "latent_dim")
    in_graph_quantizer = False
    streams = ("decoder",)
    batchable = ("encoder",)  # `--batch`: for tokenizing corpora (window_plan)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        g = self.first
        self.strides, self.rates = tuple(g.ints("vq_strides")), g.ints("decoder_rates")
        self.unit = g.int("unit_frames")
        self.group_frames = max(1, self.unit // g.ints("vq_strides")[0])
        self.levels = len(self.strides)
        self.draws_noise = g.choice("noise", ("0", "1")) == "1"
        if len(self.strides) != self.n_codebooks or math.prod(self.rates) != self.frame_size or \
                any(self.unit % s for s in self.strides):
            raise ModelFileError(f"{g.path}: its strides, rates and frame size disagree; the file is "
                                 "damaged, re-export the folder")

    def load_rvq(self) -> SnacRvq:
        return SnacRvq.load(self.dir / "rvq.npz", self.first)

    def check_graph(self, name: str, g: Graph) -> None:
        if "states" in g.meta:
            return self._check_step_graph(g)
        frames, latent, hop = g.int("frames"), g.int("latent_dim"), g.int("frame_size")
        unit, margin = g.int("unit_frames"), g.int("margin")
        if frames % unit or margin % unit or frames <= 2 * margin or g.int("samples") != frames * hop:
            raise ModelFileError(f"{g.path}: its frames, margin and samples do not make windows; the "
                                 "file is damaged, re-export the folder")
        b = g.batch
        mask = (b, 1, frames)
        if name.startswith("encoder"):
            want = ([(b, 1, frames * hop), mask], [(b, latent, frames)])
        else:
            noise = [(1, 1, frames * int(u)) for u in np.cumprod(g.ints("decoder_rates"))] \
                if g.meta.get("noise") == "1" else []
            want = ([(1, latent, frames), mask, *noise], [(1, 1, frames * hop)])
        if g.shapes() != want:
            raise ModelFileError(f"{g.path}: its inputs/outputs are {g.shapes()}, its metadata says "
                                 f"{want}; the file is damaged, re-export the folder")

    def _check_step_graph(self, g: Graph) -> None:
        n, b, unit = g.int("step_frames"), g.int("slots"), g.int("unit_frames")
        g.int("delay")
        ins, outs = g.shapes()
        noise = len(g.ints("noise_delays")) if g.meta.get("noise") == "1" else 0
        if n % unit or ins[:3] != [(b, g.int("latent_dim"), n), (b,), (b,)] or \
                outs[:2] != [(b, 1, n * g.int("frame_size")), (b,)] or \
                noise != (len(self.rates) if noise else 0):
            raise ModelFileError(f"{g.path}: its inputs/outputs {g.shapes()} are not a step of its "
                                 "metadata's geometry; the file is damaged, re-export the folder")

    @property
    def stateful_steps(self) -> bool:
        """Whether the step decoder carries state (codecport 0.4 on), rather than re-running windows."""
        return "states" in self.graph("decoder_step").meta

    # ---- encoding ----------------------------------------------------------------------
    def codebooks(self, n_codebooks: int | None) -> int:
        if n_codebooks not in (None, self.n_codebooks):
            raise CodesError(f"{self.label} codes have one codebook per time scale and its decoder "
                             f"needs all {self.n_codebooks}; pass no codebook count (--codebooks)")
        return self.n_codebooks

    def padded_frames(self, n: int) -> int:
        """Latent frames of `n` samples at the model rate, padded as the official `preprocess`."""
        return self.unit * max(1, -(-n // (self.frame_size * self.unit)))

    def expected_frames(self, n: int, mode: str | None) -> int:
        return self.padded_frames(n) // self.strides[0]

    def encode_source(self, source, n_codebooks, mode, progress) -> Codes:
        self.codebooks(n_codebooks)
        if mode not in (None, "whole"):
            raise CodesError(f"{self.label} encodes in the whole mode only (overlapping windows)")
        g = self.graph("encoder")
        counted = Counted(source)
        channels = source.channels
        items = self._encoder_windows(self.model_rate(counted), channels, g.int("frames"), g.int("margin"))
        first = next(items)
        if first[-1]:  # one window: every core on it
            results = [self._encode_window(g, first)]
        else:  # windows side by side, each on its share of the cores
            wg = self.window_graph("encoder")
            results = self.map_windows(lambda item: self._encode_window(wg, item),
                                       itertools.chain([first], items))
        levels: list[list[list[np.ndarray]]] = [[[] for _ in self.strides] for _ in range(channels)]
        for per_channel in tqdm(results, desc="encode", unit="window", disable=None if progress else True):
            for c, codes in enumerate(per_channel):
                for lv, a in enumerate(codes):
                    levels[c][lv].append(a)
        arrays = [np.stack([np.concatenate(levels[c][lv]) for c in range(channels)])[:, None]
                  for lv in range(self.levels)]
        return self.codes(arrays, source, counted.counted, mode="whole")

    def window_plan(self, source, n_codebooks, mode=None) -> WindowPlan | None:
        """`encode_source`'s windows as a plan for batched graphs (`codec-export --batch`): each
        channel of each window one row (its audio and mask), the codes of the frames it keeps
        computed as `encode_source` computes them. Without batched graphs, None: a clip then runs
        through `encode_source` (its windows side by side on the CPU's cores)."""
        if not self.batches.get("encoder"):
            return None
        k = self.codebooks(n_codebooks)
        if mode not in (None, "whole"):
            raise CodesError(f"{self.label} encodes in the whole mode only (overlapping windows)")
        g, counted, spans = self.graph("encoder"), Counted(source), []

        def windows():
            for x, mask, lo, hi, _ in self._encoder_windows(self.model_rate(counted), source.channels,
                                                             g.int("frames"), g.int("margin")):
                for row in x:
                    spans.append((lo, hi))
                    yield {"audio": row[None, None], "mask": mask}

        def finish(codes: list[list[np.ndarray]]) -> Codes:
            n = source.channels
            arrays = [np.stack([np.concatenate([w[lv] for w in codes[c::n]]) for c in range(n)])[:, None]
                      for lv in range(self.levels)]
            return self.codes(arrays, source, counted.counted, mode="whole")

        return WindowPlan("encoder", windows(), k, finish,
                          codes=lambda y, i: self.rvq.encode_levels(y[:, spans[i][0]:spans[i][1]]))

    def _encoder_windows(self, blocks, channels: int, window: int, margin: int):
        """(audio `[C, window * hop]`, mask, keep_from - start, keep_to - start, last) of each
        window over the blocks, read as they are needed: no more than a window and a block held."""
        hop = self.frame_size
        buf, at, total = np.zeros((channels, 0), np.float32), 0, None  # buf holds samples from `at`
        pos = 0
        while total is None or pos < self.padded_frames(total):
            start = 0 if pos == 0 else pos - margin
            end = start + window
            # Past the window's end, or to the end of the audio: whether this window is the last
            # must be known (a clip of exactly one window is one call, not two).
            while total is None and at + buf.shape[1] <= end * hop:
                block = next(blocks, None)
                if block is None:
                    total = at + buf.shape[1]
                    if total == 0:
                        raise AudioError("the audio holds no samples; pass a non-empty recording")
                else:
                    buf = np.concatenate([buf, block], axis=1)
            n = None if total is None else self.padded_frames(total)
            keep = n if n is not None and end >= n else end - margin
            x = np.zeros((channels, window * hop), np.float32)
            piece = buf[:, start * hop - at:end * hop - at]
            x[:, :piece.shape[1]] = piece
            mask = np.zeros((1, 1, window), np.float32)
            mask[..., :(window if n is None else min(window, n - start))] = 1.0
            yield x, mask, pos - start, keep - start, keep == n
            pos = keep
            drop = max(0, (pos - margin) * hop - at)
            buf, at = buf[:, drop:], at + drop

    def _encode_window(self, g: Graph, item) -> list[list[np.ndarray]]:
        """Every channel's codes (one array per time scale) of the frames a window keeps."""
        x, mask, lo, hi, _ = item
        return [self.rvq.encode_levels(g.run({"audio": row[None, None], "mask": mask})[0][0][:, lo:hi])
                for row in x]

    # ---- decoding ----------------------------------------------------------------------
    def check_codes(self, codes) -> Codes:
        codes = super().check_codes(codes)
        if len(codes.arrays) != self.levels or any(a.shape[1] != 1 for a in codes.arrays):
            raise CodesError(f"{self.label} codes are {self.levels} time scales of [channels, 1, frames] "
                             f"(coarse first), got {[list(a.shape) for a in codes.arrays]}")
        n = codes.arrays[0].shape[2] * self.strides[0]
        if [a.shape[2] * s for a, s in zip(codes.arrays, self.strides)] != [n] * self.levels:
            raise CodesError(f"the time scales' frames {list(codes.n_frames)} do not nest as strides "
                             f"{self.strides} need; the codes are damaged or of another model")
        if n % self.unit:
            raise CodesError(f"{codes.n_frames[0]} coarse frames cannot be decoded: {self.label} "
                             f"decodes whole groups of {self.unit // self.strides[0]}")
        return codes

    def noise_of(self, noise, channels: int) -> Noise:
        return Noise(noise, self.rates if self.draws_noise else [], self.unit, channels)

    def raw_pieces(self, codes: Codes, mode: str | None, progress: bool, noise=None) -> Iterator[np.ndarray]:
        name = "decoder_step" if mode == "step" else "decoder"
        if mode not in (None, "whole", "step"):
            raise CodesError(f"{self.label} decodes in the whole or step mode, not {mode}")
        if mode == "step" and self.stateful_steps:
            yield from self._step_pieces(codes, progress, noise)
            return
        g = self.graph(name)
        window, margin = g.int("frames"), g.int("margin")
        n = codes.arrays[0].shape[2] * self.strides[0]
        source = self.noise_of(noise, codes.channels)
        plan = list(overlap_windows(n, window, margin))
        hop = self.frame_size

        def run(graph, w):
            start, lo, hi = w
            return np.stack([self.decode_window(graph, [a[c, 0] for a in codes.arrays], 0, n, start,
                                                source, c)
                             [(lo - start) * hop:(hi - start) * hop] for c in range(codes.channels)])

        if len(plan) == 1:  # one window: every core on it
            pieces = (run(g, w) for w in plan)
        else:  # windows side by side, each on its share of the cores
            wg = self.window_graph(name)
            pieces = self.map_windows(lambda w: run(wg, w), plan)
        yield from tqdm(pieces, total=len(plan), desc="decode", unit="window",
                        disable=None if progress else True)

    def _step_pieces(self, codes: Codes, progress: bool, noise) -> Iterator[np.ndarray]:
        """Every channel through its own step stream, a step's coarse frames a push."""
        source = self.noise_of(noise, codes.channels)
        streams = [SnacStepStream(self, source, channel=c) for c in range(codes.channels)]
        per, frames = streams[0].step_frames, codes.arrays[0].shape[2]
        for i in tqdm(range(0, frames, per), desc="decode", unit="step", disable=None if progress else True):
            yield np.stack([s.push([a[c, 0, i * self.strides[0] // st:(i + per) * self.strides[0] // st]
                                    for a, st in zip(codes.arrays, self.strides)])
                            for c, s in enumerate(streams)])
        yield np.stack([s.flush() for s in streams])

    def decode_window(self, g: Graph, levels: list[np.ndarray], offset: int, n: int, start: int,
                      noise: Noise, channel: int) -> np.ndarray:
        """Audio `[window * hop]` of the window at latent frame `start` of a clip of `n` frames;
        `levels` hold its codes from latent frame `offset` on."""
        window = g.int("frames")
        lo, hi = max(start, 0), min(start + window, n)
        latent = np.zeros((self.rvq.latent_dim, window), np.float32)
        latent[:, lo - start:hi - start] = self.rvq.decode_levels(
            [lv[(lo - offset) // s:(hi - offset) // s] for lv, s in zip(levels, self.strides)])
        mask = np.zeros((1, 1, window), np.float32)
        mask[..., lo - start:hi - start] = 1.0
        feeds = {"latent": latent[None], "mask": mask}
        for b in range(len(self.rates) if self.draws_noise else 0):
            feeds[f"noise_{b}"] = noise.window(channel, b, start, window, n)
        return g.run(feeds)[0][0, 0]

    def decoder_stream(self, noise=None, io_binding: bool | None = None) -> SnacStepStream | SnacWindowStream:
        """Codes that arrive a coarse frame at a time (mono), e.g. from a TTS model: see
        `SnacStepStream` (`SnacWindowStream` for folders of codecport 0.3 and older)."""
        self.check_noise(noise)
        if self.stateful_steps:
            return SnacStepStream(self, self.noise_of(noise, 1), io_binding=io_binding)
        return SnacWindowStream(self, noise)

    def decode_stream(self, noise=None):
        """`decoder_stream`, by the name codecport 0.2 gave it."""
        return self.decoder_stream(noise)
