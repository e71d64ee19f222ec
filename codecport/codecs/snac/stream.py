"""SNAC's decoder streams: `SnacStepStream` on the stateful step graph (codecport 0.4 on), and
`SnacWindowStream` on the window graph older folders hold as `decoder_step.onnx`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...errors import CodesError
from ...runtime.codec import Codec
from ...runtime.rvq import check_code_values
from ...runtime.step import StepRunner
from ...runtime.stream import DecoderStream, Latency, Stepped, as_levels
from .noise import Noise

END_UNKNOWN = 1 << 62  # a step graph's `end` while the clip goes on (past any position)


class _Names02:
    """What codecport 0.2's SNAC stream called things."""

    @property
    def latency_frames(self) -> float:
        return self.latency.frames

    @property
    def frame_samples(self) -> int:
        """Audio samples per coarse frame."""
        return self.codec.strides[0] * self.codec.frame_size

    def finish(self) -> np.ndarray:
        """`flush`, by the name codecport 0.2 gave it."""
        return self.flush()

    def _levels(self, codes) -> list[np.ndarray]:
        """Whole coarse frames of every time scale, checked: one int64 array per scale."""
        strides = self.codec.strides
        arrays = [a.reshape(-1) for a in as_levels(codes, len(strides))]
        frames = arrays[0].shape[0]
        for a, s in zip(arrays, strides):
            if a.shape[0] != frames * strides[0] // s:
                raise CodesError(f"each coarse frame holds {[strides[0] // s for s in strides]} "
                                 f"codes of its time scales, got {[len(a) for a in arrays]}")
            check_code_values(a, self.codec.codebook_size)
        return [a.astype(np.int64) for a in arrays]


