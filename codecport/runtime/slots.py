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
rows apart). A slot gives, piece by piece, exactly what one stream of stream.py gives for the
same input: the same stream objects run here, their runner a row of the bank.

A stream that runs whole windows through fixed graphs (NeuCodec's and XCodec2's decoder) has no
step graph and no state a graph carries: its slots are a `WindowPool`'s, with the same interface,
each slot's input run through its own stream. `open_pool` picks the pool a side needs.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import CodecportError
from .graph import Graph, dtype_of
from .stream import Latency, ring_window, step_io, write_ring

log = logging.getLogger(__name__)


class StepBank:
    """The state of `size` slots of one step, in numpy rows, stepped through `graphs`: the same
    step for b slots a call, one graph per b (the folder's one-stream `<side>_step` and its
    `<side>_slots` ladder, or one of them).

    A call of b slots costs about the same however few of them have a step, so the k slots ready
    go through the calls that cost least for k, as measured on the calls so far (a size not yet
    measured is tried first): one by one, the smallest graph that holds them, or a mix. A lone
    stream then waits no longer than on a graph of its own, and four ready slots of sixteen cost
    a call of four. A call reads the slots' rows in place when they lie within b rows, else a
    copy of them; rows it holds without a step are fed zeros and keep their state.
    """

    # A size's cost: the least of its last `TIMES` calls, known after `TIMES` calls not counting
    # a session's first (its memory set up). A call is never faster than its cost, and the
    # machine busy elsewhere only makes one slower: one slow call must not keep a size out for
    # good. Sizes are not tried again later: each try is a slow step for the streams in it (a
    # size of 8 tried every 200 calls put 2 streams' p99 over 80 ms).
    TIMES = 3

    def __init__(self, graphs: Sequence[Graph], size: int):
        by_b = {}
        for g in graphs:
            first = step_io(g)[1][0]
            by_b[int(next(a.shape[0] for a in g.session.get_inputs() if a.name == first))] = g
        self.graph = by_b[max(by_b)]  # the largest: what the others must match
        self.pairs, self.fed, self.rings = step_io(self.graph)
        self.outputs = [o.name for o in self.graph.session.get_outputs()]
        args = {a.name: a for a in self.graph.session.get_inputs()}
        self.b = max(by_b)
        self.size = size
        self.rows = {n: (tuple(args[n].shape[1:]), dtype_of(args[n], self.graph.path)) for n in args}
        self.state = {i: np.zeros((size, *self.rows[i][0]), self.rows[i][1]) for _, i in self.pairs + self.rings}
        self.graphs = {b: g for b, g in sorted(by_b.items()) if g is self.graph or self._fits(g, b)}
        # Slots are rows of axis 0: every input must have one, and a step must carry state (the
        # window graph older SNAC folders hold as their step has none).
        self.batch_first = bool(self.state) and all(len(args[n].shape) > 0 and args[n].shape[0] == self.b for n in args)
        self.cost: dict[int, float | None] = dict.fromkeys(self.graphs)  # seconds a call, per size
        self.times: dict[int, deque] = {b: deque(maxlen=self.TIMES) for b in self.graphs}
        self.runs = dict.fromkeys(self.graphs, 0)  # calls of each size
        self._copies: dict[int, dict[str, np.ndarray]] = {}  # per size: rows gathered for a call

    def _fits(self, g: Graph, b: int) -> bool:
        """Whether `g` is this step for b slots, with the same inputs, state rows and outputs
        (folders of codecport 0.3 and older keep Mimi's attention state batch-second, and a
        one-stream step that carries its attention whole does not fit slots that keep it as
        rings: no)."""
        return [a.name for a in g.session.get_inputs()] == list(self.rows) and all(
            tuple(a.shape) == (b, *self.rows[a.name][0]) for a in g.session.get_inputs()) and \
            [o.name for o in g.session.get_outputs()] == self.outputs

    def reset(self, slot: int) -> None:
        for a in self.state.values():
            a[slot] = 0

    def plan(self, k: int) -> list[int]:
        """The sizes of the calls that step k ready slots at the least cost known (an unmeasured
        size counts as free, so each is tried), largest first; each call takes the next slots."""
        cost = {b: c or 0.0 for b, c in self.cost.items()}
        best, first = [0.0], [0]  # least cost of n slots, and the size of its first call
        for n in range(1, k + 1):
            c, b = min((best[max(0, n - b)] + c, b) for b, c in cost.items())
            best.append(c)
            first.append(b)
        sizes = []
        while k > 0:
            sizes.append(first[k])
            k -= first[k]
        return sorted(sizes, reverse=True)

    def run(self, steps: Mapping[int, tuple[np.ndarray, dict[str, np.ndarray]]]) -> dict[int, np.ndarray]:
        """One step of each slot in `steps` (slot -> its first input `[1, ...]` and its other
        inputs): slot -> its first output `[1, ...]`."""
        out: dict[int, np.ndarray] = {}
        pending = sorted(steps)
        for b in self.plan(len(pending)):
            slots, pending = pending[:b], pending[b:]
            out.update(self._call(b, slots, steps))
        return out

    def warm(self) -> None:
        """Every size's cost measured before a slot steps, on zero input and state (the outputs
        dropped): a size first tried under load would be a slow step for the streams in it."""
        for b, g in self.graphs.items() if len(self.graphs) > 1 else ():
            feeds = {n: np.zeros((b, *shape), dtype) for n, (shape, dtype) in self.rows.items()}
            while self.cost[b] is None:
                t = time.perf_counter()
                g.session.run(None, feeds)
                self._record(b, time.perf_counter() - t)

    def _record(self, b: int, seconds: float) -> None:
        if self.runs[b]:
            self.times[b].append(seconds)
        self.cost[b] = min(self.times[b]) if len(self.times[b]) == self.TIMES else None
        self.runs[b] += 1

    def _call(self, b: int, slots: list[int], steps: Mapping) -> dict[int, np.ndarray]:
        t = time.perf_counter()  # the cost of a call counts its copies in and out
        lo = min(slots[0], max(0, self.size - b))
        inside = slots[-1] < lo + b <= self.size
        rows = [s - lo for s in slots] if inside else list(range(len(slots)))
        feeds = {}
        for i, name in enumerate(self.fed):
            shape, dtype = self.rows[name]
            a = np.zeros((b, *shape), dtype)
            for s, r in zip(slots, rows):
                x, extra = steps[s]
                a[r] = (x if i == 0 else extra[name])[0]
            feeds[name] = a
        for _, name in self.pairs + self.rings:
            if inside:
                feeds[name] = self.state[name][lo:lo + b]
            else:
                # Rows past the slots' keep what an earlier call left there: some slot's state,
                # which a step of zeros reads as well as any (its outputs are dropped).
                rows_in = self._copies.setdefault(b, {}).setdefault(
                    name, np.zeros((b, *self.rows[name][0]), self.rows[name][1]))
                for r, s in enumerate(slots):  # row by row: twice as fast as np.take here
                    rows_in[r] = self.state[name][s]
                feeds[name] = rows_in
        ys = dict(zip(self.outputs, self.graphs[b].session.run(None, feeds)))
        for out, name in self.pairs:
            self.state[name][slots] = ys[out][rows]
        for new, name in self.rings:  # after the call: it read the rows where they lie
            write_ring(self.state[name], slots, ys[new][rows], ys["ring_at"][rows])
        self._record(b, time.perf_counter() - t)
        y = ys[self.outputs[0]]
        return {s: y[r:r + 1] for s, r in zip(slots, rows)}


