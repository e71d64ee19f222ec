"""DAC on ONNX Runtime: fixed-length graphs plus the numpy RVQ, for audio of any length.

Three ways through the graphs (`mode`), all from the official package:
- fixed: audio whose length rounds up to the fixed graph's frames goes through `encoder.onnx`
  in one call, giving the codes of the official `DAC.encode`;
- chunked: anything else follows the official `compress`: padding off, the signal zero-padded by
  `delay` on both sides, fixed windows stepping by the valid output (`chunk_step`). Codes equal
  `compress(win_duration=window/sample_rate, normalize_db=None)`, and `.dac` files hold them;
- whole (asked for by name): the fixed graphs in windows that overlap by their receptive field
  (plan.py), so that codes equal the official `DAC.encode` of the whole clip, and
  audio its `decode` of them, however long the clip (at least one fixed call long).

Like `compress`, encoding first measures the whole input (its loudness, stored with the codes,
and its peak, scaled down to 1 when above it), then encodes: a file is read twice, block by
block, never held whole.
"""

from __future__ import annotations

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
from ...runtime.loudness import LoudnessMeter
from ...runtime.plan import WindowPlan, overlap_windows
from ...runtime.rvq import FactorisedRvq


class DacCodec(Codec):
    """The graphs of one `codec-export dac` folder, opened lazily on one provider."""

    name, label = "dac", "DAC"
    graphs: ClassVar = {"encoder": ("encoder", "fixed"), "decoder": ("decoder", "fixed"),
              "encoder_chunked": ("encoder", "chunked"), "decoder_chunked": ("decoder", "chunked")}
    sliding = ("encoder_chunked", "decoder_chunked")
    batchable = ("encoder", "encoder_chunked")
    restores_loudness = True
    limits_peak = True

    def load_rvq(self) -> FactorisedRvq:
        return FactorisedRvq.load(self.dir / "rvq.npz", self.first)

    @property
    def channels_per_row(self) -> int:
        """1, or 2 for TSAC's stereo model, whose graphs code both channels in one row."""
        return _channels(self.first)

    def _rows(self, audio: np.ndarray) -> Iterator[np.ndarray]:
        """A window `[channels, n]` as the rows of one call each: a channel `[n]` each, or all
        channels `[channels, n]` at once for a model coding them together."""
        return iter(audio) if self.channels_per_row == 1 else iter(audio[None])

    def _check_channels(self, channels: int) -> None:
        if self.channels_per_row not in (1, channels):
            raise CodesError(f"this folder's model codes {self.channels_per_row} channels at once (TSAC's "
                             f"stereo DAC); the input has {channels}: give it "
                             f"{self.channels_per_row}-channel audio (e.g. ffmpeg -ac 2)")

    @property
    def modes(self) -> tuple[str, ...]:
        fixed = ("whole",) if {"encoder", "decoder"} & set(self.present) else ()
        return (*super().modes, *fixed)

    def whole_geometry(self, name: str) -> tuple[int, int]:
        """(frames, margin) of fixed graph `name` for the whole mode, or why it cannot serve it."""
        g = self.graph(name)
        frames = g.int("frames")
        if "margin" not in g.meta:
            raise ModelFileError(f"{g.path}: exported before the whole mode (no receptive field in its "
                                 "metadata); re-export it with this version of codec-export")
        margin = g.int("margin")
        if name == "encoder" and g.int("samples") != frames * self.frame_size:
            raise CodesError(f"the whole mode needs fixed graphs of whole frames; export with --len a "
                             f"multiple of {self.frame_size} (e.g. {frames * self.frame_size})")
        if frames <= 2 * margin:
            raise CodesError(f"the fixed graphs' {frames} frames are too short for windows that keep "
                             f"their receptive field ({margin} frames a side); export a longer --len")
        return frames, margin

    def check_graph(self, name: str, g: Graph) -> None:
        role, mode = self.graphs[name]
        width = g.int("latent_dim") if g.meta.get("quantizer") == "numpy" else g.int("n_codebooks")
        if mode == "fixed":
            samples, frames = g.int("samples"), g.int("frames")
            if role == "encoder" and math.ceil(samples / g.int("frame_size")) != frames:
                raise_shape(g, f"{samples} samples cannot give {frames} frames")
        else:
            samples = g.int("window") if role == "encoder" else g.int("chunk_step")
            frames = g.int("chunk_frames")
            g.int("delay")  # read when the long audio is padded: refused now if it is bad
        audio, codes = (g.batch, _channels(g), samples), (g.batch, width, frames)
        want = ([audio], [codes]) if role == "encoder" else ([codes], [audio])
        if g.shapes() != want:
            raise_shape(g, f"its inputs/outputs are {g.shapes()}, its metadata says {want}")

    # ---- encoding ----------------------------------------------------------------------
    def fixed_frames(self) -> int | None:
        """Frames of the fixed-length pair, from whichever of them the folder holds (an app may
        ship only the decoders); None with neither."""
        name = next((g for g in ("encoder", "decoder") if g in self.present), None)
        return None if name is None else self.graph(name).int("frames")

    def fits_fixed(self, n: int) -> bool:
        """Whether `n` samples go through the fixed-length encoder in one call: padded to whole
        frames (the official `preprocess`) they are its frames, and they are no more than its
        input (`--len`; one that is not a hop multiple holds fewer than its frames' samples)."""
        g = self.graph("encoder")
        return math.ceil(n / self.frame_size) == g.int("frames") and n <= g.int("samples")

    def window_plan(self, source, n_codebooks, mode=None) -> WindowPlan:
        """Measures the whole input (loudness and peak: the first pass over a file), then plans
        the second: one fixed call per channel, or the official chunked windows."""
        k = self.codebooks(n_codebooks)
        self._check_channels(source.channels)
        meter, peak, n = LoudnessMeter(self.sample_rate, source.channels), np.zeros(source.channels), 0
        counted = Counted(source)
        for block in self.model_rate(counted):
            meter.push(block)
            peak = np.maximum(peak, np.abs(block).max(axis=1))
            n += block.shape[1]
        # The official `ensure_max_of_audio`: a channel peaking above 1 is scaled down to 1.
        gain = (1.0 / np.maximum(peak, 1.0)).astype(np.float32)[:, None]
        blocks = (b * gain for b in self.model_rate(source))
        if mode == "whole":
            return self._whole_plan(source, blocks, n, k, counted, meter.result())
        fits = "encoder" in self.present and self.fits_fixed(n)
        if mode == "fixed" and not fits:
            raise CodesError(f"{n} samples do not fit the fixed graph of "
                             f"{self.graph('encoder').int('samples')} samples; use the chunked mode")
        loudness, rows_out = meter.result(), source.channels // self.channels_per_row
        if fits and mode != "chunked":
            samples = self.graph("encoder").int("samples")

            def rows():
                audio = np.concatenate(list(blocks), axis=1)
                yield from self._rows(np.pad(audio, ((0, 0), (0, samples - n))))

            return WindowPlan("encoder", rows(), k, lambda codes: self.codes(
                [np.stack(codes)], source, counted.counted, loudness_db=loudness, mode="fixed"))
        g = self.graph("encoder_chunked")
        window, step, delay, frames = (g.int("window"), g.int("chunk_step"), g.int("delay"),
                                       g.int("chunk_frames"))
        starts = range(0, n, step)
        windows = (row for w in _windows(blocks, starts, window, delay) for row in self._rows(w))

        def finish(codes: list[np.ndarray]) -> Codes:
            # Window-major, row-minor -> [rows, K, windows * chunk_frames]
            a = np.stack(codes).reshape(len(starts), rows_out, k, frames)
            return self.codes([a.transpose(1, 2, 0, 3).reshape(rows_out, k, -1)], source, counted.counted,
                              loudness_db=loudness, mode="chunked", chunk_frames=frames)

        return WindowPlan("encoder_chunked", windows, k, finish)

    def _whole_plan(self, source, blocks, n: int, k: int, counted, loudness: float) -> WindowPlan:
        """The fixed encoder in windows overlapping by its receptive field, the last one ending at
        the clip's end (a multiple of the frame, as the official `preprocess` pads it)."""
        frames, margin = self.whole_geometry("encoder")
        total = -(-n // self.frame_size)
        if total < frames:
            raise CodesError(f"{n} samples are shorter than the fixed graph ({frames * self.frame_size}): "
                             "the whole mode needs at least one fixed call; export a shorter --len, or "
                             "encode it in the fixed or chunked mode")
        plan = list(overlap_windows(total, frames, margin, end_aligned=True))
        hop, n_rows = self.frame_size, source.channels // self.channels_per_row
        rows = (row for w in _windows(blocks, [s * hop for s, _, _ in plan], frames * hop, 0)
                for row in self._rows(w))

        def finish(codes: list[np.ndarray]) -> Codes:
            parts = [[codes[i * n_rows + c][:, lo - s:hi - s] for i, (s, lo, hi) in enumerate(plan)]
                     for c in range(n_rows)]
            return self.codes([np.stack([np.concatenate(p, axis=1) for p in parts])], source,
                              counted.counted, loudness_db=loudness, mode="whole")

        return WindowPlan("encoder", rows, k, finish)

    # ---- decoding ----------------------------------------------------------------------
    def _decode_window(self, name: str, codes: np.ndarray) -> np.ndarray:
        """Samples `[channels_per_row, n]` for codes `[K, frames]` through decoder graph `name`."""
        if self.rvq is None:
            if codes.shape[0] != self.n_codebooks:
                raise CodesError(f"this decoder has the quantizer inside and takes exactly "
                                 f"{self.n_codebooks} codebooks, got {codes.shape[0]}")
            return self.graph(name)(codes[None].astype(np.int64))[0]
        return self.graph(name)(self.rvq.decode(codes)[None])[0]

    def _decode_rows(self, name: str, rows) -> np.ndarray:
        """Audio `[channels, n]` of one window's codes, a row `[K, frames]` each."""
        return np.concatenate([self._decode_window(name, c) for c in rows])

    def chunk_frames(self) -> int:
        return self.graph("decoder_chunked" if "decoder_chunked" in self.present
                          else "encoder_chunked").int("chunk_frames")

    def expected_frames(self, n: int, mode: str | None) -> int | None:
        if mode in ("fixed", "whole"):
            return math.ceil(n / self.frame_size)
        if mode == "chunked":
            step = self.graph("decoder_chunked" if "decoder_chunked" in self.present
                              else "encoder_chunked").int("chunk_step")
            return math.ceil(n / step) * self.chunk_frames()
        return None

    def raw_pieces(self, codes: Codes, mode: str | None, progress: bool) -> Iterator[np.ndarray]:
        data, frames = codes.data, self.fixed_frames()
        t = data.shape[-1]
        asked, mode = mode, mode or codes.mode or ("fixed" if t == frames else "chunked")
        if mode == "fixed" and t != frames and asked is None:
            mode = "whole"  # the official decode of every frame at once (a .dac of padded codes)
        if mode == "whole":
            yield from self._whole_pieces(data, progress)
            return
        if mode == "fixed":
            if t != frames:
                raise CodesError(f"{t} frames given; the fixed-length decoder takes exactly {frames}")
            yield self._decode_rows("decoder", data)
            return
        chunk = self.chunk_frames()
        if codes.chunk_frames not in (None, chunk):
            raise CodesError(f"the codes were made with chunks of {codes.chunk_frames} frames, this "
                             f"model decodes {chunk}; export with the --chunk-len they were made with")
        if t % chunk:
            raise CodesError(f"{t} frames is neither the fixed length {frames} nor a multiple of the "
                             f"chunk length {chunk}; re-encode with this model, or export with "
                             "--len / --chunk-len matching the codes")
        pieces = self.map_windows(
            lambda i: self._decode_rows("decoder_chunked", data[:, :, i:i + chunk]),
            range(0, t, chunk))
        yield from tqdm(pieces, total=t // chunk, desc="decode", unit="chunk",
                        disable=None if progress else True)

    def _whole_pieces(self, data: np.ndarray, progress: bool) -> Iterator[np.ndarray]:
        """The fixed decoder in windows overlapping by its receptive field: the audio of the
        official `decode` of all the frames at once."""
        frames, margin = self.whole_geometry("decoder")
        t, hop = data.shape[-1], self.frame_size
        if t < frames:
            raise CodesError(f"{t} frames are fewer than the fixed decoder's {frames}: the whole mode "
                             "decodes at least one fixed call; decode them in the fixed mode")
        plan = list(overlap_windows(t, frames, margin, end_aligned=True))
        pieces = (self._decode_rows("decoder", data[:, :, s:s + frames]) for s, _, _ in plan)
        for (s, lo, hi), audio in tqdm(zip(plan, pieces), total=len(plan), desc="decode", unit="window",
                                       disable=None if progress else True):
            # The last window ends at the clip: its audio runs to the decode's end.
            yield audio[:, (lo - s) * hop:(hi - s) * hop if hi < t else None]


def _channels(g: Graph) -> int:
    """Audio channels a graph takes or gives: its metadata's (TSAC), else 1 (DAC)."""
    return g.int("channels") if "channels" in g.meta else 1


def raise_shape(g: Graph, why: str) -> None:
    raise ModelFileError(f"{g.path}: {why}; the file is damaged, re-export the folder")


def _windows(blocks: Iterator[np.ndarray], starts, window: int, delay: int) -> Iterator[np.ndarray]:
    """Windows `[C, window]` at `starts` (rising) of the signal zero-padded by `delay` on the left
    and with zeros past its end, holding no more than a window and a block at a time."""
    buf, pos = None, 0  # buf holds the padded signal from index pos on
    it = iter(blocks)
    starts = list(starts)
    for i, s in enumerate(starts):
        while buf is None or pos + buf.shape[1] < s + window:
            block = next(it, None)
            if buf is None:
                channels = block.shape[0]
                buf = np.zeros((channels, delay), np.float32)
            if block is None:
                block = np.zeros((buf.shape[0], s + window - pos - buf.shape[1]), np.float32)
            buf = np.concatenate([buf, block], axis=1)
        yield buf[:, s - pos:s - pos + window]
        drop = min((starts[i + 1] if i + 1 < len(starts) else s + window) - pos, buf.shape[1])
        buf, pos = buf[:, drop:], pos + drop
