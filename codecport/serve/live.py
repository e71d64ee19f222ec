"""One connection's stream: the input it sent that the engine has not taken yet, the output the
engine made that the connection has not sent yet, the bounds on both, and how it ended.

`Live` is the one owner of that state, and knows neither side of it: the connection
(server.py) puts input in (`put_pcm`, `put_codes`, `end`) and sends what `outbox` gives, telling
`sent`; the engine (engine.py) takes the input (`take`), hands the output back as messages
(`emit`; a duplex stream's codes also `to_decoder`) and says how each side ended
(`side_finished`, `fail`). It is told its bounds (`Limits`), where its counts go (`Metrics`),
and whom to wake when input comes (`wake`). Its methods run on the event loop's thread; `Wire`
and `Intake.pcm`/`Intake.codes` hold the byte work, which may run on another (see server.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .metrics import Metrics
from .protocol import TAG_AUDIO, TAG_CODES, CodeLayout, ProtocolError, Request, pcm_from_bytes, pcm_to_bytes

log = logging.getLogger(__name__)
# What a waiting piece of input costs beyond its data (a numpy array's object and its place in a
# list; measured 124-232 bytes): counted toward the input bound, so that a client sending many
# tiny messages meets the bound as one sending few large ones does, and the pieces joined when
# a slot takes them stay few.
PIECE_BYTES = 256


@dataclass(frozen=True)
class Limits:
    """The bounds of every stream: bytes of input waiting for the engine past which the
    connection stops being read, and bytes of output waiting for the client past which it is
    dropped (warned at half)."""

    input_bound: int
    max_backlog: int


@dataclass(frozen=True)
class Close:
    """The sender's last item: close the WebSocket with `code` (1000 after done)."""

    code: int = 1000


class Outbox:
    """A connection's messages not yet sent, in order; a warning may go to the front."""

    def __init__(self):
        self.items: deque = deque()
        self._ready = asyncio.Event()

    def put(self, item, front: bool = False) -> None:
        (self.items.appendleft if front else self.items.append)(item)
        self._ready.set()

    def clear(self) -> None:
        self.items.clear()

    async def get(self):
        while not self.items:
            self._ready.clear()
            await self._ready.wait()
        return self.items.popleft()


@dataclass(frozen=True)
class Wire:
    """How a stream's output goes on the wire: codes in its layout, audio in its PCM format, a
    duplex stream's messages tagged. Pure: the engine's thread packs with it."""

    layout: CodeLayout
    pcm: str
    duplex: bool

    def codes(self, codes: np.ndarray) -> bytes:
        return (TAG_CODES if self.duplex else b"") + self.layout.pack([codes])

    def audio(self, samples: np.ndarray) -> bytes:
        return (TAG_AUDIO if self.duplex else b"") + pcm_to_bytes(samples, self.pcm)


class Intake:
    """A stream's input messages as the engine takes them: PCM checked and resampled to the
    model's rate (soxr VHQ, streamed: the samples of one `soxr.resample` of the whole input, as
    codec-run's), or codes checked and split by level. One message at a time, in order."""

    def __init__(self, codec, request: Request, input_bound: int):
        self.request, self.rate, self.bound = request, codec.sample_rate, input_bound
        self.layout = CodeLayout.of(codec, request.codebooks)
        self.resampler = None
        if "encoder" in request.sides and request.sample_rate != codec.sample_rate:
            import soxr

            self.resampler = soxr.ResampleStream(request.sample_rate, codec.sample_rate, 1, dtype="float32",
                                                 quality="VHQ")

    def check(self, nbytes: int) -> None:
        """Refuse (too_large) a PCM message that resampling up would grow past the input bound."""
        if self.resampler is None:
            return
        samples = nbytes // 4 if self.request.pcm == "f32" else nbytes // 2
        grown = samples * self.rate / self.request.sample_rate * 4
        if grown > self.bound:
            most = int(self.bound / 4 * self.request.sample_rate / self.rate)
            raise ProtocolError("too_large", f"{samples} samples at {self.request.sample_rate} Hz make "
                                             f"{grown / 2**20:.0f} MiB at the model's rate; send at most "
                                             f"{most} samples a message")

    def pcm(self, data: bytes) -> np.ndarray:
        """float32 samples at the model's rate of a PCM message."""
        x = pcm_from_bytes(data, self.request.pcm)
        return x if self.resampler is None else self.resampler.resample_chunk(x)

    def codes(self, data: bytes) -> list[np.ndarray]:
        """A codes message, `[rows, frames_l]` per level."""
        return self.layout.unpack(data)

    def tail(self) -> np.ndarray:
        """What the resampler holds back, once the input is over."""
        if self.resampler is None:
            return np.zeros(0, np.float32)
        return self.resampler.resample_chunk(np.zeros(0, np.float32), last=True)


