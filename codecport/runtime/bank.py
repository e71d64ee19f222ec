"""The state of many streams of one step graph in numpy rows, stepped together (`StepBank`),
and one row of it as a stream's runner (`BankRow`): what a server's slot pools (slots.py) run.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import CodecportError
from .graph import Graph, dtype_of
from .step import ring_rows, ring_window, step_io, write_ring


class StepBank:
    """The state of `size` slots of one step, in numpy rows, stepped through `graphs`: the same
    step for b slots a call, one graph per b (the folder's one-stream `<side>_step` and its
    `<side>_slots` ladder, or one of them).

    A call of b slots costs about the same however few of them have a step, so the k slots ready
    go through the calls that cost least for k, as measured on the calls so far (a size not yet
    measured is tried first): one by one, the smallest graph that holds them, or a mix. A lone
    stream then waits no longer than on a graph of its own, and four ready slots of sixteen cost
    a call of four. A call reads the slots' rows in place when they lie within b rows, else a
    copy of them; rows it holds without a step are fed zeros and keep their state. A state the
    graphs keep as a ring (`<name>_new` rows out, see `step_io`) is written into the slots' rows
    in place after the call.
    """

    # A size's cost: the least of its calls so far, known after `TIMES` calls not counting a
    # session's first (its memory set up). A call is never faster than its cost, and the machine
    # busy elsewhere only makes it slower; and only the sizes in use are measured under load. A
    # cost that followed recent calls rose for the sizes in use while the others kept what they
    # cost on a quiet machine, and the bank moved lone streams to larger graphs (the released
    # Mimi, 1 stream: p50 22.8 ms against 16.8 ms on a server of the one-slot graph alone; 4
    # streams: 50 against 16.5 ms, though a call of 4 costs half of 4 calls of 1). Sizes are not
    # tried again later: each try is a slow step for the streams in it (a size of 8 tried every
    # 200 calls put 2 streams' p99 over 80 ms).
    TIMES = 3

    def __init__(self, graphs: Sequence[Graph], size: int):
        by_b = {}
        for g in graphs:
            first = step_io(g)[1][0]
            by_b[int(next(a.shape[0] for a in g.session.get_inputs() if a.name == first))] = g
        self.graph = by_b[max(by_b)]  # the largest: what the others must match
        self.pairs, self.fed, self.rings, self.ring = step_io(self.graph)
        self.outputs = [o.name for o in self.graph.session.get_outputs()]
        args = {a.name: a for a in self.graph.session.get_inputs()}
        self.b = max(by_b)
        self.size = size
        self.rows = {n: (tuple(args[n].shape[1:]), dtype_of(args[n], self.graph.path)) for n in args}
        self.state = {i: np.zeros((size, *self.rows[i][0]), self.rows[i][1])
                      for _, i in self.pairs + self.rings}
        self.graphs = {b: g for b, g in sorted(by_b.items()) if g is self.graph or self._fits(g, b)}
        # Slots are rows of axis 0: every input must have one, and a step must carry state (the
        # window graph older SNAC folders hold as their step has none).
        self.batch_first = bool(self.state) and all(len(args[n].shape) > 0 and args[n].shape[0] == self.b
                                                    for n in args)
        self.cost: dict[int, float | None] = dict.fromkeys(self.graphs)  # seconds a call, per size
        self.best = dict.fromkeys(self.graphs, float("inf"))  # its fastest call, per size
        self.counted = dict.fromkeys(self.graphs, 0)  # calls of each size that count
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
        dropped): a size first tried under load would be a slow step for the streams in it. The
        sizes take turns, so that something else busy on the machine meanwhile slows them alike."""
        if len(self.graphs) == 1:
            return
        feeds = {b: {n: np.zeros((b, *shape), dtype) for n, (shape, dtype) in self.rows.items()}
                 for b in self.graphs}
        while any(c is None for c in self.cost.values()):
            for b, g in self.graphs.items():
                if self.cost[b] is None:
                    t = time.perf_counter()
                    g.run(feeds[b])
                    self._record(b, time.perf_counter() - t)

    def _record(self, b: int, seconds: float) -> None:
        if self.runs[b]:
            self.best[b] = min(self.best[b], seconds)
            self.counted[b] += 1
        self.cost[b] = self.best[b] if self.counted[b] >= self.TIMES else None
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
        if self.rings:
            feeds["ring_at"] = ring_rows(feeds["offset_in"], self.ring)
        ys = dict(zip(self.outputs, self.graphs[b].run(feeds)))
        for out, name in self.pairs:
            self.state[name][slots] = ys[out][rows]
        for new, name in self.rings:  # after the call: it read the rows where they lie
            write_ring(self.state[name], slots, ys[new][rows], feeds["ring_at"][rows])
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
