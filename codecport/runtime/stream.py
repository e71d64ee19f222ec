"""The one stream protocol of every codec that streams, and the step-graph runner under it.

A codec streams through two objects (`Codec.streams` says which it has):

- an encoder stream: `push(pcm)` takes mono samples at the model's rate, any number, and returns
  the codes now final (`[codebooks, frames]`, frames >= 0); `flush()` ends the input (zero-padded
  as the codec's whole-clip encode pads it) and returns the rest;
- a decoder stream: `push(codes)` takes code frames, any number (`[codebooks, frames]`, or one
  such array per time scale for a multi-scale codec), and returns the audio now final;
  `flush()` ends the codes and returns the rest.

Any split of the input gives the same output as the whole (tested for every codec that streams).
`step_frames` is how many code frames one graph call takes or gives: pushing that many at a time
(or their samples) is the live rhythm. Each states its `latency` (how far behind the input its final output runs, in code frames and
samples), `reset()`s to a new stream, and keeps its whole state as a value: `s.state` takes it
out (a copy), `s.state = value` puts it back, on this stream or another of the same folder, so a
server can move a stream between slots.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import AudioError, CodecportError, CodesError, ModelFileError
from .audio import check_samples
from .codes import Codes
from .graph import Graph, dtype_of
from .providers import onnxruntime

if TYPE_CHECKING:
    import onnxruntime as ort


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


class StepIO(NamedTuple):
    """A step graph's inputs and outputs by role (see `step_io`)."""

    pairs: list[tuple[str, str]]  # `<name>_out` -> `<name>_in`, `offset` among them
    fed: list[str]  # what each step is fed: the first is its audio or codes
    rings: list[tuple[str, str]]  # `<name>_new` -> `<name>_in`: rows written at `ring_at`


def step_io(graph: Graph) -> StepIO:
    """A step graph's state: pairs (`<name>_out` -> `<name>_in`, in output order, `offset` among
    them), rings (`<name>_new` -> `<name>_in`: the step's new rows `[..., t, D]` of a ring
    `[..., length, D]`, written in place at the `ring_at` `[B, t]` rows of axis -2, see
    `write_ring`) and its other inputs (what each step is fed: the first is its audio or codes)."""
    inputs, outputs = graph.session.get_inputs(), graph.session.get_outputs()
    names = {i.name for i in inputs}
    shapes = {a.name: tuple(a.shape) for a in [*inputs, *outputs]}
    pairs, rings, odd = [], [], []
    for o in outputs[1:]:
        if o.name.endswith("_out"):
            pairs.append((o.name, o.name[:-len("_out")] + "_in"))
        elif o.name.endswith("_new"):
            rings.append((o.name, o.name[:-len("_new")] + "_in"))
        elif o.name != "ring_at":
            odd.append(o.name)
    if odd or any(i not in names for _, i in pairs + rings) or (rings and not {"ring_at", "offset_in"} <= set(shapes)):
        raise ModelFileError(f"{graph.path}: its state inputs and outputs are not <name>_in/<name>_out "
                             "pairs; re-export it")
    for out_name, in_name in pairs:
        if shapes[out_name] != shapes[in_name]:
            raise ModelFileError(f"{graph.path}: {out_name} {shapes[out_name]} cannot feed "
                                 f"{in_name} {shapes[in_name]}; re-export it")
    for new, in_name in rings:
        a, r, at = shapes[new], shapes[in_name], shapes["ring_at"]
        if len(a) < 3 or a[:-2] != r[:-2] or a[-1] != r[-1] or at != (a[0], a[-2]):
            raise ModelFileError(f"{graph.path}: {new} {a} at ring_at {at} cannot be written into "
                                 f"{in_name} {r}; re-export it")
    states = {i for _, i in pairs + rings}
    return StepIO(pairs, [i.name for i in inputs if i.name not in states], rings)


def write_ring(state: np.ndarray, rows, new: np.ndarray, at: np.ndarray) -> None:
    """Write a step's new rows in place: `new[i]` (`[..., t, D]`) into `state[rows[i]]` at the
    ring positions `at[i]` (`[t]`) of axis -2."""
    state[np.asarray(rows)[:, None], ..., at, :] = np.moveaxis(new, -2, 1)


def ring_window(ring: np.ndarray, offset: int, back: bool = False) -> np.ndarray:
    """One stream's ring (position p in row p mod length, axis -2) as the shifted window of the
    step graphs that carry it whole (oldest first), given the stream's `offset` (the positions
    it has seen); `back` turns such a window into the ring."""
    shift = offset % ring.shape[-2]
    return np.roll(ring, shift if back else -shift, axis=-2)