class Live:
    """One connection's stream: its input waiting for the engine (`pending`, counted against
    `Limits.input_bound`: `room` is clear past it), its messages waiting for the client
    (`outbox`, `backlog` bytes), and its end (`complete`, or `error` and the `failed` event)."""

    def __init__(self, request: Request, codec, limits: Limits, metrics: Metrics, wake: Callable[[], None]):
        self.request, self.limits, self.metrics, self.wake = request, limits, metrics, wake
        self.layout = CodeLayout.of(codec, request.codebooks)
        self.wire = Wire(self.layout, request.pcm, request.op == "duplex")
        self.intake = Intake(codec, request, limits.input_bound)
        self.group, self.label = codec.group_frames, codec.label
        self.pending: dict[str, list] = {side: [] for side in request.sides}
        self.pending_bytes = dict.fromkeys(request.sides, 0)  # what `pending` costs, a side
        self.room = asyncio.Event()  # set while the pending input is under the bound
        self.room.set()
        self.end_asked = dict.fromkeys(request.sides, False)
        self.finished: set[str] = set()
        self.outbox = Outbox()
        self.backlog, self.warned = 0, False
        self.error: ProtocolError | None = None  # why it failed
        self.failed = asyncio.Event()  # set with `error`: the connection sends it and closes
        self.complete = False  # done was queued
        self.frames = dict.fromkeys(request.sides, 0)
        self.samples = dict.fromkeys(request.sides, 0)
        self.coarse_in = 0  # coarse frames of codes a decoder was given (decode, duplex)

    @property
    def closed(self) -> bool:
        return self.complete or self.error is not None

    @property
    def input_ended(self) -> bool:
        """The client has sent its end."""
        return self.end_asked[self.request.sides[0]]

    # ---- input, from the connection ---------------------------------------------------------
    def _queue(self, side: str, x, nbytes: int, arrays: int = 1) -> None:
        self.pending[side].append(x)
        self.pending_bytes[side] += nbytes + PIECE_BYTES * arrays
        if sum(self.pending_bytes.values()) > self.limits.input_bound:
            self.room.clear()
        self.wake()

    def _open(self) -> None:
        if self.input_ended:
            raise ProtocolError("bad_request", "input after {\"op\": \"end\"}; open another stream")

    def put_pcm(self, x: np.ndarray) -> None:
        """float32 samples at the model's rate (encode, duplex: `Intake.pcm`'s)."""
        self._open()
        if len(x):
            self._queue("encoder", x, x.nbytes)

    def put_codes(self, levels: list[np.ndarray]) -> None:
        """Code frames, one `[rows, frames_l]` array per level (decode: `Intake.codes`')."""
        self._open()
        frames = self.layout.frames(levels)
        if frames:
            self.coarse_in += frames
            self._queue("decoder", levels, sum(a.nbytes for a in levels), len(levels))

    def end(self) -> None:
        """The input is over: flush and finish (the decoder of a duplex stream ends after its encoder)."""
        side = self.request.sides[0]
        if self.end_asked[side]:
            raise ProtocolError("bad_request", "a second {\"op\": \"end\"}")
        if side == "decoder" and self.coarse_in % self.group:
            raise ProtocolError("bad_input", f"the stream ended after {self.coarse_in} coarse frames; "
                                             f"{self.label} decodes whole groups of {self.group}")
        if side == "encoder":
            tail = self.intake.tail()
            if len(tail):
                self._queue("encoder", tail, tail.nbytes)
        self.end_asked[side] = True
        self.wake()

    # ---- the engine's side --------------------------------------------------------------------
    def take(self, side: str) -> list:
        """The pending input of `side`, all of it, for its slot (the connection is read again
        once what waits is under the bound)."""
        pieces, self.pending[side], self.pending_bytes[side] = self.pending[side], [], 0
        if sum(self.pending_bytes.values()) <= self.limits.input_bound:
            self.room.set()
        return pieces

    def input_over(self, side: str) -> bool:
        """`side` has all its input: the end was asked and nothing waits."""
        return self.end_asked[side] and not self.pending[side]

    def to_decoder(self, codes: np.ndarray) -> None:
        """A duplex stream's codes `[codebooks, frames]`, its decoder's input: counted against
        the input bound as the client's own input is."""
        if codes.shape[1] and not self.closed:
            self.coarse_in += codes.shape[1]
            self._queue("decoder", [codes], codes.nbytes)

    def emit(self, side: str, message: bytes, n: int) -> None:
        """An output message of `side` (`Wire`'s), holding `n` code frames (encoder) or samples
        (decoder): queued for the client, or the client dropped if too much waits."""
        if self.closed:
            return
        (self.frames if side == "encoder" else self.samples)[side] += n
        self.backlog += len(message)
        self.outbox.put(message)
        bound = self.limits.max_backlog
        if self.backlog > bound:
            self.metrics.drops += 1
            log.info("dropping a slow reader: %d bytes not sent", self.backlog)
            self.fail(ProtocolError("behind", f"dropped: {self.backlog} bytes of output were waiting for "
                                              f"this client (bound {bound}); read faster, or open fewer "
                                              "streams"))
        elif self.backlog > bound // 2 and not self.warned:
            self.warned = True
            self.metrics.warnings += 1
            # At the front: the next message the client gets, ahead of the backlog it warns of.
            self.outbox.put(json.dumps({
                "op": "warning", "code": "behind", "backlog": self.backlog, "bound": bound,
                "message": f"{self.backlog} bytes of output wait for this client; "
                           f"past {bound} it is dropped"}),
                front=True)

    def side_finished(self, side: str) -> None:
        """`side` has given all its output (its input had ended)."""
        self.finished.add(side)
        if side == "encoder" and "decoder" in self.request.sides:
            self.end_asked["decoder"] = True
            self.wake()  # its decoder ends next
        if self.finished == set(self.request.sides) and not self.closed:
            self.complete = True
            self.metrics.done[self.request.op] += 1
            self.outbox.put(json.dumps({"op": "done", "frames": self.frames, "samples": self.samples}))
            self.outbox.put(Close(1000))

    def fail(self, error: ProtocolError) -> None:
        """End the stream with `error`: its queued output is dropped, the engine is woken to give
        its slots back, and the connection (waiting on `failed`) sends the error and closes."""
        if self.closed:
            return
        self.error = error
        self.metrics.errors[error.code] += 1
        self.outbox.clear()
        self.backlog = 0
        self.room.set()
        self.failed.set()
        self.wake()

    # ---- output, from the connection ----------------------------------------------------------
    def sent(self, nbytes: int) -> None:
        """The connection wrote `nbytes` of output."""
        self.backlog = max(0, self.backlog - nbytes)
        if self.backlog < self.limits.max_backlog // 4:
            self.warned = False
