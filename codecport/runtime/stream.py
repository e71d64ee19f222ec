"""The one stream protocol of every codec that streams.

A codec streams through two objects (`Codec.streams` says which it has):

- an encoder stream: `push(pcm)` takes mono samples at the model's rate, any number, and returns
  the codes now final (`[codebooks, frames]`, frames >= 0); `flush()` ends the input (zero-padded
  as the codec's whole-clip encode pads it) and returns the rest;
- a decoder stream: `push(codes)` takes code frames, any number (`[codebooks, frames]`, or one
  such array per time scale for a multi-scale codec), and returns the audio now final;
  `flush()` ends the codes and returns the rest.

Any split of the input gives the same output as the whole (tested for every codec that streams).
`step_frames` is how many code frames one graph call takes or gives: pushing that many at a time
(or their samples) is the live rhythm. Each states its `latency` (how far behind the input its
final output runs, in code frames and samples), `reset()`s to a new stream, and keeps its whole
state as a value: `s.state` takes it out (a copy), `s.state = value` puts it back, on this stream
or another of the same folder, so a server can move a stream between slots.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import AudioError, CodecportError, CodesError
from .audio import check_samples
from .codes import Codes


@dataclass(frozen=True)
class Latency:
    """How far a stream's final output runs behind its input: `frames` code frames (of the
    coarsest time scale) and `samples` samples at the model's rate, counted from the moment the
    input of a frame is complete."""

    frames: float
    samples: int


@dataclass(frozen=True)
class StreamState:
    """Everything a stream holds, as a value: `kind` names the stream it came from (its codec
    folder's export and its settings) and is checked when it is put back."""

    kind: str
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        # Copies, read-only: a value, not a window onto a live stream.
        frozen = {}
        for k, a in self.arrays.items():
            a = np.array(a, copy=True)
            a.setflags(write=False)
            frozen[k] = a
        object.__setattr__(self, "arrays", MappingProxyType(frozen))
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))


def as_pcm(pcm) -> np.ndarray:
    """Samples pushed to an encoder stream as one float32 row: `[samples]` or `[1, samples]` of
    floats, none NaN; any number, none included."""
    try:
        pcm = np.asarray(pcm)
    except (TypeError, ValueError) as e:
        raise AudioError(f"push samples as a float array, got {type(pcm).__name__} ({e})") from None
    if pcm.dtype.kind != "f":
        raise AudioError(f"samples are {pcm.dtype}, not floats; push float audio in [-1, 1] (int16 PCM "
                         "divided by 32768)")
    if pcm.ndim == 2 and pcm.shape[0] == 1:
        pcm = pcm[0]
    if pcm.ndim != 1:
        raise AudioError(f"an encoder stream takes one channel, [samples] or [1, samples], got shape "
                         f"{list(pcm.shape)}; use one stream per channel")
    check_samples(pcm, "pushed audio")
    return pcm.astype(np.float32, copy=False)


def as_levels(codes, levels: int) -> list[np.ndarray]:
    """Code frames of one channel as `[codebooks, frames]` arrays, one per time scale: from a
    `Codes` of one channel, a sequence of arrays (one per time scale, each `[frames]`,
    `[codebooks, frames]` or `[1, codebooks, frames]`) or, for a codec of one time scale, one
    array."""
    if isinstance(codes, Codes):
        if codes.channels != 1:
            raise CodesError(f"a stream takes one channel's codes, got {codes.channels}; use one "
                             "stream per channel")
        return [a[0] for a in codes.arrays]
    if levels == 1 and isinstance(codes, np.ndarray):
        codes = [codes]
    if not isinstance(codes, (list, tuple)) or len(codes) != levels:
        raise CodesError(f"push one array per time scale ({levels}), got "
                         f"{len(codes) if isinstance(codes, (list, tuple)) else type(codes).__name__}")
    out = []
    for a in codes:
        a = np.asarray(a)
        if a.ndim == 3 and a.shape[0] == 1:  # [1, codebooks, frames]: one channel's
            a = a[0]
        if a.ndim == 1 and levels > 1:  # a time scale of one codebook, as the official shapes give it
            a = a[None]
        if a.ndim != 2:
            raise CodesError(f"codes must be [codebooks, frames] of one channel, got shape "
                             f"{list(a.shape)}; use one stream per channel")
        out.append(a)
    return out


