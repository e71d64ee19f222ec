"""Step graphs: what their inputs and outputs are (`step_io`), and the runner that carries one
stream's state from call to call (`StepRunner`). A server's bank carries many (bank.py).

A step graph's first input is the step's audio or codes and its first output the step's result;
each state is an input `<name>_in` with either an output `<name>_out` of the same shape (the next
step's `<name>_in`) or, for a ring, an output `<name>_new` holding only the step's new rows,
which the runner writes in place at the rows it feeds as `ring_at` (see `step_io`).
`offset_in`/`offset_out` count the positions each stream has seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..errors import CodecportError, ModelFileError
from .graph import Graph, dtype_of
from .providers import onnxruntime

if TYPE_CHECKING:
    import onnxruntime as ort


class StepIO(NamedTuple):
    """A step graph's inputs and outputs by role (see `step_io`)."""

    pairs: list[tuple[str, str]]  # `<name>_out` -> `<name>_in`, `offset` among them
    fed: list[str]  # what each step is fed: the first is its audio or codes
    rings: list[tuple[str, str]]  # `<name>_new` -> `<name>_in`: rows written at `ring_at`
    ring: tuple[int, int] | None  # (rows a step writes, rows a ring holds) when it has rings


def step_io(graph: Graph) -> StepIO:
    """A step graph's state: pairs (`<name>_out` -> `<name>_in`, in output order, `offset` among
    them), rings (`<name>_new` -> `<name>_in`: the step's t new rows `[..., t, D]` of a ring
    `[..., length, D]`, which the runner writes in place at the rows of axis -2 it fed as
    `ring_at` `[B, t]`, see `ring_rows` and `write_ring`) and its other inputs (what each step is
    fed: the first is its audio or codes)."""
    inputs, outputs = graph.session.get_inputs(), graph.session.get_outputs()
    names = {i.name for i in inputs}
    shapes = {a.name: tuple(a.shape) for a in [*inputs, *outputs]}
    pairs, rings, odd = [], [], []
    for o in outputs[1:]:
        if o.name.endswith("_out"):
            pairs.append((o.name, o.name[:-len("_out")] + "_in"))
        elif o.name.endswith("_new"):
            rings.append((o.name, o.name[:-len("_new")] + "_in"))
        else:
            odd.append(o.name)
    if odd or any(i not in names for _, i in pairs + rings) or \
            (rings and not {"ring_at", "offset_in"} <= names) or (not rings and "ring_at" in names):
        raise ModelFileError(f"{graph.path}: its state inputs and outputs are not <name>_in/<name>_out "
                             "pairs; re-export it")
    for out_name, in_name in pairs:
        if shapes[out_name] != shapes[in_name]:
            raise ModelFileError(f"{graph.path}: {out_name} {shapes[out_name]} cannot feed "
                                 f"{in_name} {shapes[in_name]}; re-export it")
    for new, in_name in rings:
        a, r, at = shapes[new], shapes[in_name], shapes["ring_at"]
        if len(a) < 3 or a[:-2] != r[:-2] or a[-1] != r[-1] or at != (a[0], a[-2]) or \
                r[-2] != shapes[rings[0][1]][-2] or a[-2] > r[-2]:
            raise ModelFileError(f"{graph.path}: {new} {a} at ring_at {at} cannot be written into "
                                 f"{in_name} {r}; re-export it")
    states = {i for _, i in pairs + rings}
    ring = (shapes["ring_at"][1], shapes[rings[0][1]][-2]) if rings else None
    return StepIO(pairs, [i.name for i in inputs if i.name not in states | {"ring_at"}], rings, ring)


def ring_rows(offset: np.ndarray, ring: tuple[int, int]) -> np.ndarray:
    """`ring_at` `[B, t]` for streams at `offset` `[B]`: the rows of their rings that the step's
    t positions go to, (offset + i) mod the rings' length."""
    t, length = ring
    return (offset[:, None] + np.arange(t)) % length


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
    `state` copies the state out to numpy; setting it copies it back in. A graph that keeps a
    state as a ring (`<name>_new`, see `step_io`) has its new rows written in place, without
    io_binding only.
    """

    def __init__(self, graph: Graph, io_binding: bool):
        self.graph, self.io_binding = graph, io_binding
        self.pairs, fed, self.rings, self.ring = step_io(graph)
        if self.rings and io_binding:
            raise ModelFileError(f"{graph.path.name} keeps ring state, which a step with io_binding "
                                 "cannot write in place; run it with io_binding off")
        self.input, self.output = fed[0], graph.session.get_outputs()[0]
        self.names = [o.name for o in graph.session.get_outputs()]
        self.out_dtype = dtype_of(self.output, graph.path)
        self.states = {i.name: i for i in graph.session.get_inputs() if i.name not in [*fed, "ring_at"]}
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
            feeds = {self.input: x, **extra, **self._state}
            if self.rings:
                feeds["ring_at"] = ring_rows(self._state["offset_in"], self.ring)
            outs = dict(zip(self.names, self.graph.run(feeds)))
            rings = {i: self._state[i] for _, i in self.rings}
            self._state = {in_name: outs[out_name] for out_name, in_name in self.pairs}
            for new, in_name in self.rings:
                write_ring(rings[in_name], [0], outs[new], feeds["ring_at"])
                self._state[in_name] = rings[in_name]
            return outs[self.output.name]
        binding = self._bindings[self._turn]
        for name, v in {self.input: x, **extra}.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(v))
        # A new host array each step: the caller keeps it while the next step writes elsewhere.
        out = np.empty(self.output.shape, self.out_dtype)
        binding.bind_ortvalue_output(self.output.name, onnxruntime().OrtValue.ortvalue_from_numpy(out))
        self.graph.run_with_iobinding(binding)
        self._turn ^= 1
        return out
