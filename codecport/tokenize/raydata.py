"""The `ray` engine of `codec-run tokenize` (extra `[ray]`): Ray Data over the items, an actor
pool of ONNX Runtime sessions in `map_batches`, the result tables streamed back to the driver,
which writes them (output.py) as they come.

Why the driver writes: the shards are then renamed into place whole and resumable exactly as on
the local engine, the progress bar and the errors table see every row, and only OUT_DIR must be
reachable from the driver. Codes are small (about 1 kB a second of audio for DAC-44k, against
176 kB of 16-bit stereo PCM), so the stream back costs little. The audio is read by the actors:
on a real cluster the inputs must be on storage every node sees (NFS, a mounted bucket).

Facts from ray.md: `ray.init(address="local", num_cpus=...)` for a private cluster (passing
`num_cpus` while attaching raises); `compute=ActorPoolStrategy(size=n)`, not the deprecated
`concurrency=`; one CPU is left free beside the actors so that Ray's own tasks are not starved.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

from ..errors import CodecportError
from ..runtime.providers import cpu_cores
from .corpus import Item
from .worker import Worker

log = logging.getLogger(__name__)

# Set before ray is imported: no usage report, and (unless -v) none of Ray's start-up notes:
# the token-auth notice, Ray Data's, and the C++ core worker's note on constructor arguments.
QUIET_ENV = {"RAY_DATA_LOG_LEVEL": "ERROR"}


class RayWorker:
    """A `map_batches` actor: one `Worker` (its sessions built once, in `__init__`)."""

    def __init__(self, settings):
        self.worker = Worker(settings)

    def __call__(self, batch):
        return self.worker([Item(**row) for row in batch.to_pylist()])


def _ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not log.isEnabledFor(logging.INFO):
        for k, v in QUIET_ENV.items():
            os.environ.setdefault(k, v)
    try:
        import ray
        import ray.data
    except ImportError as e:
        raise CodecportError(f"the ray engine needs Ray Data ({e}); pip install 'codecport[ray]'") from e
    return ray


def check_reachable(address: str) -> None:
    """A `host:port` (or `ray://host:port`) that no one answers on is refused at once: ray.init
    retries it for minutes, printing its C++ logs meanwhile."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return  # "auto" and the like: Ray's to resolve
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except (OSError, OverflowError) as e:
        raise CodecportError(f"cannot reach the Ray cluster at {address} "
                             f"({getattr(e, 'strerror', None) or e}); "
                             "is its head node running? check --address / RAY_ADDRESS") from None


def run_ray(todo: list[Item], settings, address: str | None, workers: int | None, per_task: int,
            emit: Callable) -> None:
    """Run `todo` on `workers` actors of a Ray cluster (`address`, else `RAY_ADDRESS`, else a
    private local one), `per_task` files a batch, handing each result table to `emit`."""
    ray = _ray()
    address = address or os.environ.get("RAY_ADDRESS") or None
    gpu = settings.provider == "cuda"
    level = logging.INFO if log.isEnabledFor(logging.INFO) else logging.ERROR
    try:
        if address:
            ray.init(address=address, logging_level=level, log_to_driver=False)
            cpus = int(ray.cluster_resources().get("CPU", 1))
            workers = workers or max(1, cpus - 1)
        else:
            workers = workers or max(1, cpu_cores() if not gpu else 1)
            ray.init(address="local", num_cpus=workers + 1, include_dashboard=False,
                     logging_level=level, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise CodecportError(f"cannot start or reach the Ray cluster {address or '(local)'}: "
                             f"{str(e).splitlines()[0]}; check --address / RAY_ADDRESS") from e
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # the driver's bar counts files and hours
        blocks = math.ceil(len(todo) / per_task)
        actors = max(1, min(workers, blocks))
        ds = ray.data.from_items([asdict(item) for item in todo], override_num_blocks=blocks)
        ds = ds.map_batches(
            RayWorker, batch_size=per_task, batch_format="pyarrow",
            fn_constructor_kwargs={"settings": replace(settings, threads=1 if not gpu else settings.threads)},
            num_cpus=1, num_gpus=1 if gpu else 0, compute=ray.data.ActorPoolStrategy(size=actors))
        with _without_core_notes(level > logging.INFO):
            for table in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
                emit(table)
    except CodecportError:
        raise
    except Exception as e:
        cause = e
        while getattr(cause, "cause", None) is not None:
            cause = cause.cause
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[-1]
        raise CodecportError(f"the Ray job failed: {first}") from e
    finally:
        ray.shutdown()


# A line of Ray's C++ log, e.g. "[2026-12-01 16:51:25,203 E 1107 1107] core_worker.cc:2465: ...".
_CORE_LINE = re.compile(rb"^\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] \d+ \d+\] ")


@contextmanager
def _without_core_notes(active: bool) -> Iterator[None]:
    """The process's stderr (fd 2) less the lines of Ray's C++ core worker, which writes to it
    directly (every actor start notes that its constructor arguments are in the object store,
    ray#53727, which Ray Data's actor pools always are): they go to the log instead."""
    if not active:
        yield
        return
    saved, (read, write) = os.dup(2), os.pipe()
    os.dup2(write, 2)
    os.close(write)

    def forward() -> None:
        pending = b""
        while chunk := os.read(read, 1 << 16):
            pending += chunk
            *lines, pending = re.split(rb"(?<=[\r\n])", pending)
            if pending and not pending.startswith(b"["):  # a progress bar's redraw: now
                lines, pending = [*lines, pending], b""
            for line in lines:
                if _CORE_LINE.match(line):
                    log.debug("ray: %s", line.decode(errors="replace").rstrip())
                else:
                    os.write(saved, line)
        if pending:
            os.write(saved, pending)

    thread = threading.Thread(target=forward, daemon=True)
    thread.start()
    try:
        yield
    finally:
        os.dup2(saved, 2)  # closes the pipe's last write end: the thread sees the end and stops
        thread.join(timeout=5)
        os.close(saved)
        os.close(read)
