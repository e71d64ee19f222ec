"""What a step graph takes and returns (runtime/step.py), on small graphs built here: state
carried whole (`<name>_out`) and as a ring the runner writes in place (`<name>_new` at
`ring_at`), and the graphs whose outputs say neither, refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from codecport.errors import ModelFileError
from codecport.runtime.bank import StepBank
from codecport.runtime.graph import Graph
from codecport.runtime.step import StepRunner, ring_window, step_io

C, T = 5, 2  # ring rows, positions a step


def _graph(tmp_path: Path, b: int = 1, new_rows: int = T, at_name: str = "ring_at") -> Graph:
    """x `[b, T]` -> y (the ring as the step read it, `[b, 1, C, 1]`), offset + T, and the
    step's values as the ring's new rows (which the runner writes at the rows it feeds as
    `ring_at`: offset, offset + 1, mod C)."""
    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    nodes = [
        helper.make_node("Identity", ["r_in"], ["y"]),
        helper.make_node("Add", ["offset_in", "t"], ["offset_out"]),
        helper.make_node("Reshape", ["x", "shape"], ["r_new"]),
    ]
    consts = [helper.make_tensor("t", i64, [], [T]),
              helper.make_tensor("shape", i64, [4], [b, 1, new_rows, 1])]
    g = helper.make_graph(
        nodes, "ring", [helper.make_tensor_value_info("x", f, [b, new_rows]),
                        helper.make_tensor_value_info("offset_in", i64, [b]),
                        helper.make_tensor_value_info(at_name, i64, [b, T]),
                        helper.make_tensor_value_info("r_in", f, [b, 1, C, 1])],
        [helper.make_tensor_value_info("y", f, [b, 1, C, 1]),
         helper.make_tensor_value_info("offset_out", i64, [b]),
         helper.make_tensor_value_info("r_new", f, [b, 1, new_rows, 1])], initializer=consts)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / f"ring_b{b}_{new_rows}_{at_name}.onnx"
    onnx.save(model, str(path))
    return Graph(path, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), {})


def test_a_ring_holds_the_last_positions_each_in_its_row(tmp_path):
    """Step n writes values 10n, 10n + 1 at positions 2n, 2n + 1: after 7 steps (14 positions)
    the 5 rows hold positions 9..13 at p mod 5, the window of them oldest first, and a ring
    that wrapped moves into another runner through the window and back."""
    runner = StepRunner(_graph(tmp_path), io_binding=False)
    seen = []
    for n in range(7):
        seen.append(runner(np.array([[10.0 * n, 10.0 * n + 1]], np.float32)))
    state = runner.state
    values = {2 * n + j: 10.0 * n + j for n in range(7) for j in range(T)}
    assert state["offset_in"].tolist() == [14]
    assert state["r_in"][0, 0, :, 0].tolist() == [values[p] for p in (10, 11, 12, 13, 9)]
    assert ring_window(state["r_in"], 14)[0, 0, :, 0].tolist() == [values[p] for p in range(9, 14)]
    # The ring as each step read it: the rows written before it, zeros where nothing was yet.
    assert seen[1][0, 0, :, 0].tolist() == [0, 1, 0, 0, 0]
    window = ring_window(state["r_in"], 14)
    assert np.array_equal(ring_window(window, 14, back=True), state["r_in"])


def test_a_bank_writes_each_slot_s_new_rows_into_its_own_ring(tmp_path):
    """Slots at different offsets in one call: each row's new values land at its own positions;
    an idle row and a row outside the call keep theirs."""
    bank = StepBank([_graph(tmp_path, b=3)], 4)
    bank.run({0: (np.array([[1.0, 2.0]], np.float32), {}), 2: (np.array([[3.0, 4.0]], np.float32), {})})
    bank.run({2: (np.array([[5.0, 6.0]], np.float32), {}), 3: (np.array([[7.0, 8.0]], np.float32), {})})
    ring = bank.state["r_in"][:, 0, :, 0]
    assert ring[0].tolist() == [1, 2, 0, 0, 0]
    assert ring[1].tolist() == [0, 0, 0, 0, 0]
    assert ring[2].tolist() == [3, 4, 5, 6, 0]
    assert ring[3].tolist() == [7, 8, 0, 0, 0]
    assert bank.state["offset_in"].tolist() == [2, 0, 4, 2]


@pytest.mark.parametrize("new_rows, at_name, why", [
    (T + 1, "ring_at", "cannot be written into"),  # new rows and ring_at disagree
    (T, "where", "not <name>_in/<name>_out pairs"),  # no ring_at: no rows to write
])
def test_a_ring_that_cannot_be_written_is_refused(tmp_path, new_rows, at_name, why):
    with pytest.raises(ModelFileError, match=why):
        step_io(_graph(tmp_path, new_rows=new_rows, at_name=at_name))


def test_a_ring_is_not_run_through_io_binding(tmp_path):
    with pytest.raises(ModelFileError, match="run it with io_binding off"):
        StepRunner(_graph(tmp_path), io_binding=True)
