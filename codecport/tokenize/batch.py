"""Windows of many clips through one graph call: the batched encoders of `codec-export --batch`.

A codec describes how it would encode a clip as a `WindowPlan` (runtime/plan.py): the
independent windows it would put through one encoder graph, and how the codes of those windows
make the clip's `Codes`. `Batcher` takes the windows of many plans, fills the rows of the
batched copy of that graph with them (B windows a call, from any clips; a last call padded with
copies of its first window, or run row by row when it is less than half full) and finishes each
clip when its last window is done.
The codes are the same either way: each row of a batched graph is checked against the batch-1
graph when it is exported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import CodecportError, ModelFileError
from ..runtime.codes import Codes
from ..runtime.folder import batched_name
from ..runtime.plan import WindowPlan, call_input, stack_calls


@dataclass
class _Clip:
    key: object
    plan: WindowPlan
    codes: list = field(default_factory=list)
    waiting: int = 0  # windows handed to the batcher whose codes have not come back
    read: bool = False  # every window has been handed over
    failed: bool = False  # its error was returned: nothing more of it runs


class Batcher:
    """Encodes the windows of many clips `batch` at a time.

    `add(key, plan)` reads the plan's windows into the queue of its graph and runs every full
    batch; `flush()` runs what is left: padded (`stack_calls`) when it fills half the batch or
    more, else row by row through the batch-1 graph. Both return `(key, Codes)` for each clip whose
    codes are complete, or `(key, error)` for a clip whose audio failed while it was read.
    """

    def __init__(self, codec, batch: int = 1):
        self.codec, self.batch = codec, batch
        self._queues: dict[str, list[tuple[_Clip, int, np.ndarray]]] = {}

    def graph_for(self, name: str) -> str:
        """The graph that runs `name`'s windows: its batched copy, or itself at batch 1."""
        if self.batch == 1:
            return name
        if self.batch not in self.codec.batches.get(name, []):
            raise ModelFileError(f"{self.codec.dir} has no {batched_name(name, self.batch)}.onnx; "
                                 f"export with codec-export {self.codec.name} --batch {self.batch}, "
                                 "or tokenize with the --batch it was exported with")
        return batched_name(name, self.batch)

    def check(self) -> None:
        """Refuse now, not at the first file, a batch the folder has no graphs for."""
        for name in self.codec.batchable:
            if name in self.codec.present:
                self.graph_for(name)

    def add(self, key, plan: WindowPlan) -> list[tuple[object, Codes | Exception]]:
        clip, done = _Clip(key, plan), []
        queue = self._queues.setdefault(plan.graph, [])
        try:
            for window in plan.windows:
                queue.append((clip, len(clip.codes), window))
                clip.codes.append(None)
                clip.waiting += 1
                if len(queue) >= self.batch:
                    done += self._run(plan.graph)
                if clip.failed:  # its error is in `done` already
                    return done
        except CodecportError as e:  # the audio failed part way: drop what it queued
            return [*done, *self._fail([clip], e)]
        clip.read = True
        return done + self._finished(clip)

    def flush(self) -> list[tuple[object, Codes | Exception]]:
        done = []
        for name in list(self._queues):
            while self._queues[name]:
                done += self._run(name)
        return done

    def _run(self, name: str) -> list[tuple[object, Codes | Exception]]:
        queue = self._queues[name]
        rows = queue[:self.batch]
        del queue[:self.batch]
        try:
            if 2 * len(rows) < self.batch:
                # A last batch less than half full: its rows through the batch-1 graph cost less
                # than a padded call (the codes are the same, checked at export).
                single = self.codec.graph(name)
                ys = [single(call_input(window))[0] for _, _, window in rows]
            else:
                x = stack_calls([call_input(window) for _, _, window in rows], self.batch)
                ys = self.codec.graph(self.graph_for(name))(x)
        except Exception as e:  # noqa: BLE001 (the runtime failed, e.g. out of GPU memory: every clip in the call fails)
            return self._fail(list({id(c): c for c, _, _ in rows}.values()), e)
        done = []
        for (clip, index, _), y in zip(rows, ys):
            clip.codes[index] = clip.plan.codes_of(self.codec, y, index)
            clip.waiting -= 1
            done += self._finished(clip)
        return done

    def _fail(self, clips: list[_Clip], error: Exception) -> list[tuple[object, Exception]]:
        """Each of `clips` failed with `error`: its windows still queued are dropped."""
        for clip in clips:
            clip.failed = True
        for queue in self._queues.values():
            queue[:] = [q for q in queue if not q[0].failed]
        return [(clip.key, error) for clip in clips]

    @staticmethod
    def _finished(clip: _Clip) -> list[tuple[object, Codes | Exception]]:
        if not clip.read or clip.waiting or clip.failed:
            return []
        try:
            return [(clip.key, clip.plan.finish(clip.codes))]
        except CodecportError as e:
            return [(clip.key, e)]