class BankRow:
    """One slot of a bank as a stream's runner (StepRunner's interface)."""

    def __init__(self, bank: StepBank, slot: int):
        self.bank, self.slot = bank, slot

    def __call__(self, x: np.ndarray, **extra: np.ndarray) -> np.ndarray:
        return self.bank.run({self.slot: (x, extra)})[self.slot]

    def reset(self) -> None:
        self.bank.reset(self.slot)

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The row's state as a one-stream step carries it (rings as its shifted windows), so a
        stream moves between a slot and a stream of its own."""
        out = {n: a[self.slot:self.slot + 1].copy() for n, a in self.bank.state.items()}
        for _, n in self.bank.rings:
            out[n] = ring_window(out[n], int(out["offset_in"][0]))
        return out

    @state.setter
    def state(self, values: Mapping[str, np.ndarray]) -> None:
        if set(values) != set(self.bank.state):
            raise CodecportError(f"a state of {self.bank.graph.path.name} holds {sorted(self.bank.state)}, "
                                 f"got {sorted(values)}")
        for n, v in values.items():
            a = self.bank.state[n]
            if v.shape != (1, *a.shape[1:]) or v.dtype != a.dtype:
                raise CodecportError(f"state {n} of {self.bank.graph.path.name} is {a.dtype} "
                                     f"{[1, *a.shape[1:]]}, got {v.dtype} {list(v.shape)}")
        offset = int(values["offset_in"][0]) if self.bank.rings else 0
        rings = {n for _, n in self.bank.rings}
        for n, v in values.items():
            self.bank.state[n][self.slot] = ring_window(v[0], offset, back=True) if n in rings else v[0]


class Slot:
    """One live stream of a pool. Input in with `feed`/`end`, output out of `pool.step`."""

    def __init__(self, pool: SlotPool, index: int):
        self.pool, self.index = pool, index
        self.stream = None
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
        """(a free slot, a new stream of this side for it), or (None, None) when every slot is
        taken. Bad settings raise (CodecportError) and take no slot."""
        free = next((s for s in self.slots if not s.open), None)
        if free is None:
            return None, None
        make = self.codec.encoder_stream if self.side == "encoder" else self.codec.decoder_stream
        return free, make(**{**self.settings, **settings, "io_binding": False})


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
        stream.runner = BankRow(self.bank, free.index)
        stream.reset()
        free.stream, free.open, free._ended = stream, True, False
        return free

    def release(self, slot: Slot) -> None:
        if slot.open:
            slot.open = False
            self.bank.reset(slot.index)
            slot.stream = None

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
    input through its own stream, one slot after another: what one stream alone gives."""

    batch = 1  # slots one graph call serves

    def __init__(self, codec, side: str, size: int, **settings):
        super().__init__(codec, side, size, settings)
        self.slots = [WindowSlot(self, i) for i in range(size)]

    def open(self, **settings) -> WindowSlot | None:
        free, stream = self._new_stream(settings)
        if free is None:
            return None
        free.stream, free.open, free._ended, free.flushed, free.pending = stream, True, False, False, []
        return free

    def release(self, slot: WindowSlot) -> None:
        slot.open, slot.stream, slot.pending = False, None, []

    def step(self, slots: Sequence[WindowSlot]) -> tuple[dict[WindowSlot, np.ndarray], dict[WindowSlot, Exception]]:
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
