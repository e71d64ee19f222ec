"""One tokenize worker: its codec (ONNX Runtime sessions on its share of the cores) and how it
turns a list of inputs into a result table. The local engine runs it in a process (local.py),
the Ray engine in an actor (raydata.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .batch import Batcher
from .corpus import Item, ParquetRows
from .output import result_table


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
        """The codec, its sessions on this worker's provider and share of the cores."""
        from ..registry import codec_of_folder

        options = {**dict(self.options), "threads": str(self.threads), "parallel": "1"}
        return codec_of_folder(self.model_dir).runtime(self.model_dir, self.provider, self.fallback, options)

    def facts(self):
        """The codec's facts from the folder's manifest, no session opened: what the driver
        needs, on a machine that may lack the workers' provider (a Ray head node without a GPU)."""
        from ..registry import codec_of_folder

        return codec_of_folder(self.model_dir).runtime(self.model_dir, sessions=False)


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