class SnacStepStream(_Names02, Stepped, DecoderStream):
    """Decodes coarse frames as a language model emits them, through the stateful
    `decoder_step.onnx`: each push runs the steps its frames complete (`step_frames` coarse
    frames each), each layer computing each position once; `flush()` runs the steps that drain
    the decoder's right context. Together they give the audio `decode` gives for the whole
    sequence with the same noise. The audio runs `latency.samples` behind the codes: the
    decoder's right context, the least any SNAC stream can wait.

    `push(codes)` takes whole coarse frames: one array per time scale, coarse first, each with
    `strides[0] // strides[l]` codes a coarse frame (one Orpheus group of 7 codes is `[c0],
    [c1, c1'], [c2 x4]`).
    """

    def __init__(self, codec: Codec, noise: Noise, channel: int = 0, io_binding: bool | None = None):
        super().__init__(codec)
        g = codec.graph("decoder_step")
        self.n, self.delay = g.int("step_frames"), g.int("delay")
        self.noise_delays = g.ints("noise_delays") if codec.draws_noise else []
        self.step_frames = max(1, self.n // codec.strides[0])
        self.noise, self.channel = noise, channel
        self.runner = StepRunner(g, codec.io_binding if io_binding is None else io_binding)
        self.reset()

    def reset(self) -> None:
        self.runner.reset()
        # Codes of the steps not run yet, one array per time scale: each step's are decoded on
        # their own, the same numbers however the pushes split them.
        self._codes = [np.zeros(0, np.int64) for _ in self.codec.strides]
        self.received = 0  # latent frames pushed
        self.steps = 0  # steps run
        self.ended = False

    @property
    def latency(self) -> Latency:
        # The decoder's right context, and the rest of a step for its first frame to be whole.
        wait = (self.step_frames - 1) * self.frame_samples
        return Latency((wait + self.delay) / self.frame_samples, wait + self.delay)

    def feed(self, codes) -> None:
        if self.ended:
            raise CodesError("this stream has been flushed; reset() it (or open another) for new codes")
        arrays = self._levels(codes)
        self._codes = [np.concatenate([old, a]) for old, a in zip(self._codes, arrays)]
        self.received += len(arrays[0]) * self.codec.strides[0]

    def end(self) -> None:
        if self.received % self.codec.unit:
            raise CodesError(f"the stream ended after {self.received // self.codec.strides[0]} coarse "
                             f"frames; {self.codec.label} decodes whole groups of "
                             f"{self.codec.unit // self.codec.strides[0]}")
        self.ended = True

    def ready(self) -> bool:
        if not self.ended:
            return len(self._codes[0]) * self.codec.strides[0] >= self.n
        return (self.steps * self.n * self.codec.frame_size - self.delay
                < self.received * self.codec.frame_size)

    def next_step(self):
        x = np.zeros((1, self.codec.rvq.latent_dim, self.n), np.float32)
        cut = [self.n // s for s in self.codec.strides]
        if len(self._codes[0]):
            part = self.codec.rvq.decode_levels([c[:k] for c, k in zip(self._codes, cut)])
            x[0, :, :part.shape[1]] = part
        self._codes = [c[k:] for c, k in zip(self._codes, cut)]
        a = self.steps * self.n
        extra = {"end": np.array([self.received if self.ended else END_UNKNOWN], np.int64)}
        for b, (u, d) in enumerate(zip(self.noise.up, self.noise_delays)):
            extra[f"noise_{b}"] = self.noise.positions(self.channel, b, a * int(u) - d, self.n * int(u),
                                                       self.received)
        return x, extra

    def take(self, y: np.ndarray) -> np.ndarray:
        hop = self.codec.frame_size
        start = self.steps * self.n * hop - self.delay  # the clip's sample at y's first
        self.steps += 1
        audio = y[0, 0]
        stop = len(audio) if not self.ended else min(len(audio), self.received * hop - start)
        return audio[max(0, -start):max(0, stop)]

    def join(self, pieces: list) -> np.ndarray:
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def _get_state(self):
        arrays, values = self.noise.state()
        arrays.update(self.runner.state)
        arrays.update({f"level_{i}": c for i, c in enumerate(self._codes)})
        return arrays, {**values, "received": self.received, "steps": self.steps, "ended": self.ended}

    def _set_state(self, arrays, values) -> None:
        arrays = dict(arrays)
        codes = [arrays.pop(f"level_{i}", None) for i in range(len(self.codec.strides))]
        noise = {k: arrays.pop(k) for k in list(arrays) if k.startswith("noise_")}
        if any(c is None or c.ndim != 1 for c in codes) or \
                not all(isinstance(values.get(k), int) for k in ("received", "steps")):
            raise CodesError("this stream state lacks the buffer or counters of a SNAC step stream")
        for c in codes:
            check_code_values(c, self.codec.codebook_size)
        self.runner.state = arrays
        self.noise.set_state(noise, dict(values))
        self._codes = [np.array(c, np.int64) for c in codes]
        self.received, self.steps, self.ended = values["received"], values["steps"], bool(values.get("ended"))


class SnacWindowStream(_Names02, DecoderStream):
    """Decodes coarse frames through the window graph that folders of codecport 0.3 and older hold
    as `decoder_step.onnx`, re-running a window a push (see `SnacStepStream` for newer ones).

    `push(codes)` takes the next coarse frame(s): one array per time scale, coarse first, each
    with `strides[0] // strides[l]` codes a coarse frame (one Orpheus group of 7 codes is
    `[c0], [c1, c1'], [c2 x4]`), and returns the audio now final (possibly none). `flush()`
    returns the rest. Together they give the audio `decode` gives for the whole sequence with the
    same noise: each call's window holds the receptive field on both sides of what it keeps, so
    audio comes out `latency.frames` coarse frames after the frame it belongs to, from the first.
    """

    def __init__(self, codec: Codec, noise=None):
        super().__init__(codec)
        self.g = codec.graph("decoder_step")
        self.window, self.margin = self.g.int("frames"), self.g.int("margin")
        self.step_frames = max(1, self.g.int("step_frames") // codec.strides[0])
        self.noise = codec.noise_of(noise, 1)
        self.reset()

    def reset(self) -> None:
        self.levels: list[np.ndarray] = [np.zeros(0, np.int64) for _ in self.codec.strides]
        self.offset = 0  # latent frame of levels[...][0] (older codes are dropped)
        self.done = 0  # latent frames whose audio has been returned
        self.received = 0  # latent frames pushed

    @property
    def latency(self) -> Latency:
        """Coarse frames that must follow a frame before its audio comes out: the receptive
        field, and the rest of the frames one call decodes (`--step-frames`)."""
        frames = (self.window - self.margin) / self.codec.strides[0] - 1
        return Latency(frames, round(frames * self.frame_samples))

    def push(self, codes: Sequence) -> np.ndarray:
        arrays = self._levels(codes)
        self.levels = [np.concatenate([old, a]) for old, a in zip(self.levels, arrays)]
        self.received += len(arrays[0]) * self.codec.strides[0]
        return self._run(final=False)

    def flush(self) -> np.ndarray:
        """The audio of every frame not returned yet (the sequence has ended)."""
        if self.received % self.codec.unit:
            raise CodesError(f"the stream ended after {self.received // self.codec.strides[0]} coarse "
                             f"frames; {self.codec.label} decodes whole groups of "
                             f"{self.codec.unit // self.codec.strides[0]}")
        return self._run(final=True)

    def _run(self, final: bool) -> np.ndarray:
        out, hop, n = [], self.codec.frame_size, self.received
        while self.done < n:
            # The first window too starts a margin before what it keeps (the mask makes the frames
            # before the clip its edge): the first frames come as soon as any others, not after
            # the whole first window.
            start = self.done - self.margin
            end = start + self.window
            if end > n and not final:
                break  # its right margin has not arrived yet
            keep = n if final and end >= n else end - self.margin
            audio = self.codec.decode_window(self.g, self.levels, self.offset, n if final else end, start,
                                             self.noise, 0)
            out.append(audio[(self.done - start) * hop:(keep - start) * hop])
            self.done = keep
            self._drop(max(0, self.done - self.margin))
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def _drop(self, frame: int) -> None:
        """Forget the codes before latent frame `frame` (a whole coarse frame): memory stays flat."""
        frame -= frame % self.codec.unit
        if frame > self.offset:
            self.levels = [lv[(frame - self.offset) // s:] for lv, s in zip(self.levels, self.codec.strides)]
            self.offset = frame

    def _get_state(self):
        arrays, values = self.noise.state()
        arrays.update({f"level_{i}": lv for i, lv in enumerate(self.levels)})
        return arrays, {**values, "offset": self.offset, "done": self.done, "received": self.received}

    def _set_state(self, arrays, values) -> None:
        levels = [arrays.get(f"level_{i}") for i in range(len(self.codec.strides))]
        if any(lv is None or lv.ndim != 1 for lv in levels) or \
                not all(isinstance(values.get(k), int) for k in ("offset", "done", "received")):
            raise CodesError("this stream state lacks the codes or counters of a SNAC decoder stream")
        for lv in levels:
            check_code_values(lv, self.codec.codebook_size)
        self.noise.set_state(dict(arrays), dict(values))
        self.levels = [np.array(lv, np.int64) for lv in levels]
        self.offset, self.done, self.received = values["offset"], values["done"], values["received"]
