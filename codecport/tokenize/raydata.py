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
from collections.abc import Callable
from dataclasses import asdict, replace

from ..cluster import import_ray, without_core_notes
from ..errors import CodecportError
from ..runtime.providers import cpu_cores
from .corpus import Item
from .worker import Worker

log = logging.getLogger(__name__)

class RayWorker:
    """A `map_batches` actor: one `Worker` (its sessions built once, in `__init__`)."""

    def __init__(self, settings):
        self.worker = Worker(settings)

    def __call__(self, batch):
        return self.worker([Item(**row) for row in batch.to_pylist()])


def _ray():
    ray = import_ray(log, "the ray engine needs Ray Data", "ray")
    try:
        import ray.data  # noqa: F401
    except ImportError as e:
        raise CodecportError(f"the ray engine needs Ray Data ({e}); pip install 'codecport[ray]'") from e
    return ray


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
        with without_core_notes(level > logging.INFO):
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
