"""`Codec`: the one interface every exported codec has, whatever its graphs.

    codec = codecport.load("dac44")
    codes = codec.encode(audio, 44100)          # audio [samples] or [channels, samples], any rate
    audio, sr = codec.decode(codes)              # [channels, samples] float32 at the original rate
    codes.save("x.dac"); codes = codecport.load_codes("x.dac")

A subclass declares its graphs and implements two things: `encode_source` (audio blocks in,
`Codes` out) and `raw_pieces` (codes in, audio at the model rate out, piece by piece). Restoring
the original loudness, rate and length is shared, and so is block-by-block reading and writing:
memory stays flat however long the audio is. A codec that streams gives the streams of
stream.py (`encoder_stream`, `decoder_stream`; `streams` says which it has).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..atomic import ready_parent
from ..errors import AudioError, CodecportError, CodesError
from .audio import ArraySource, FileSource, audio_format, resampled, resampled_length, write_audio_pieces
from .codes import Codes
from .folder import GraphFolder
from .loudness import LoudnessMeter
from .plan import call_input
from .rvq import check_code_values, check_n_codebooks
from .stream import DecoderStream, Duplex, EncoderStream

log = logging.getLogger(__name__)


class Codec(GraphFolder):
    """An export folder's codec on one ONNX Runtime provider.

    Facts (from the graphs' metadata): `name`, `preset`, `sample_rate` (Hz), `frame_size`
    (samples per code frame), `frame_rate` (frames per second), `n_codebooks` (codebooks over
    every time scale), `levels` (time scales), `codebook_size`, `export_id`, `provider` (the ORT
    provider that runs), `modes` (the ways through the graphs: `fixed` is one call of the
    fixed-length graphs; `chunked` (DAC) slides fixed windows over long audio; `whole` (DAC,
    SNAC) runs windows overlapping by the receptive field; `step` streams through step graphs),
    `streams` (the stream sides it has: "encoder", "decoder"), `input_rate` (Hz of the audio its
    encoder takes: `sample_rate` but for a codec that encodes at another rate, NeuCodec's 16 kHz).
    """

    default_codebooks: int | None = None  # codebooks `encode` uses unless told (None: all)
    levels: int = 1  # time scales of its codes: arrays in `Codes` (a multi-scale codec has more)
    strides: tuple[int, ...] = (1,)  # latent frames per code of each time scale, coarse first
    draws_noise: bool = False  # its decoder adds noise (`decode(..., noise=...)` says which)
    group_frames: int = 1  # coarse frames its codes come in whole numbers of (SNAC: its unit)
    in_graph_quantizer: bool = True  # `codec-export --in-graph-quantizer` can put its RVQ in the graphs
    streams: tuple[str, ...] = ()  # the stream sides it has ("encoder", "decoder"; see stream.py)
    restores_loudness: bool = False  # encode measures the input's loudness, decode restores it (DAC)
    limits_peak: bool = False  # encode scales a peak above 1 down to 1 (DAC, as the official compress)
    causal: bool = False  # nothing depends on later samples: a fixed graph takes any shorter clip (Mimi)

    def __init__(self, model_dir: str | Path, provider: str = "cpu", fallback: str | None = None,
                 options: dict[str, str] | None = None, sessions: bool = True):
        super().__init__(model_dir, provider, fallback, options, sessions)
        g = self.first
        self.preset, self.export_id = g.text("preset"), g.text("export_id")
        self.sample_rate, self.frame_size = g.int("sample_rate"), g.int("frame_size")
        self.input_rate = g.int("input_rate") if "input_rate" in g.meta else self.sample_rate
        self.n_codebooks, self.codebook_size = g.int("n_codebooks"), g.int("codebook_size")
        self.quantizer = g.choice("quantizer", ("numpy", "graph"))
        self.rvq = self.load_rvq() if self.quantizer == "numpy" else None

    @classmethod
    def clip_frames(cls, meta: dict[str, str]) -> tuple[int, int]:
        """(hop, add): a clip of `n` samples at the encoder's rate has `(n + add) // hop` code
        frames (from a graph's metadata `meta`; what the browser's plans state). Every frame a
        started one, unless the codec says otherwise."""
        hop = int(meta["frame_size"])
        return hop, hop - 1

    @staticmethod
    def crossfade_overlap(frames: int) -> int | None:
        """Frames two windows of `frames` share in a cross-faded windowed mode (NeuCodec's), or
        None where the codec has none."""
        return None

    def load_rvq(self):
        """The numpy quantizer of a folder whose graphs leave it out (`rvq.npz`)."""
        raise NotImplementedError

    @property
    def modes(self) -> tuple[str, ...]:
        # "slots" graphs are the step graphs again, several streams a call: a server's, not a way
        # through for a clip.
        return tuple(dict.fromkeys(mode for _, mode in self.graphs.values() if mode != "slots"))

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.frame_size

    @property
    def variant(self) -> str:
        """The preset, by the name codecport 0.2 gave it."""
        return self.preset

    @property
    def codebooks_per_level(self) -> int:
        """Codebooks of each time scale (all of them for a codec of one time scale)."""
        return self.n_codebooks // self.levels

    def codebooks(self, n_codebooks: int | None) -> int:
        """The number of codebooks to encode: `n_codebooks`, else the codec's default."""
        default = self.n_codebooks if self.default_codebooks is None else \
            min(self.default_codebooks, self.n_codebooks)
        return check_n_codebooks(default if n_codebooks is None else n_codebooks, self.n_codebooks)

    @property
    def channels_per_row(self) -> int:
        """Audio channels one row of codes holds: 1 (each channel coded on its own) but for a
        model coding several at once (TSAC's stereo DAC)."""
        return 1

    def check_mode(self, mode: str | None) -> str | None:
        if mode not in (None, *self.modes):
            raise CodecportError(f"{self.label} has no {mode} mode; its modes are "
                                 f"{', '.join(self.modes)} (or leave it out to choose by length)")
        return mode

    # ---- encoding ------------------------------------------------------------------------
    def encode(self, audio, sample_rate: int, n_codebooks: int | None = None, *,
               mode: str | None = None, progress: bool = False) -> Codes:
        """Codes of audio `[samples]` or `[channels, samples]` (float, any rate, any length);
        each channel is encoded on its own. `mode` forces a way through the graphs."""
        return self.encode_source(ArraySource(audio, sample_rate), n_codebooks, self.check_mode(mode),
                                  progress)

    def encode_file(self, path: str | Path, n_codebooks: int | None = None, *,
                    mode: str | None = None, progress: bool = False) -> Codes:
        """`encode` of an audio file, read block by block: memory does not grow with its length."""
        return self.encode_source(FileSource(path), n_codebooks, self.check_mode(mode), progress)

    def encode_source(self, source, n_codebooks: int | None, mode: str | None, progress: bool) -> Codes:
        """Codes of an `ArraySource`/`FileSource` (see audio.py)."""
        plan = self.window_plan(source, n_codebooks, mode)
        if plan is None:
            raise CodesError(f"{self.label} cannot encode this clip without streaming graphs")
        return self.run_plan(plan, progress)

    def window_plan(self, source, n_codebooks: int | None, mode: str | None = None):
        """The clip's encode as independent windows through one encoder graph (a
        `plan.WindowPlan`), or None where it needs graphs with state (a long clip in Mimi's
        step mode): batched tokenizing runs those one by one through `encode_source`."""
        return

    def run_plan(self, plan, progress: bool = False) -> Codes:
        """`Codes` of a `WindowPlan` (plan.py), one window at a time (`parallel` at once on
        sliding graphs)."""
        g = self.graph(plan.graph)
        call = lambda ix: plan.codes_of(self, g(call_input(ix[1]))[0], ix[0])
        windows = enumerate(plan.windows)
        codes = self.map_windows(call, windows) if plan.graph in self.sliding else map(call, windows)
        return plan.finish(list(tqdm(codes, desc="encode", unit="window",
                                     disable=None if progress else True)))

    def latent_codes(self, y: np.ndarray, k: int) -> np.ndarray:
        """Codes `[k, frames]` of one row of an encoder's output: the latent `[L, frames]`
        through the numpy RVQ, or the graph's own codes `[K, frames]`."""
        return y[:k].astype(np.int64) if self.rvq is None else self.rvq.encode(y, k)

    def model_rate(self, source) -> Iterator[np.ndarray]:
        """The source's blocks `[channels, n]` at the rate the encoder takes."""
        if source.sample_rate != self.input_rate:
            log.info("resampling %d Hz -> %d Hz", source.sample_rate, self.input_rate)
        return resampled(source.blocks(), source.sample_rate, self.input_rate, source.channels)

    def codes(self, arrays, source, counted: int, **fields) -> Codes:
        """`Codes` made by this model from `source` (`counted` samples at its rate). Codes out of
        range (an encoder whose output overflowed) are an `AudioError`, never written."""
        for a in arrays:
            if a.size and (a.min() < 0 or a.max() >= self.codebook_size):
                raise AudioError(f"encoding gave codes outside [0, {self.codebook_size}) ({a.min()} to "
                                 f"{a.max()}): the encoder's output overflowed; pass audio in [-1, 1]")
        return Codes(tuple(arrays), codec=self.name, preset=self.preset, export_id=self.export_id,
                     sample_rate=source.sample_rate, num_samples=counted, **fields)

    # ---- decoding ------------------------------------------------------------------------
    def decode(self, codes: Codes | np.ndarray, *, mode: str | None = None,
               progress: bool = False, noise=None) -> tuple[np.ndarray, int]:
        """(audio `[channels, samples]` float32, sample rate): the original rate and length when
        `codes` carry them, else the model's rate and the frames' full length. A bare array
        `[channels, codebooks, frames]` (or `[codebooks, frames]`) is taken as codes. `noise`
        is for decoders that draw noise (`draws_noise`): None random, an int seed, "zero"."""
        pieces, sr, _ = self.decode_pieces(codes, mode=mode, progress=progress, noise=noise)
        return np.concatenate(list(pieces), axis=1), sr

    def decode_to_file(self, codes: Codes | np.ndarray, path: str | Path, *, mode: str | None = None,
                       progress: bool = False, noise=None) -> tuple[int, int, int]:
        """`decode` into an audio file (format by suffix), piece by piece and atomically;
        returns (channels, samples, sample rate)."""
        path = Path(path)
        codes = self.check_codes(codes)
        # What the file must hold, asked of its format before any work (FLAC holds 8 channels...).
        audio_format(path, codes.channels * self.channels_per_row, 0, codes.sample_rate or self.sample_rate)
        ready_parent(path)  # the loudness pass spills beside it
        pieces, sr, total = self.decode_pieces(codes, mode=mode, progress=progress, spill=path.parent,
                                               noise=noise)
        channels, samples = write_audio_pieces(path, pieces, sr, total)
        return channels, samples, sr

    def check_noise(self, noise) -> None:
        """A noise setting is refused where the decoder draws none: it would change nothing."""
        if noise is not None and not self.draws_noise:
            raise CodesError(f"{self.label}'s decoder draws no noise; leave out the noise setting")

    def decode_pieces(self, codes: Codes | np.ndarray, *, mode: str | None = None, progress: bool = False,
                      spill: Path | None = None, noise=None) -> tuple[Iterator[np.ndarray], int, int | None]:
        """(pieces `[channels, n]`, sample rate, total samples when known) of `decode`. Where the
        loudness is restored the whole decode is measured first: `spill` is a folder to hold it
        meanwhile on disk (else memory)."""
        codes = self.check_codes(codes)
        self.check_noise(noise)
        extra = {"noise": noise} if self.draws_noise else {}
        pieces = self.raw_pieces(codes, self.check_mode(mode), progress, **extra)
        channels = codes.channels * self.channels_per_row
        if codes.loudness_db is not None:
            pieces = self._restore_loudness(pieces, codes.loudness_db, channels, spill)
        if codes.sample_rate is None:  # the total is at most every frame's samples
            return pieces, self.sample_rate, self.bare_samples(codes)
        pieces = resampled(pieces, self.sample_rate, codes.sample_rate, channels)
        return _exactly(pieces, codes.num_samples, channels), codes.sample_rate, codes.num_samples

    def raw_pieces(self, codes: Codes, mode: str | None, progress: bool) -> Iterator[np.ndarray]:
        """Audio `[channels, n]` at the model rate for every frame of `codes`, piece by piece;
        `mode` is the caller's (None: the codec picks, from `codes.mode` where that matters).
        A codec that `draws_noise` takes `noise` too."""
        raise NotImplementedError

    def bare_samples(self, codes: Codes) -> int:
        """Samples at the model rate of codes that carry no original length: every frame's."""
        return codes.n_frames[0] * self.strides[0] * self.frame_size

    def expected_frames(self, n: int, mode: str | None) -> int | None:
        """Frames `encode` gives for `n` samples at the encoder's rate in `mode` (None: any)."""
        return None

    def check_codes(self, codes: Codes | np.ndarray) -> Codes:
        """`codes` as `Codes` this model can decode, or `CodesError` saying what is wrong."""
        if isinstance(codes, (tuple, list)):  # the arrays of a multi-scale codec
            codes = Codes(tuple(codes))
        elif not isinstance(codes, Codes):
            codes = Codes((codes,))
        if codes.codec not in (None, self.name):
            raise CodesError(f"these are {codes.codec} codes; this folder holds {self.name}")
        if codes.preset not in (None, self.preset):
            raise CodesError(f"these codes were made by {self.name} {codes.preset}; this folder "
                             f"holds {self.name} {self.preset}")
        if len(codes.arrays) != self.levels:  # an extra array would be dropped without a word
            raise CodesError(f"{self.label} codes are {self.levels} time "
                             f"scale{'s' * (self.levels > 1)}; these "
                             f"hold {len(codes.arrays)}")
        if codes.loudness_db is not None and not self.restores_loudness:  # it would set the gain
            raise CodesError(f"these codes carry a loudness (loudness_db), which {self.label} codes never "
                             "do; they were not written by codecport for this codec")
        for a in codes.arrays:
            if a.shape[1] > self.codebooks_per_level:
                raise CodesError(f"codes must be [channels, codebooks<={self.codebooks_per_level}, frames], "
                                 f"got shape {list(a.shape)}")
            check_code_values(a, self.codebook_size)
        if codes.num_samples is not None:
            n = resampled_length(codes.num_samples, codes.sample_rate, self.input_rate)
            # soxr's length can differ from the rounded ratio by a sample.
            allowed = {self.expected_frames(max(1, m), codes.mode) for m in (n - 1, n, n + 1)}
            frames = codes.n_frames[0]
            if None not in allowed and frames not in allowed:
                raise CodesError(f"{frames} frames cannot be {codes.num_samples} samples at "
                                 f"{codes.sample_rate} Hz ({min(allowed)} frames); the file "
                                 "is inconsistent, re-encode the audio")
        return codes

    def _restore_loudness(self, pieces: Iterator[np.ndarray], target_db: float, channels: int,
                          spill: Path | None) -> Iterator[np.ndarray]:
        """The decoded audio brought to `target_db`, as the official DAC `decompress` does: the
        loudness of the whole decode is measured first, so it is kept (on disk under `spill`)."""
        meter = LoudnessMeter(self.sample_rate, channels)
        if spill is None:
            held = []
            for p in pieces:
                meter.push(p)
                held.append(p)
            gain = np.float32(10 ** ((target_db - meter.result()) / 20))
            yield from (p * gain for p in held)
            return
        with tempfile.TemporaryFile(dir=spill, prefix=".codecport-decode-") as f:
            sizes = []
            for p in pieces:
                meter.push(p)
                f.write(np.ascontiguousarray(p, np.float32).tobytes())
                sizes.append(p.shape[1])
            gain = np.float32(10 ** ((target_db - meter.result()) / 20))
            f.seek(0)
            for n in sizes:
                p = np.frombuffer(f.read(4 * channels * n), np.float32).reshape(channels, n)
                yield p * gain

    # ---- streaming (stream.py) -------------------------------------------------------------
    @property
    def stepped(self) -> tuple[str, ...]:
        """The sides whose stream runs step graphs (`<side>_step`), which slot pools batch;
        NeuCodec's decoder stream runs whole windows instead."""
        return tuple(side for side in self.streams if f"{side}_step" in self.graphs)

    def no_stream(self, side: str) -> CodecportError:
        have = " and ".join(self.streams)
        why = f"it streams only its {have} side" if have else \
            f"it has no streaming graphs; its modes are {', '.join(self.modes)}"
        return CodecportError(f"{self.label} has no {side} stream: {why}")

    def encoder_stream(self, n_codebooks: int | None = None) -> EncoderStream:
        """A stream that takes PCM a piece at a time and gives the codes now final (stream.py)."""
        raise self.no_stream("encoder")

    def decoder_stream(self, **settings) -> DecoderStream:
        """A stream that takes code frames a piece at a time and gives the audio now final
        (stream.py); `noise=` for a decoder that draws it."""
        raise self.no_stream("decoder")

    def stream(self, n_codebooks: int | None = None):
        """Both streams in one object, with codecport 0.2's names (`encode_step`, `decode_step`,
        `flush_encoder`, `flush_decoder`, `reset`)."""
        return Duplex(self.encoder_stream(n_codebooks), self.decoder_stream())


def _exactly(pieces: Iterator[np.ndarray], n: int, channels: int) -> Iterator[np.ndarray]:
    """The first `n` samples of `pieces`, zero-padded at the end if they fall short."""
    done = 0
    for p in pieces:
        if done >= n:
            continue  # drain: the producer may hold files or threads open
        keep = p[:, :n - done]
        done += keep.shape[1]
        yield keep
    if done < n:
        yield np.zeros((channels, n - done), np.float32)
