"""The `local` engine of `codec-run tokenize`: a pool of worker processes on this machine."""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from ..errors import CodecportError
from ..runtime.providers import cpu_cores
from .corpus import Item
from .output import result_table
from .worker import Settings, Worker

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # a task whose worker died this often marks its files failed instead
_worker: Worker | CodecportError | None = None


def _init_worker(settings: Settings, parent: int) -> None:
    global _worker
    # A worker that cannot open the model (a provider this onnxruntime lacks, a damaged file) hands the
    # cause to its first task: raised from an initializer, it would break the pool and read as a
    # worker killed, over and over, and the job would end blaming memory.
    try:
        _worker = Worker(settings)
    except CodecportError as e:
        _worker = e
    except Exception as e:  # noqa: BLE001 (ONNX Runtime's own errors: the job ends on them too)
        _worker = CodecportError(f"a tokenize worker could not open the model: {type(e).__name__}: {e}")
    # A worker whose driver was killed has nobody to answer: it goes too, instead of idling on.
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _work(items: list[Item], spool: str) -> str | CodecportError:
    """The result table of `items`, written to a file in `spool`: its path. A result sent back
    through the pool's pipe in pieces, by a worker killed between them, would leave the pool's
    reader waiting for the rest of it forever (every live worker holds the pipe open), and the
    job would hang instead of replacing the worker; a path is one short atomic write."""
    if isinstance(_worker, CodecportError):
        # Returned, not raised: a raised exception goes back with its traceback, which may take
        # the pipe several pieces again; the error itself is a short message.
        return _worker
    table = _worker(items)
    path = os.path.join(spool, uuid.uuid4().hex)
    try:
        with pa.OSFile(path + ".part", "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        os.replace(path + ".part", path)
    except OSError as e:
        return _no_room(spool, e)  # returned, as the error above
    return path


def _no_room(spool: str, e: OSError) -> CodecportError:
    return CodecportError(f"tokenize could not write its workers' results under {spool}: "
                          f"{e.strerror or e}; free space there or set TMPDIR to a folder with room")


SPOOL = "codecport-tokenize-"  # + the driver's pid: the spools of drivers killed before their cleanup


def _new_spool() -> str:
    """A folder of this job's for its workers' results, after removing those of jobs whose driver
    is gone (killed, so it never removed its own)."""
    root = tempfile.gettempdir()
    for old in Path(root).glob(SPOOL + "*"):
        pid = old.name[len(SPOOL):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    try:
        return tempfile.mkdtemp(prefix=f"{SPOOL}{os.getpid()}-")
    except OSError as e:
        raise _no_room(root, e) from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: alive, another user's
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _take(path: str | CodecportError):
    """The result table a worker wrote, its file gone; a worker's CodecportError (its model, its
    provider), which ends the job, raised."""
    if isinstance(path, CodecportError):
        raise path
    with pa.OSFile(path, "rb") as source:
        table = pa.ipc.open_file(source).read_all()
    os.remove(path)
    return table


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
    spool = _new_spool()
    try:
        _run(tasks, settings, workers, context, spool, emit)
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def _run(tasks: deque, settings: Settings, workers: int, context, spool: str, emit: Callable) -> None:
    while tasks:
        pool = ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context, initializer=_init_worker,
                                   initargs=(settings, os.getpid()))
        running: dict = {}
        try:
            while tasks or running:
                while tasks and len(running) < 2 * workers:
                    attempt, task = tasks[0]  # taken off only once submitted: a broken pool refuses
                    running[pool.submit(_work, task, spool)] = (attempt, task)
                    tasks.popleft()
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in finished:
                    path = f.result()
                    running.pop(f)
                    emit(_take(path))
        except BrokenProcessPool:
            log.warning("a tokenize worker died (killed, or out of memory); its tasks run again")
            for f, (attempt, task) in running.items():
                if f.done() and not f.cancelled() and f.exception() is None:
                    emit(_take(f.result()))  # finished before the pool broke: its rows are good
                elif attempt + 1 < MAX_ATTEMPTS:
                    tasks.append((attempt + 1, task))
                else:
                    emit(_died(settings, task))
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _died(settings: Settings, task: list[Item]):
    """The result table of a task whose worker died every time it ran."""
    codec = settings.facts()
    why = CodecportError(f"the worker died {MAX_ATTEMPTS} times on the batch holding this file "
                         "(out of memory, or killed); tokenize it on its own to see which")
    return result_table(codec, task, {item.id: why for item in task})