class Stream(ABC):
    """What encoder and decoder streams share; see the module doc."""

    side = ""  # "encoder" or "decoder"
    step_frames = 1  # code frames (of the coarsest time scale) one graph call takes or gives

    def __init__(self, codec):
        self.codec = codec

    @property
    def kind(self) -> str:
        """Which streams a state may move between: the same export, side and settings."""
        return f"{self.codec.name} {self.side} {self.codec.export_id} {self.settings()}"

    def settings(self) -> str:
        """What, beyond the export, makes this stream's state its own (codebooks, noise...)."""
        return ""

    @property
    @abstractmethod
    def latency(self) -> Latency: ...

    @abstractmethod
    def push(self, x): ...

    @abstractmethod
    def flush(self): ...

    @abstractmethod
    def reset(self) -> None: ...

    @abstractmethod
    def _get_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...

    @abstractmethod
    def _set_state(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None: ...

    @property
    def state(self) -> StreamState:
        arrays, values = self._get_state()
        return StreamState(self.kind, arrays, values)

    @state.setter
    def state(self, value: StreamState) -> None:
        if not isinstance(value, StreamState) or value.kind != self.kind:
            got = value.kind if isinstance(value, StreamState) else type(value).__name__
            raise CodecportError(f"this state belongs to another stream ({got}); a state goes back "
                                 f"into a stream of the same folder and settings ({self.kind})")
        self._set_state(value.arrays, value.values)


class EncoderStream(Stream):
    side = "encoder"


class DecoderStream(Stream):
    side = "decoder"


class Stepped:
    """What a stream whose work is whole graph steps adds: its input is buffered (`feed`), each
    step's inputs taken out (`next_step`) and its output handed back (`take`). `push` and
    `flush` run the steps on the stream's own `runner` (a StepRunner); a server's pool runs the
    same steps for many streams in one batched call (slots.py), its runner a row of the batch.
    Either way the output is the same."""

    runner: Any  # `runner(x, **extra)` -> the step's first output; `state`; `reset()`

    def push(self, x):
        self.feed(x)
        return self._drain()

    def flush(self):
        self.end()
        return self._drain()

    def _drain(self):
        out = []
        while self.ready():
            x, extra = self.next_step()
            out.append(self.take(self.runner(x, **extra)))
        return self.join(out)

    @abstractmethod
    def feed(self, x) -> None:
        """Check and buffer input (what `push` takes)."""

    @abstractmethod
    def end(self) -> None:
        """The input is over: what is buffered is padded into last steps."""

    @abstractmethod
    def ready(self) -> bool:
        """Whether a step is waiting to run."""

    @abstractmethod
    def next_step(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The next step's first input `[1, ...]` and its other per-step inputs by name."""

    @abstractmethod
    def take(self, y: np.ndarray):
        """This stream's output of the step whose output is `y` (`[1, ...]`)."""

    @abstractmethod
    def join(self, pieces: list):
        """Output pieces as one (none: an empty one)."""


class Duplex:
    """An encoder stream and a decoder stream in one object, under codecport 0.2's names: what a
    live loop (microphone in, speaker out) holds."""

    def __init__(self, encoder: EncoderStream, decoder: DecoderStream):
        self.encoder, self.decoder = encoder, decoder

    def encode_step(self, pcm):
        return self.encoder.push(pcm)

    def decode_step(self, codes):
        return self.decoder.push(codes)

    def flush_encoder(self):
        return self.encoder.flush()

    def flush_decoder(self):
        return self.decoder.flush()

    def reset(self) -> None:
        self.encoder.reset()
        self.decoder.reset()

    @property
    def latency_frames(self) -> float:
        return self.encoder.latency.frames

    def __getattr__(self, name: str):
        # The step geometry (step_frames, step_samples, io_binding...) is the encoder's. Before
        # __init__ (copy and pickle probe a bare object) there is none: a plain AttributeError.
        encoder = self.__dict__.get("encoder")
        if encoder is None:
            raise AttributeError(name)
        return getattr(encoder, name)
