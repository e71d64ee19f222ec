"""Batched copies of a codec's encoders (`codec-export ... --batch B`), for corpus tokenizing.

A batched graph is the same torch module traced with batch dimension B (static, like every
other shape): `encoder_b8.onnx` beside `encoder.onnx`, every input with batch dimension B (a
graph that takes a `mask` beside its audio takes one mask a row). The runtime fills its rows with
clips or windows of any files and pads the last batch with copies of its first row. Nothing
couples the rows (convs, attention, masked statistics and the quantizer work row by row), and
that is checked here, not assumed: each row of the batched graph must give the codes of the
batch-1 graph on the same input, a silent row among them included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import onnx

from ..errors import ExportError
from ..runtime.folder import batched_name
from .graph import GraphSpec, Tensor, static_check, to_onnx
from .validate import check_codes, run, session

log = logging.getLogger(__name__)

MAX_BATCH = 256  # past this a batch of DAC windows is gigabytes of activations: no gain left


def batched(spec: GraphSpec, batch: int) -> GraphSpec:
    """`spec` with batch dimension `batch` on its input and output, named `<name>_b<batch>`."""
    def resize(t: Tensor) -> Tensor:
        return Tensor(t.name, (batch, *t.shape[1:]), t.dtype)

    return GraphSpec(batched_name(spec.name, batch), spec.module, [resize(t) for t in spec.inputs],
                     [resize(t) for t in spec.outputs], {**spec.metadata, "batch": str(batch)})


def check_batch(batch: int | None, build) -> None:
    """Refuse a `--batch` this export cannot honour, before any tracing."""
    if batch is None:
        return
    if not 1 < batch <= MAX_BATCH:
        raise ExportError(f"--batch must be between 2 and {MAX_BATCH}, got {batch}")
    if not build.plain:
        # A build is measured through the runtime graph by graph; its batched rows would
        # need their own row-by-row check after the rewrite, which is not built yet.
        raise ExportError("--batch writes fp32 graphs for cpu, cuda or dml; leave out --precision "
                          "and the mobile/coreml targets")


Rows = list[dict[str, np.ndarray]]  # a batch's inputs: one row's feeds (batch 1) each
CodesOf = Callable[[GraphSpec, np.ndarray, dict[str, np.ndarray]], np.ndarray]


def audio_rows(spec: GraphSpec, seed: int = 3) -> Rows:
    """A batch of random audio rows at different levels, the last one silent, for a graph with
    one input."""
    name = spec.inputs[0].name
    x = spec.random_inputs(seed)[0]
    x *= np.linspace(0.2, 1.5, len(x), dtype=np.float32)[:, None, None]
    x[-1] = 0.0
    return [{name: row[None]} for row in x]


def masked_rows(spec: GraphSpec, valid: Callable[[int, int], int], seed: int = 3) -> Rows:
    """A batch of random rows for a graph whose last input is a clip's `mask` `[B, 1, frames]`:
    the audio at different levels, the last row silent, row `i` masked to its first
    `valid(i, frames)` frames (a clip of its own length)."""
    rng = np.random.default_rng(seed)
    batch, frames = spec.inputs[-1].shape[0], spec.inputs[-1].shape[-1]
    rows = []
    for i in range(batch):
        row = {t.name: rng.standard_normal((1, *t.shape[1:])).astype(np.float32) for t in spec.inputs[:-1]}
        row["audio"] *= np.float32(0.3 * (i + 1) / batch if i < batch - 1 else 0.0)
        row["mask"] = np.zeros((1, 1, frames), np.float32)
        row["mask"][..., :valid(i, frames)] = 1.0
        rows.append(row)
    return rows


def validate_batched(spec: GraphSpec, model: onnx.ModelProto | bytes, single: onnx.ModelProto | bytes,
                     codes_of: Callable[[np.ndarray, dict[str, np.ndarray]], np.ndarray],
                     rows: Rows) -> dict[str, float]:
    """Each row of batched `model` against the batch-1 graph `single` on `rows`: identical codes
    (`codes_of(y, row)` maps an encoder output `[1, ...]` on `row` to codes `[1, K, frames]`)."""
    got = run(model, {k: np.concatenate([r[k] for r in rows]) for k in rows[0]})[0]
    err = 0.0
    one = session(single)
    for i, row in enumerate(rows):
        want = one.run(None, row)[0]
        check_codes(f"{spec.name} row {i}", codes_of(got[i:i + 1], row), codes_of(want, row))
        if want.dtype.kind == "f":
            err = max(err, float(np.max(np.abs(got[i:i + 1].astype(np.float64) - want))))
    return {"rows_codes_identical": 1.0, "rows_max_abs_err": err}


def export_batched(specs: list[GraphSpec], models: dict[str, onnx.ModelProto], batch: int | None,
                   names: tuple[str, ...], codes_of: CodesOf, report: dict, build,
                   rows_of: Callable[[GraphSpec], Rows] = audio_rows) -> None:
    """Add `<name>_b<batch>` for each graph of `names` in `models`, each validated row by row
    against its batch-1 graph on `rows_of(batched spec)` (`codes_of(spec, y, row)`: the codes of
    output `y` on `row`); the validation goes into `report["validation"]`."""
    if batch is None:
        return
    check_batch(batch, build)
    for spec in [s for s in specs if s.name in names and s.name in models]:
        t0 = time.perf_counter()
        bspec = batched(spec, batch)
        model = to_onnx(bspec)
        serialized = model.SerializeToString()  # once for the checks and the session
        static_check(model, bspec, serialized)
        report["validation"][bspec.name] = validate_batched(
            bspec, serialized, models[spec.name], lambda y, row, s=spec: codes_of(s, y, row), rows_of(bspec))
        models[bspec.name] = model
        log.info("%s: exported, checked and validated row by row in %.1f s", bspec.name,
                 time.perf_counter() - t0)
