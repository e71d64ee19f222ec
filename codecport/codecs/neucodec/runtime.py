"""NeuCodec on ONNX Runtime: 16 kHz audio in, one FSQ codebook of 65 536 codes at 50 Hz, 24 kHz out.

Encoding pads the clip as the official `_prepare_audio` does (up to the next 320 samples, a
whole frame when already there), computes w2v-BERT's fbank features in numpy (fbank.py), runs
the encoder graph with the clip's frames masked in, and quantizes its output with the numpy FSQ
(fsq.py): the official `encode_code`'s codes, `n // 320` frames for `n` samples. Decoding turns
codes into FSQ levels and runs the decoder graph, masked the same way: the official
`decode_code`'s audio, 480 samples a frame. XCodec2 (codecs/xcodec2/runtime.py) runs through this class:
its graphs' metadata (`fbank_pad`, `acoustic_extra`) says how its encoder's two paths line up.
So does the distilled NeuCodec (`semantic_model: hubert`), whose semantic model reads the padded
clip's samples (fbank.raw_values) instead of fbank features.

A folder exported with the quantizer in its graphs (`--in-graph-quantizer`, `--target web`)
takes and gives codes instead: its encoder computes the features itself from the same padded
audio, and its decoder turns codes into levels.

The graphs hold a fixed number of frames. The model attends to the whole clip, so a longer clip
has no exact form through them: the fixed mode refuses it with the length to export for it, the
windowed mode cross-fades windows of the graphs' length.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property
from typing import ClassVar

import numpy as np

from ...errors import AudioError, CodesError, ModelFileError
from ...runtime.audio import Counted, resampled_length
from ...runtime.codec import Codec
from ...runtime.codes import Codes
from ...runtime.folder import sized_name
from ...runtime.graph import Graph
from ...runtime.plan import WindowPlan, crossfade, crossfaded
from ...runtime.stream import DecoderStream, Latency, as_levels
from .fbank import FEATURES, RATE, Fbank, raw_values
from .fsq import Fsq


def clip_mask(frames: int, valid: int) -> np.ndarray:
    """The graphs' `mask` `[1, 1, frames]`: 1.0 on the clip's first `valid` frames."""
    m = np.zeros((1, 1, frames), np.float32)
    m[..., :valid] = 1.0
    return m


class NeuCodecCodec(Codec):
    """The graphs of one `codec-export neucodec` folder, opened lazily on one provider."""

    name, label = "neucodec", "NeuCodec"
    graphs: ClassVar = {"encoder": ("encoder", "fixed"), "decoder": ("decoder", "fixed")}
    modes = ("fixed", "windowed")
    sized = ("encoder", "decoder")  # `--buckets`: shorter graphs beside the main pair
    batchable = ("encoder",)  # `--batch`: for tokenizing corpora (window_plan)
    streams = ("decoder",)  # through the windowed mode's windows (NeuCodecWindowStream)
    shared = (*Codec.shared, "input_rate", "input_frame_size", "levels", "fbank_pad", "acoustic_extra",
              "semantic_model", "semantic_normalize")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        g = self.first
        self.frames, self.input_frame = g.int("frames"), g.int("input_frame_size")
        # How the semantic path lines up with the acoustic one (codecs/neucodec/config.py).
        self.fbank_pad, self.extra = g.int("fbank_pad"), g.int("acoustic_extra")
        # The semantic model's input: w2v-BERT's fbank features, or the distilled variant's
        # DistilHuBERT samples (normalised or not, as its feature extractor's config says).
        self.raw_semantic = g.choice("semantic_model", ("w2v-bert", "hubert")) == "hubert" \
            if "semantic_model" in g.meta else False
        self.normalize = g.meta.get("semantic_normalize") == "1"
        self.fsq = self.rvq or Fsq(g.ints("levels"))  # the levels' facts, whichever side quantizes
        if self.input_rate != RATE:  # the features (fbank.py) and the semantic models are 16 kHz's
            raise ModelFileError(f"{g.path}: its input rate is {self.input_rate} Hz, {self.label} encodes "
                                 f"{RATE} Hz; the file is damaged, re-export the folder")
        if self.fsq.size != self.codebook_size or self.n_codebooks != 1 or \
                self.input_rate * self.frame_size != self.sample_rate * self.input_frame:
            raise ModelFileError(f"{g.path}: its levels, rates and frame sizes disagree; the file is "
                                 "damaged, re-export the folder")

    def load_rvq(self) -> Fsq:
        return Fsq(self.first.ints("levels"))

    def check_graph(self, name: str, g: Graph) -> None:
        frames, levels, b = g.int("frames"), len(g.ints("levels")), g.batch
        mask, codes = (b, 1, frames), (b, 1, frames)
        audio = (b, 1, (frames + g.int("acoustic_extra")) * g.int("input_frame_size"))
        in_graph = g.meta.get("quantizer") == "graph"
        if g.meta.get("semantic_model") == "hubert":
            features = (b, audio[-1] + 2 * g.int("fbank_pad"))
        else:
            features = (b, frames, FEATURES)
        if name.startswith("encoder"):
            want = ([audio, mask], [codes]) if in_graph else ([audio, features, mask], [(b, frames, levels)])
        else:
            want = ([codes if in_graph else (b, frames, levels), mask],
                    [(b, 1, frames * g.int("frame_size"))])
        if frames < 2 or g.shapes() != want:
            raise ModelFileError(f"{g.path}: its inputs/outputs are {g.shapes()}, its metadata says "
                                 f"{want}; the file is damaged, re-export the folder")
        if name.startswith("encoder") and not in_graph and features[-1] == FEATURES:
            # The features computed here must have a row for each frame of the graph: how the
            # two paths line up is metadata, which a damaged file could get wrong.
            rows = Fbank.frames(audio[-1] + 2 * g.int("fbank_pad"))
            if rows != frames:
                raise ModelFileError(f"{g.path}: its fbank_pad ({g.int('fbank_pad')}) and acoustic_extra "
                                     f"({g.int('acoustic_extra')}) give {rows} feature rows for its {frames} "
                                     "frames; the file is damaged, re-export the folder")

    def _bucket(self, side: str, frames: int) -> tuple[str, int]:
        """(graph, its frames) of `side` for a clip of `frames` frames: the shortest that holds
        it, a bucket of `--buckets` or the main graph."""
        fit = [f for f in self.sizes.get(side, []) if frames <= f < self.frames]
        return (sized_name(side, fit[0]), fit[0]) if fit else (side, self.frames)

    @staticmethod
    def crossfade_overlap(frames: int) -> int:
        """Frames two windows share in the windowed mode: a quarter of a window."""
        return max(1, frames // 4)

    @property
    def overlap(self) -> int:
        return self.crossfade_overlap(self.frames)

    @classmethod
    def clip_frames(cls, meta: dict[str, str]) -> tuple[int, int]:
        """The official pad takes a clip to the next whole frame (a whole frame more when
        already there); the acoustic frames past the codes are not codes."""
        hop = int(meta["input_frame_size"])
        return hop, (1 - int(meta["acoustic_extra"])) * hop

    def _too_long(self, frames: int | None) -> CodesError:
        """A clip of `frames` code frames (None: not known, more than the graphs hold) refused."""
        held = f"this export's graphs hold {self.frames} frames ({self.frames / self.frame_rate:.2f} s)"
        # The --len whose graphs hold it (codecs/neucodec/export.frames_of): its whole frames less
        # the frame the official pad adds where the codes count it (acoustic_extra 0, XCodec2's).
        need = f"--len {(frames - 1 + self.extra) * self.frame_size} or more" if frames else "a larger --len"
        what = f"{frames} frames ({frames / self.frame_rate:.2f} s) are" if frames else "this clip is"
        return CodesError(f"{what} more than {held}, so it has no exact form through them: re-export "
                          f"with {need}, or pass the windowed mode (--mode windowed: cross-faded windows, "
                          "not the whole-clip result)")

    def _pick(self, mode: str | None, frames: int) -> str:
        """The mode for a clip of `frames`: fixed when it fits, unless told."""
        if mode is None:
            return "fixed" if frames <= self.frames else "windowed"
        if mode == "fixed" and frames > self.frames:
            raise self._too_long(frames)
        return mode

    # ---- encoding ----------------------------------------------------------------------
    def codebooks(self, n_codebooks: int | None) -> int:
        if n_codebooks not in (None, 1):
            raise CodesError(f"{self.label} has one codebook; pass no codebook count (--codebooks)")
        return 1

    def expected_frames(self, n: int, mode: str | None) -> int:
        return self._frames_of(n)

    def _frames_of(self, n: int) -> int:
        """Codes of a clip of `n` samples (`clip_frames`)."""
        return n // self.input_frame + 1 - self.extra

    def encode_source(self, source, n_codebooks, mode, progress) -> Codes:
        """The clip in one call when it fits the graphs (the official codes), else (or with
        `mode="windowed"`) in windows sharing `overlap` frames, each window's codes kept from the
        middle of each overlap on: memory bounded by a window, codes close to, not equal to,
        the whole clip's. Each window runs through the shortest graph that holds it."""
        self.codebooks(n_codebooks)
        done: dict = {}
        rows: list[list[np.ndarray]] = [[] for _ in range(source.channels)]
        for audio, lo, hi in self._windows(source, mode, done):
            name, size = self._bucket("encoder", self._frames_of(audio.shape[1]))
            g = self.graph(name)
            for c, x in enumerate(audio):
                rows[c].append(self.latent_codes(g(self._feeds(x, size))[0], 1)[0, lo:hi])
        arrays = [np.stack([np.concatenate(r) for r in rows])[:, None]]
        return self.codes(arrays, source, done["counted"], mode=done["mode"])

    def window_plan(self, source, n_codebooks, mode=None) -> WindowPlan | None:
        """The windows of `encode_source` as a plan for batched graphs (`codec-export --batch`):
        every window through the main encoder, whose batched copy takes windows of any clips
        together, each row masked to its own window. Without batched graphs, None: a clip then
        runs through `encode_source`, whose windows take the shortest graph that holds them."""
        if not self.batches.get("encoder"):
            return None
        self.codebooks(n_codebooks)
        done: dict = {}
        spans: list[tuple[int, int]] = []  # the codes kept of each window, channel by channel

        def windows():
            for audio, lo, hi in self._windows(source, mode, done):
                for x in audio:
                    spans.append((lo, hi))
                    yield self._feeds(x, self.frames)

        def finish(codes: list[np.ndarray]) -> Codes:
            kept = [c[0, lo:hi] for c, (lo, hi) in zip(codes, spans)]
            rows = [np.concatenate(kept[c::source.channels]) for c in range(source.channels)]
            return self.codes([np.stack(rows)[:, None]], source, done["counted"], mode=done["mode"])

        return WindowPlan("encoder", windows(), 1, finish)

    def latent_codes(self, y: np.ndarray, k: int) -> np.ndarray:
        """Codes `[1, frames]` of one row of an encoder's output: the graph's own codes `[1,
        frames]`, or the FSQ of its latent `[frames, levels]`."""
        return y.astype(np.int64) if self.rvq is None else self.fsq.indices(y)[None]

    def _windows(self, source, mode: str | None, done: dict) -> Iterator[tuple[np.ndarray, int, int]]:
        """The clip's windows `(audio [channels, n], lo, hi)`, each encoded as a clip alone and
        its codes `lo:hi` kept: the whole clip when it fits the graphs, else (or with
        `mode="windowed"`) windows of the graphs' length sharing `overlap` frames, each kept
        from the middle of each overlap on. Sets `done["mode"]` and `done["counted"]` (the
        samples read) once the last is out."""
        counted = Counted(source)
        # A window's audio: the longest whole-frame clip whose padded length fits the graph's input.
        hop, size = self.input_frame, (self.frames - 1 + self.extra) * self.input_frame
        step = self.frames - self.overlap
        buf, start, keep_from = np.zeros((source.channels, 0), np.float32), 0, 0  # start: buf[0]'s frame
        for b in self.model_rate(counted):
            buf = np.concatenate([buf, b], axis=1)
            # A window is not the clip's last while audio runs a frame past it (the official pad).
            while buf.shape[1] >= size + hop:
                if mode == "fixed":  # the whole length where the source knows it, for the message
                    known = source.frames and self._frames_of(
                        resampled_length(source.frames, source.sample_rate, self.input_rate))
                    raise self._too_long(known or None)
                mode = "windowed"
                keep_to = start + step + self.overlap // 2
                yield buf[:, :size], keep_from - start, keep_to - start
                keep_from, start, buf = keep_to, start + step, buf[:, step * hop:]
        frames = start + self._frames_of(buf.shape[1])
        if frames < 1 or not buf.size:
            raise AudioError(f"{buf.shape[1]} samples at {self.input_rate} Hz are under one {self.label} "
                             f"frame ({hop} samples, 20 ms); pass a longer clip")
        done["mode"], done["counted"] = self._pick(mode, frames), counted.counted
        yield buf, keep_from - start, frames - start

    @cached_property
    def _fbank(self) -> Fbank:
        return Fbank()

    def _feeds(self, x: np.ndarray, size: int) -> dict[str, np.ndarray]:
        """The feeds of an encoder of `size` frames for clip `x` `[n]` (at most a window): the
        official pad, the window's after it, and the clip's frames masked in."""
        hop, frames = self.input_frame, self._frames_of(x.size)
        padded = np.zeros((1, 1, (size + self.extra) * hop), np.float32)
        padded[0, 0, :x.size] = x
        feeds = {"audio": padded, "mask": clip_mask(size, frames)}
        if self.rvq is not None:  # the features in numpy (else the graph computes them from the same clip)
            clip = padded[0, 0, :(frames + self.extra) * hop]
            if self.raw_semantic:
                values = raw_values(clip, self.fbank_pad, self.normalize)
                feeds["features"] = np.zeros((1, padded.shape[-1] + 2 * self.fbank_pad), np.float32)
                feeds["features"][:, :values.shape[1]] = values
            else:
                feeds["features"] = np.zeros((1, size, FEATURES), np.float32)
                feeds["features"][0, :frames] = self._fbank.features(np.pad(clip, self.fbank_pad))
        return feeds

    # ---- decoding ----------------------------------------------------------------------
    def decoder_stream(self, io_binding: bool | None = None) -> NeuCodecWindowStream:
        """Codes a frame at a time (as an LLM emits them) in, audio out through the windowed
        mode's windows: the audio `decode` gives for the whole sequence (`NeuCodecWindowStream`).
        `io_binding` is taken as every codec's streams take it; whole windows keep no state on a device."""
        return NeuCodecWindowStream(self)

    def raw_pieces(self, codes: Codes, mode: str | None, progress: bool):
        """One call when the codes fit the graphs, else (or with `mode="windowed"`) windows that
        share `overlap` frames, cross-faded over them."""
        a = codes.arrays[0]
        n = a.shape[-1]
        if n < 1:
            raise CodesError("no code frames to decode")
        if self._pick(mode, n) == "fixed" or n <= self.frames:
            yield self._decode_window(a)
            return
        step = self.frames - self.overlap
        starts = range(0, n - self.overlap, step)
        yield from crossfaded((self._decode_window(a[..., s:s + self.frames]) for s in starts),
                              self.overlap * self.frame_size)

    def _decode_window(self, a: np.ndarray) -> np.ndarray:
        """Audio `[channels, frames * frame_size]` of codes `[channels, 1, frames]` (at most a window)."""
        frames = a.shape[-1]
        name, size = self._bucket("decoder", frames)
        g, out = self.graph(name), []
        for row in a[:, 0]:
            if self.rvq is None:
                x = {"codes": np.zeros((1, 1, size), np.int32)}
                x["codes"][0, 0, :frames] = row
            else:
                x = {"levels": np.zeros((1, size, self.fsq.dim), np.float32)}
                x["levels"][0, :frames] = self.fsq.codes(row)
            out.append(g.run({**x, "mask": clip_mask(size, frames)})[0][0, 0, :frames * self.frame_size])
        return np.stack(out)