class StepRunner:
    """A streaming step graph with its state carried between calls: each `<state>_out` (and
    `offset_out`) of one step is the `<state>_in` of the next; `reset()` zeroes it all, which is
    the initial state the step graphs document in their `initial_state` metadata. A call feeds
    the step's first input and any others it takes each step (`extra`, by name).

    `io_binding=False` keeps the state as numpy arrays and calls `session.run`. `io_binding=True`
    keeps it as OrtValues on `graph.device`, in two sets that swap roles every step (one bound as
    the inputs, the other as the outputs: an output never overwrites the input it is computed
    from, and nothing is allocated per step); only the step's own inputs go in from the host
    and its first output comes back, into a new array the caller owns. Both give the same bits.
    `state` copies the state out to numpy; setting it copies it back in.
    """

    def __init__(self, graph: Graph, io_binding: bool):
        self.graph, self.io_binding = graph, io_binding
        self.pairs, fed, self.rings = step_io(graph)
        if self.rings and io_binding:
            raise ModelFileError(f"{graph.path.name} keeps ring state, which a step with io_binding "
                                 "cannot write in place; run it with io_binding off")
        self.input, self.output = fed[0], graph.session.get_outputs()[0]
        self.names = [o.name for o in graph.session.get_outputs()]
        self.out_dtype = dtype_of(self.output, graph.path)
        self.states = {i.name: i for i in graph.session.get_inputs() if i.name not in fed}
        self.reset()

    def _zeros(self, name: str) -> np.ndarray:
        arg = self.states[name]
        return np.zeros(arg.shape, dtype_of(arg, self.graph.path))

    def reset(self) -> None:
        """Back to the initial state (all zeros)."""
        if not self.io_binding:
            self._state = {name: self._zeros(name) for name in self.states}
            return
        ort = onnxruntime()
        device, device_id = self.graph.device
        zeros = {n: ort.OrtValue.ortvalue_from_numpy(self._zeros(n), device, device_id) for n in self.states}
        spare = {n: ort.OrtValue.ortvalue_from_shape_and_type(a.shape, dtype_of(a, self.graph.path), device,
                                                              device_id)
                 for n, a in self.states.items()}
        self._sets = [zeros, spare]
        self._bindings = [self._bind(zeros, spare), self._bind(spare, zeros)]
        self._turn = 0

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The state the next step reads, `<name>_in` -> a copy."""
        if not self.io_binding:
            return {n: np.array(v, copy=True) for n, v in self._state.items()}
        return {n: v.numpy().copy() for n, v in self._sets[self._turn].items()}

    @state.setter
    def state(self, values: Mapping[str, np.ndarray]) -> None:
        if set(values) != set(self.states):
            raise CodecportError(f"a state of {self.graph.path.name} holds {sorted(self.states)}, got "
                                 f"{sorted(values)}")
        for n, v in values.items():
            want = self._zeros(n)
            if v.shape != want.shape or v.dtype != want.dtype:
                raise CodecportError(f"state {n} of {self.graph.path.name} is {want.dtype} "
                                     f"{list(want.shape)}, got {v.dtype} {list(v.shape)}")
        if not self.io_binding:
            self._state = {n: np.array(v, copy=True) for n, v in values.items()}
            return
        for n, v in values.items():
            self._sets[self._turn][n].update_inplace(np.ascontiguousarray(v))

    def _bind(self, src: dict[str, ort.OrtValue], dst: dict[str, ort.OrtValue]) -> ort.IOBinding:
        """Binding that reads the state from `src` and writes the next one into `dst`."""
        binding = self.graph.session.io_binding()
        for out_name, in_name in self.pairs:
            binding.bind_ortvalue_input(in_name, src[in_name])
            binding.bind_ortvalue_output(out_name, dst[in_name])
        return binding

    def __call__(self, x: np.ndarray, **extra: np.ndarray) -> np.ndarray:
        """The step's first output for its first input `x`; the state moves on one step."""
        if not self.io_binding:
            outs = dict(zip(self.names, self.graph.session.run(None, {self.input: x, **extra, **self._state})))
            rings = {i: self._state[i] for _, i in self.rings}
            self._state = {in_name: outs[out_name] for out_name, in_name in self.pairs}
            for new, in_name in self.rings:
                write_ring(rings[in_name], [0], outs[new], outs["ring_at"])
                self._state[in_name] = rings[in_name]
            return outs[self.output.name]
        binding = self._bindings[self._turn]
        for name, v in {self.input: x, **extra}.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(v))
        # A new host array each step: the caller keeps it while the next step writes elsewhere.
        out = np.empty(self.output.shape, self.out_dtype)
        binding.bind_ortvalue_output(self.output.name, onnxruntime().OrtValue.ortvalue_from_numpy(out))
        self.graph.session.run_with_iobinding(binding)
        self._turn ^= 1
        return out


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
