"""`codec-run tokenize`: a corpus to codec tokens in a Parquet dataset, resumable, on a pool of
worker processes (`local`) or a Ray cluster (`ray`, tokenize_ray.py).

Each worker holds its own ONNX Runtime sessions on its share of the cores and encodes batches of
inputs (`Worker`): windows of many files fill the batched graphs when the folder has them
(batch.py). The driver lists the inputs (corpus.py), leaves out what OUT_DIR already holds, and
writes the results as they come (`OutputDir`), so a killed job loses at most the rows it had not
written yet and a rerun does only the rest. The codes of every row are those
`codec-run encode FILE -o x.npy` writes.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import CodecportError
from .batch import Batcher
from .corpus import Item, ParquetRows, read_inputs
from .output import OutputDir, result_table
from .providers import cpu_cores

log = logging.getLogger(__name__)

ENGINES = ("local", "ray")
MAX_ATTEMPTS = 3  # a task whose worker died this often marks its files failed instead


@dataclass(frozen=True)
class Settings:
    """What every worker needs to build its codec (plain values: they are pickled to workers)."""

    model_dir: str
    provider: str = "cpu"
    fallback: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    batch: int = 1
    codebooks: int | None = None
    threads: int = 1

    def open(self):
        from .. import load

        options = {**dict(self.options), "threads": str(self.threads), "windows": "1"}
        return load(self.model_dir, self.provider, self.fallback, options)


class Worker:
    """One worker's codec: `worker(items)` -> the result table of those items (see output.py),
    a failed input as a row with its `error`."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.codec = settings.open()
        self.k = self.codec.codebooks(settings.codebooks)
        self.reader = ParquetRows()
        self.batcher = Batcher(self.codec, settings.batch)  # its graphs checked by the driver

    def __call__(self, items: list[Item]):
        results: dict[str, object] = {}
        for item in items:
            try:
                source = item.source(self.reader)
                plan = self.codec.window_plan(source, self.k)
                if plan is None:  # needs the step graphs: one clip at a time
                    results[item.id] = self.codec.encode_source(source, self.k, None, False)
                else:
                    results.update((it.id, r) for it, r in self.batcher.add(item, plan))
            except Exception as e:  # noqa: BLE001 (one bad input is a row of the errors table)
                results[item.id] = e
        results.update((it.id, r) for it, r in self.batcher.flush())
        return result_table(self.codec, items, results)


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
    codec = base.open()
    if batch is None:  # the folder's batched graphs, where it has them
        batch = max([b for sizes in codec.batches.values() for b in sizes], default=1)
    settings = replace(base, batch=batch, codebooks=codec.codebooks(codebooks))
    Batcher(codec, batch).check()
    out = OutputDir(Path(out_dir), codec, settings.codebooks)
    with out.lock():
        items = read_inputs(inputs)
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
            bar.set_postfix_str(f"{hours:.2f} h audio, {summary.audio_s / max(1e-9, time.perf_counter() - t0):.0f} h/h")

        with bar:
            try:
                if todo and engine == "local":
                    run_local(todo, settings, workers, per_task, emit)
                elif todo:
                    from .tokenize_ray import run_ray

                    run_ray(todo, settings, address, workers, per_task, emit)
            finally:  # interrupted or failed, the rows that came back are kept
                out.flush()
        out.finish()
    summary.wall_s = time.perf_counter() - t0
    log.info("%s", summary.line())
    return summary


# ---- the local engine: a pool of worker processes ---------------------------------------------
_worker: Worker | None = None


def _init_worker(settings: Settings, parent: int) -> None:
    global _worker
    _worker = Worker(settings)
    # A worker whose driver was killed has nobody to answer: it goes too, instead of idling on.
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _work(items: list[Item]):
    return _worker(items)


def run_local(todo: list[Item], settings: Settings, workers: int | None, per_task: int,
              emit: Callable) -> None:
    """Run `todo` on `workers` processes (default: one per core, each on its share of the
    cores), `per_task` files a task, handing each result table to `emit`. A worker that dies
    (killed, out of memory) is replaced and its tasks run again, up to `MAX_ATTEMPTS` times."""
    cores = cpu_cores()
    workers = workers or (cores if settings.provider == "cpu" else 1)
    threads = max(1, cores // workers)
    settings = replace(settings, threads=threads)
    tasks = deque((0, todo[i:i + per_task]) for i in range(0, len(todo), per_task))
    context = multiprocessing.get_context("spawn")  # ORT's threads do not survive a fork
    while tasks:
        pool = ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context, initializer=_init_worker,
                                   initargs=(settings, os.getpid()))
        running: dict = {}
        try:
            while tasks or running:
                while tasks and len(running) < 2 * workers:
                    attempt, task = tasks[0]  # taken off only once submitted: a broken pool refuses
                    running[pool.submit(_work, task)] = (attempt, task)
                    tasks.popleft()
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in finished:
                    result = f.result()  # a worker's CodecportError (its model) ends the job
                    running.pop(f)
                    emit(result)
        except BrokenProcessPool:
            log.warning("a tokenize worker died (killed, or out of memory); its tasks run again")
            for f, (attempt, task) in running.items():
                if f.done() and not f.cancelled() and f.exception() is None:
                    emit(f.result())  # finished before the pool broke: its rows are good
                elif attempt + 1 < MAX_ATTEMPTS:
                    tasks.append((attempt + 1, task))
                else:
                    emit(_died(settings, task))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _died(settings: Settings, task: list[Item]):
    """The result table of a task whose worker died every time it ran."""
    codec = settings.open()
    why = CodecportError(f"the worker died {MAX_ATTEMPTS} times on the batch holding this file "
                         "(out of memory, or killed); tokenize it on its own to see which")
    return result_table(codec, task, {item.id: why for item in task})
