"""One connection's stream as the scheduler (engine.py) sees it: its slots, the input not yet
fed to them, and the messages not yet sent, with the bound that drops a slow reader.

The server puts input in (`put_pcm`, `put_codes`, `end`) and sends what `outbox` gives; the
scheduler feeds the slots from `pending`, steps them, and `emit`s their output here. Everything
runs on the event loop's thread: only `pool.step` runs elsewhere, and it never touches a `Live`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from dataclasses import dataclass

import numpy as np

from .protocol import TAG_AUDIO, TAG_CODES, CodeLayout, ProtocolError, Request, pcm_to_bytes

log = logging.getLogger(__name__)
# What a waiting piece of input costs beyond its data (a numpy array's object and its place in a
# list; measured 124-232 bytes): counted toward the input bound, so that a client sending many
# tiny messages meets the bound as one sending few large ones does, and the pieces joined when
# a slot takes them stay few.
PIECE_BYTES = 256


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


class Live:
    """One connection's stream: its slots, the input not yet fed to them, and the messages not
    yet sent (`outbox`, `backlog` bytes). The server puts input in (`put_pcm`, `put_codes`,
    `end`), the scheduler feeds and steps it and `emit`s its output."""

    def __init__(self, scheduler, request: Request):
        self.scheduler, self.request, codec = scheduler, request, scheduler.codec
        self.layout = CodeLayout.of(codec, request.codebooks)
        self.slots: dict = {}  # side -> Slot, once granted
        self.granted: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending: dict[str, list] = {side: [] for side in request.sides}
        self.pending_bytes = dict.fromkeys(request.sides, 0)  # what `pending` costs, a side
        self.room = asyncio.Event()  # set while the pending input is under the bound
        self.room.set()
        self.end_asked = dict.fromkeys(request.sides, False)
        self.ended = dict.fromkeys(request.sides, False)
        self.finished: set[str] = set()
        self.outbox = Outbox()
        self.backlog, self.warned = 0, False
        self.error: ProtocolError | None = None  # why it failed
        self.complete = False  # done was queued
        self.on_fail = None  # the server's: stop the sender, send the error, close
        self.frames = dict.fromkeys(request.sides, 0)
        self.samples = dict.fromkeys(request.sides, 0)
        self.coarse_in = 0  # coarse frames of codes received (decode)
        self.resampler = None
        if "encoder" in request.sides and request.sample_rate != codec.sample_rate:
            import soxr

            # VHQ, streamed: the samples of one `soxr.resample` of the whole input, as codec-run's.
            self.resampler = soxr.ResampleStream(request.sample_rate, codec.sample_rate, 1, dtype="float32",
                                                 quality="VHQ")

    def settings(self, side: str) -> dict:
        """The stream settings of this stream's `side` slot."""
        if side == "encoder":
            return {"n_codebooks": self.request.codebooks}
        return {} if self.request.noise is None else {"noise": self.request.noise}

    @property
    def closed(self) -> bool:
        return self.complete or self.error is not None

    # ---- input, from the connection ---------------------------------------------------------
    def _queue(self, side: str, x, nbytes: int, arrays: int = 1) -> None:
        self.pending[side].append(x)
        self.pending_bytes[side] += nbytes + PIECE_BYTES * arrays
        if sum(self.pending_bytes.values()) > self.scheduler.input_bound:
            self.room.clear()
        self.scheduler.wake()

    def take(self, side: str) -> list:
        """The pending input of `side`, all of it, for its slot."""
        pieces, self.pending[side], self.pending_bytes[side] = self.pending[side], [], 0
        return pieces

    def put_pcm(self, x: np.ndarray) -> None:
        """float32 samples at the input's rate (encode, duplex)."""
        if any(self.end_asked.values()):
            raise ProtocolError("bad_request", "input after {\"op\": \"end\"}; open another stream")
        if self.resampler is not None:
            grown = len(x) * self.scheduler.codec.sample_rate / self.request.sample_rate * 4
            if grown > self.scheduler.input_bound:  # resampling up must not multiply a message
                most = int(self.scheduler.input_bound / 4 * self.request.sample_rate
                           / self.scheduler.codec.sample_rate)
                raise ProtocolError("too_large", f"{len(x)} samples at {self.request.sample_rate} Hz make "
                                                 f"{grown / 2**20:.0f} MiB at the model's rate; send at most "
                                                 f"{most} samples a message")
            x = self.resampler.resample_chunk(x)
        if len(x):
            self._queue("encoder", x, x.nbytes)

    def put_codes(self, levels: list[np.ndarray]) -> None:
        """Code frames, one `[rows, frames_l]` array per level (decode)."""
        if self.end_asked["decoder"]:
            raise ProtocolError("bad_request", "input after {\"op\": \"end\"}; open another stream")
        frames = self.layout.frames(levels)
        if frames:
            self.coarse_in += frames
            self._queue("decoder", levels, sum(a.nbytes for a in levels), len(levels))

    def end(self) -> None:
        """The input is over: flush and finish (the decoder of a duplex stream ends after its encoder)."""
        side = self.request.sides[0]
        if self.end_asked[side]:
            raise ProtocolError("bad_request", "a second {\"op\": \"end\"}")
        group = self.scheduler.codec.group_frames
        if side == "decoder" and self.coarse_in % group:
            raise ProtocolError("bad_input", f"the stream ended after {self.coarse_in} coarse frames; "
                                             f"{self.scheduler.codec.label} decodes whole groups of {group}")
        if self.resampler is not None:
            tail = self.resampler.resample_chunk(np.zeros(0, np.float32), last=True)
            if len(tail):
                self._queue("encoder", tail, tail.nbytes)
        self.end_asked[side] = True
        self.scheduler.wake()

    # ---- output, from the scheduler ---------------------------------------------------------
    def emit(self, side: str, piece: np.ndarray) -> None:
        metrics = self.scheduler.metrics
        duplex = self.request.op == "duplex"
        if side == "encoder":
            codes = piece
            n = codes.shape[1]
            if n:
                self.frames[side] += n
                metrics.frames[side] += n
                self._send((TAG_CODES if duplex else b"") + self.layout.pack([codes]))
                if duplex:
                    self.pending["decoder"].append([codes])
                    self.coarse_in += n
        elif len(piece):
            self.samples[side] += len(piece)
            metrics.samples[side] += len(piece)
            self._send((TAG_AUDIO if duplex else b"") + pcm_to_bytes(piece, self.request.pcm))

    def side_finished(self, side: str) -> None:
        self.finished.add(side)
        if side == "encoder" and "decoder" in self.request.sides:
            self.end_asked["decoder"] = True
        if self.finished == set(self.request.sides) and not self.closed:
            self.complete = True
            self.scheduler.metrics.done[self.request.op] += 1
            self.outbox.put(json.dumps({"op": "done", "frames": self.frames, "samples": self.samples}))
            self.outbox.put(Close(1000))

    def _send(self, data: bytes) -> None:
        if self.closed:
            return
        self.backlog += len(data)
        self.outbox.put(data)
        bound, metrics = self.scheduler.max_backlog, self.scheduler.metrics
        if self.backlog > bound:
            metrics.drops += 1
            log.info("dropping a slow reader: %d bytes not sent", self.backlog)
            self.fail(ProtocolError("behind", f"dropped: {self.backlog} bytes of output were waiting for "
                                              f"this client (bound {bound}); read faster, or open fewer "
                                              "streams"))
        elif self.backlog > bound // 2 and not self.warned:
            self.warned = True
            metrics.warnings += 1
            # At the front: the next message the client gets, ahead of the backlog it warns of.
            self.outbox.put(json.dumps({
                "op": "warning", "code": "behind", "backlog": self.backlog, "bound": bound,
                "message": f"{self.backlog} bytes of output wait for this client; "
                           f"past {bound} it is dropped"}),
                front=True)

    def sent(self, nbytes: int) -> None:
        """The sender wrote `nbytes` of output."""
        self.backlog = max(0, self.backlog - nbytes)
        if self.backlog < self.scheduler.max_backlog // 4:
            self.warned = False

    def fail(self, error: ProtocolError) -> None:
        """End the stream with `error`: its slots go back at once, its queued output is dropped,
        and the server sends the error and closes."""
        if self.closed:
            return
        self.error = error
        self.scheduler.metrics.errors[error.code] += 1
        self.outbox.clear()
        self.backlog = 0
        self.room.set()
        self.scheduler.leave(self)
        if self.on_fail is not None:
            self.on_fail()
