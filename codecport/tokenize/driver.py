"""`codec-run tokenize`: a corpus to codec tokens in a Parquet dataset, resumable, on a pool of
worker processes (`local`, local.py) or a Ray cluster (`ray`, raydata.py).

Each worker holds its own ONNX Runtime sessions on its share of the cores and encodes batches of
inputs (worker.py): windows of many files fill the batched graphs when the folder has them
(batch.py). The driver lists the inputs (corpus.py), leaves out what OUT_DIR already holds, and
writes the results as they come (`OutputDir`), so a killed job loses at most the rows it had not
written yet and a rerun does only the rest. The codes of every row are those
`codec-run encode FILE -o x.npy` writes.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import CodecportError
from ..runtime.providers import cpu_cores
from .batch import Batcher
from .corpus import read_inputs
from .output import OutputDir
from .worker import Settings

log = logging.getLogger(__name__)

ENGINES = ("local", "ray")


@dataclass
class Summary:
    """What a tokenize run did."""

    files: int = 0  # inputs listed
    skipped: int = 0  # already in OUT_DIR
    done: int = 0  # tokenized by this run
    failed: int = 0  # in the errors table
    audio_s: float = 0.0  # seconds of audio tokenized by this run
    wall_s: float = 0.0
    errors: list[tuple[str, str]] = field(default_factory=list)  # (id, error), the first few

    @property
    def rate(self) -> float:
        """Audio hours per wall-clock hour."""
        return self.audio_s / self.wall_s if self.wall_s else 0.0

    def line(self) -> str:
        return (f"{self.done} files tokenized ({self.audio_s / 3600:.2f} h of audio), {self.failed} "
                f"failed, {self.skipped} already done, in {self.wall_s:.1f} s: {self.rate:.1f} "
                "audio-hours per hour")


def tokenize(inputs: list[str], model_dir: str | Path, out_dir: str | Path, *, engine: str = "local",
             address: str | None = None, workers: int | None = None, batch: int | None = None,
             codebooks: int | None = None, provider: str = "cpu", fallback: str | None = None,
             options: dict[str, str] | None = None, shard_rows: int = 1000, flush_s: float = 60.0,
             files_per_task: int | None = None, progress: bool = False) -> Summary:
    """Tokenize `inputs` (see corpus.py) with the export in `model_dir` into the Parquet dataset
    `out_dir`; returns the `Summary`. Rows are written `shard_rows` at a time, or every
    `flush_s` seconds when they come slower."""
    t0 = time.perf_counter()
    if engine not in ENGINES:
        raise CodecportError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    base = Settings(str(Path(model_dir).resolve()), provider, fallback, tuple((options or {}).items()))
    codec = base.facts()
    if batch is None:  # the folder's batched graphs, where it has them
        batch = max([b for sizes in codec.batches.values() for b in sizes], default=1)
    settings = replace(base, batch=batch, codebooks=codec.codebooks(codebooks))
    Batcher(codec, batch).check()
    if engine == "ray" and (address or os.environ.get("RAY_ADDRESS")):  # before the folder is claimed
        from ..cluster import check_reachable

        check_reachable(address or os.environ["RAY_ADDRESS"])
    out = OutputDir(Path(out_dir), codec, settings.codebooks)
    items = read_inputs(inputs)  # a wrong input path is refused before the folder is made
    with out.lock():
        todo = out.todo(items)
        summary = Summary(files=len(items), skipped=len(items) - len(todo))
        # Tasks of a few batches' worth of files, but at least two a worker, so that a small
        # job keeps every worker busy to the end.
        share = math.ceil(len(todo) / (2 * (workers or cpu_cores())))
        per_task = files_per_task or max(1, min(max(8, 2 * batch), share))
        bar = tqdm(total=len(todo), unit="file", desc="tokenize", disable=None if progress else True)
        last = [time.monotonic()]

        def emit(table) -> None:
            ok, errors = out.add(table)
            summary.done += ok.num_rows
            summary.failed += len(errors)
            summary.errors.extend(errors[:max(0, 20 - len(summary.errors))])
            summary.audio_s += float(np.sum(ok.column("duration_s").to_numpy())) if ok.num_rows else 0.0
            if out.buffered >= shard_rows or (out.buffered and time.monotonic() - last[0] > flush_s):
                out.flush()
                last[0] = time.monotonic()
            bar.update(table.num_rows)
            hours = summary.audio_s / 3600
            bar.set_postfix_str(f"{hours:.2f} h audio, "
                                f"{summary.audio_s / max(1e-9, time.perf_counter() - t0):.0f} h/h")

        with bar:
            try:
                if todo and engine == "local":
                    from .local import run_local

                    run_local(todo, settings, workers, per_task, emit)
                elif todo:
                    from .raydata import run_ray

                    run_ray(todo, settings, address, workers, per_task, emit)
            finally:  # interrupted or failed, the rows that came back are kept, and the errors
                out.flush()  # table is this run's (the last one's inputs are all done again)
                out.finish()
    summary.wall_s = time.perf_counter() - t0
    log.info("%s", summary.line())
    return summary


