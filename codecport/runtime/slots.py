"""Many live streams of one codec folder, stepped together: what a server holds.

A `SlotPool` has `size` slots of one side (`"encoder"` or `"decoder"`). Each connection `open()`s
a slot (None when all are taken), `feed()`s it input as it arrives, `end()`s it when the input is
over, and `close()`s it when it leaves (the slot goes back to the zero state at once). The
scheduler asks which slots are `ready()` and calls `pool.step(those)`: one graph step for each
of them, and gets each slot's output piece (codes `[codebooks, frames]` from an encoder slot,
as the stream protocol's `push` returns them; audio samples from a decoder slot; either may be
empty). `step` blocks: a server runs it in a thread (ONNX Runtime releases the GIL).

The steps run in a `StepBank`: the state of every slot in numpy rows, stepped through the
folder's batched step graphs (`<side>_slots.onnx`, written by `codec-export --slots B`: B slots
a call, and its ladder of fewer) and its one-slot step graph, the calls that cost least for the
slots ready. A batched call feeds zeros to the slots with
nothing to do and keeps their rows as they were, so an idle slot changes nothing,
and a slot reset or joining never disturbs the others (every op of the graphs keeps the batch
rows apart). A slot gives, piece by piece, what one stream of stream.py gives for the same
input: the same stream objects run here, their runner a row of the bank (exactly, but for slot
graphs that keep attention as rings: their sums run in another order, float rounding apart).

A stream that runs whole windows through fixed graphs (NeuCodec's and XCodec2's decoder) has no
step graph and no state a graph carries: its slots are a `WindowPool`'s, with the same interface,
each slot's input run through its own stream. `open_pool` picks the pool a side needs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from ..errors import CodecportError
from .bank import BankRow, StepBank
from .stream import Latency

log = logging.getLogger(__name__)


class Slot:
    """One live stream of a pool. Input in with `feed`/`end`, output out of `pool.step`."""

    def __init__(self, pool: SlotPool, index: int):
        self.pool, self.index = pool, index
        self.stream = None
        self.settings: tuple | None = None  # what `stream` was made with
        self.open = False
        self._ended = False

    def feed(self, x) -> None:
        """Input as the stream protocol's `push` takes it: float samples at the codec's model
        rate (encoder), or code frames (decoder). Checked here, so a bad message is refused
        before it reaches a batch (CodecportError, one line)."""
        if self._ended:
            raise CodecportError("this stream has ended; open another for more input")
        self.stream.feed(x)

    def end(self) -> None:
        """The input is over: the slot stays ready until the rest of its output has come out."""
        self._ended = True
        self.stream.end()

    @property
    def ended(self) -> bool:
        """`end()` was called since the slot opened."""
        return self._ended

    def ready(self) -> bool:
        """Whether a step of this slot is waiting to run."""
        return self.open and self.stream.ready()

    @property
    def finished(self) -> bool:
        """The input has ended and every output has come out."""
        return self._ended and not self.stream.ready()

    def close(self) -> None:
        """Give the slot back (its state zeroed at once): the connection is gone."""
        self.pool.release(self)

    @property
    def latency(self) -> Latency:
        return self.stream.latency

    @property
    def step_frames(self) -> int:
        return self.stream.step_frames

    runs = "steps"  # how its output comes: a step graph's steps ("windows": whole windows)


class Pool:
    """What every pool shares: `size` slots of `side` on one codec folder, the streams' settings
    (codebooks, noise...; `open(**settings)` overrides them for one slot), and a new stream for a
    free slot."""

    def __init__(self, codec, side: str, size: int, settings: dict):
        if side not in codec.streams:
            raise codec.no_stream(side)
        if not 1 <= size <= 4096:
            raise CodecportError(f"a pool holds 1 to 4096 slots, got {size}")
        self.codec, self.side, self.size, self.settings = codec, side, size, settings

    @property
    def active(self) -> int:
        return sum(s.open for s in self.slots)

    def _new_stream(self, settings: dict):
        """(a free slot, a new stream of this side for it, or None where the slot's last stream
        was made with the same settings: it was reset when the slot closed, and serves again),
        or (None, None) when every slot is taken. Bad settings raise (CodecportError) and take
        no slot."""
        free = next((s for s in self.slots if not s.open), None)
        if free is None:
            return None, None
        merged = {**self.settings, **settings}
        key = tuple(sorted(merged.items(), key=lambda kv: kv[0]))
        if free.stream is not None and free.settings == key:
            return free, None
        make = self.codec.encoder_stream if self.side == "encoder" else self.codec.decoder_stream
        stream = make(**merged, io_binding=False)
        free.settings = key
        return free, stream


class SlotPool(Pool):
    """`size` slots of `side` on one codec folder, stepped through its step graphs. `batched=False`
    steps one slot a call even where the folder has batched step graphs (one step per stream,
    through the ladder's graph of one slot where it has one)."""

    def __init__(self, codec, side: str, size: int, batched: bool = True, **settings):
        super().__init__(codec, side, size, settings)
        if side not in codec.stepped:
            raise CodecportError(f"{codec.label}'s {side} stream runs whole windows, not steps: slot pools "
                                 "step codecs with step graphs; a WindowPool (open_pool) serves it")
        ladder = codec.slot_graphs(f"{side}_slots") if f"{side}_slots" in codec.present else []
        # A ladder that starts at one slot (Mimi's, whose slot graphs keep attention as rings)
        # steps a lone stream too: the one-stream step graph carries its state another way.
        one = [g for g in ladder if g.int("slots") == 1] or [codec.graph(f"{side}_step")]
        self.bank = StepBank([*one, *(g for g in ladder if g.int("slots") > 1)] if batched else one, size)
        if not self.bank.batch_first:
            raise CodecportError(f"{codec.dir}: its {side} step graph keeps no state a batch row at a time "
                                 "(an export of codecport 0.3 or older); re-export the folder to serve it")
        self.bank.warm()
        self.slots = [Slot(self, i) for i in range(size)]

    @property
    def batch(self) -> int:
        """Slots one graph call steps."""
        return self.bank.b

    def open(self, **settings) -> Slot | None:
        """A free slot, in the zero state, or None when every slot is taken. Bad settings raise
        (CodecportError) and take no slot."""
        free, stream = self._new_stream(settings)
        if free is None:
            return None
        if stream is not None:
            # Its row of the bank is in the zero state already (zeroed when the slot closed): the
            # state the stream's own runner made goes, made once per slot and settings, not per
            # stream (8 MB a side for the released Mimi).
            stream.runner = BankRow(self.bank, free.index)
            free.stream = stream
        free.open, free._ended = True, False
        return free

    def release(self, slot: Slot) -> None:
        if slot.open:
            slot.open = False
            slot.stream.reset()  # its bank row zeroed, its buffers emptied: as new for the next

    def step(self, slots: Sequence[Slot]) -> tuple[dict[Slot, np.ndarray], dict[Slot, Exception]]:
        """One step of each slot given that is ready: its output piece (possibly empty), and the
        slots whose own part of the step failed, with why. A failing graph call raises: every
        slot in it may have lost its piece. What a slot does with its own piece (codes out of
        the latent, audio trimmed) fails that slot alone, so one stream never costs the others
        theirs."""
        ready = [s for s in slots if s.ready()]
        ys = self.bank.run({s.index: s.stream.next_step() for s in ready})
        out, failed = {}, {}
        for s in ready:
            try:
                out[s] = s.stream.take(ys[s.index])
            except Exception as e:  # noqa: BLE001 (handed to the caller with its slot)
                failed[s] = e
        return out, failed


class WindowSlot(Slot):
    """A slot of a `WindowPool`: its input, checked as it comes, waits here for the next step."""

    runs = "windows"

    def __init__(self, pool: WindowPool, index: int):
        super().__init__(pool, index)
        self.pending: list = []
        self.flushed = False

    def feed(self, x) -> None:
        if self._ended:
            raise CodecportError("this stream has ended; open another for more input")
        self.pending.append(self.stream.check_input(x))

    def end(self) -> None:
        self._ended = True

    def ready(self) -> bool:
        return self.open and (bool(self.pending) or (self._ended and not self.flushed))

    @property
    def finished(self) -> bool:
        return self._ended and self.flushed and not self.pending


class WindowPool(Pool):
    """`size` slots of `side` whose streams run whole windows through fixed graphs (NeuCodec's and
    XCodec2's decoder: the model attends to its whole window, so there is no step graph and no
    state a graph could carry). The same interface as `SlotPool`; a step runs each ready slot's
    input through its own stream, one slot after another: what one stream alone gives. So a
    slot's window waits for the windows of the slots ready before it (on threads of their own,
    two windows finished later on two cores than one after the other: docs/serve.md)."""

    batch = 1  # slots one graph call serves

    def __init__(self, codec, side: str, size: int, **settings):
        super().__init__(codec, side, size, settings)
        self.slots = [WindowSlot(self, i) for i in range(size)]

    def open(self, **settings) -> WindowSlot | None:
        free, stream = self._new_stream(settings)
        if free is None:
            return None
        if stream is not None:
            free.stream = stream
        free.open, free._ended, free.flushed, free.pending = True, False, False, []
        return free

    def release(self, slot: WindowSlot) -> None:
        if slot.open:
            slot.open, slot.pending = False, []
            slot.stream.reset()

    def step(self, slots: Sequence[WindowSlot]) -> tuple[dict[WindowSlot, np.ndarray],
                                                         dict[WindowSlot, Exception]]:
        """Each ready slot's waiting input through its stream, up to the end of its next window
        (and its flush once the input has ended and run): its output piece, or why that slot
        alone failed."""
        out, failed = {}, {}
        for s in [s for s in slots if s.ready()]:
            # One window a slot a step: a client that sends a whole utterance at once would
            # otherwise hold every other stream (and the server's memory) for all its windows.
            # Nothing waits when the input ended after the last of it had run: the flush alone.
            codes = np.concatenate(s.pending) if s.pending else np.zeros(0, np.int64)
            take = s.stream.frames_to_window
            s.pending = [codes[take:]] if codes.size > take else []
            try:
                pieces = [s.stream.push(codes[None, :take])]
                if s._ended and not s.pending:
                    pieces.append(s.stream.flush())
                    s.flushed = True
                out[s] = np.concatenate(pieces)
            except Exception as e:  # noqa: BLE001 (handed to the caller with its slot)
                failed[s] = e
        return out, failed


def open_pool(codec, side: str, size: int, batched: bool = True, **settings) -> SlotPool | WindowPool:
    """The pool of `size` slots that serves `side` of `codec`: stepped (`SlotPool`) where its
    stream runs step graphs, else a `WindowPool`."""
    if side in codec.stepped:
        return SlotPool(codec, side, size, batched=batched, **settings)
    return WindowPool(codec, side, size, **settings)
