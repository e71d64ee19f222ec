"""Validating step graphs that hold several streams (`--slots B`): streams join and leave at
different steps, slots sit idle and are reused, all through the runtime's own StepBank; each
stream's outputs are then compared with that stream run alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from ..runtime.bank import StepBank
from ..runtime.graph import Graph
from .validate import session


def mem_graph(model: onnx.ModelProto | bytes, name: str) -> Graph:
    """An in-memory model as the runtime's Graph for a bank (a session and a name; no metadata)."""
    return Graph(Path(f"{name}.onnx"), session(model), {})


def run_streams(model: onnx.ModelProto | bytes, name: str, slots: int,
                streams: list[list]) -> list[list[np.ndarray]]:
    """Each stream's step outputs, the streams sharing `slots` slots: stream i joins slot
    i % slots at step i (or when the stream before it in that slot has left; its row is reset),
    so some steps run part of the slots and some slots sit idle. `streams[i]` holds its steps'
    (first input `[1, ...]`, other inputs by name)."""
    bank = StepBank([mem_graph(model, name)], slots)
    queue = {s: [i for i in range(len(streams)) if i % slots == s] for s in range(slots)}
    at = {i: 0 for i in range(len(streams))}
    out: list[list[np.ndarray]] = [[] for _ in streams]
    step = 0
    while any(queue.values()):
        steps = {}
        for s, waiting in queue.items():
            if waiting and waiting[0] <= step:
                steps[s] = streams[waiting[0]][at[waiting[0]]]
        for s, y in bank.run(steps).items():
            i = queue[s][0]
            out[i].append(y)
            at[i] += 1
            if at[i] == len(streams[i]):
                queue[s].pop(0)
                bank.reset(s)
        step += 1
    return out