class NeuCodecWindowStream(DecoderStream):
    """Decodes codes as they come through the windowed mode's windows: a window (the graphs'
    `frames` codes from a multiple of `frames - overlap`) is decoded as a clip alone as soon as
    its last code arrives, and cross-faded into the previous one over `overlap` frames; `flush`
    decodes what is left as the last, shorter window. Together: the audio `decode(codes)` gives
    for the whole sequence (its fixed mode when the sequence fits one window, else its windowed
    mode). The model attends to its whole window, so a frame's audio comes out when its window
    is complete: up to `frames - 1` frames after its code (`latency`); export a short --len for a
    short latency. The windows' error against a whole-clip decode is the windowed mode's
    (docs/neucodec.md)."""

    def __init__(self, codec: NeuCodecCodec):
        super().__init__(codec)
        self.window, self.overlap = codec.frames, codec.overlap
        self.reset()

    def reset(self) -> None:
        self.codes = np.zeros(0, np.int64)  # the codes from the next window's start on
        self.tail: np.ndarray | None = None  # the last window's overlap, not returned yet

    @property
    def latency(self) -> Latency:
        frames = self.window - 1
        return Latency(frames, frames * self.codec.frame_size)

    @property
    def step_frames(self) -> int:
        """Code frames whose audio one window makes final: a window less its overlap."""
        return self.window - self.overlap

    @property
    def frames_to_window(self) -> int:
        """Code frames that complete the next window (a server steps one window at a time)."""
        return self.window - self.codes.size

    def check_input(self, codes) -> np.ndarray:
        """`codes` as `push` takes them, checked: their frames `[n]` (a server's pool checks each
        message with this as it arrives, so a bad one is refused before any window runs)."""
        codes = as_levels(codes, 1)[0]
        return self.codec.check_codes(codes).data[0][0] if codes.shape[1] else np.zeros(0, np.int64)

    def push(self, codes) -> np.ndarray:
        self.codes = np.concatenate([self.codes, self.check_input(codes)])
        out = []
        while self.codes.size >= self.window:  # a whole window, final whatever follows
            out.append(self._fade(self.codes[:self.window]))
            self.codes = self.codes[self.window - self.overlap:]
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def flush(self) -> np.ndarray:
        """The rest: the last window (what follows the last whole one's overlap), faded in."""
        out = []
        if self.tail is None:  # no whole window came: the codes are one clip, decoded alone
            if self.codes.size:
                out.append(self.codec._decode_window(self.codes[None, None])[0])
        else:
            if self.codes.size > self.overlap:
                out.append(self._fade(self.codes))
            out.append(self.tail)
        self.reset()
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def _fade(self, codes: np.ndarray) -> np.ndarray:
        audio = self.codec._decode_window(codes[None, None])
        out, self.tail = crossfade(None if self.tail is None else self.tail[None], audio,
                                   self.overlap * self.codec.frame_size)
        self.tail = self.tail[0]
        return out[0]

    def _get_state(self):
        tail = np.zeros(0, np.float32) if self.tail is None else self.tail
        return {"codes": self.codes, "tail": tail}, {"faded": self.tail is not None}

    def _set_state(self, arrays, values) -> None:
        codes, tail = arrays.get("codes"), arrays.get("tail")
        if codes is None or tail is None or codes.ndim != 1 or not isinstance(values.get("faded"), bool):
            raise CodesError("this stream state lacks the codes or the overlap of a NeuCodec decoder stream")
        # What push leaves: codes short of a window, and once faded the overlap's audio.
        overlap = self.overlap * self.codec.frame_size if values["faded"] else 0
        if codes.size >= self.window or tail.ndim != 1 or tail.dtype.kind != "f" or tail.size != overlap or \
                not np.isfinite(tail).all():
            raise CodesError(f"this stream state holds {codes.size} codes and {tail.size} samples of "
                             f"overlap; a {self.codec.label} decoder stream's holds under "
                             f"{self.window} codes and {overlap} samples: it is not this stream's")
        self.codes = self.check_input(codes[None]) if codes.size else np.zeros(0, np.int64)
        self.tail = np.array(tail, np.float32) if values["faded"] else None
