"""An export folder: its graphs, opened lazily on one provider, checked against each other.

Every graph opened is checked against the first: the same codec and the same `shared` facts
(export id, rates, quantizer...), the role and mode its file name promises, and input/output
shapes that agree with its metadata. A graph is read from `{name}.onnx`, or from `{name}.ort`
where there is no `.onnx`. Graphs are opened under a lock: threads of a server may ask for the
same graph at once, and each must get the one session.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

from ..errors import ModelFileError, ProviderError
from .graph import INT_RANGES, Graph, current_names, graph_file, open_graph, read_graph
from .providers import codecport_option, cpu_cores, intra_op_threads, parallel_windows, resolve_provider

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few kB; a bigger one is not ours
_BATCHED = re.compile(r"^(?P<base>.+)_b(?P<batch>[1-9][0-9]{0,3})$")
_SIZED = re.compile(r"^(?P<base>.+)_f(?P<frames>[1-9][0-9]{0,8})$")
_SLOTTED = re.compile(r"^(?P<base>.+_slots)_s(?P<slots>[1-9][0-9]{0,3})$")


def batched_name(name: str, batch: int) -> str:
    """File stem of graph `name` exported with batch dimension `batch` (`encoder_b8`)."""
    return f"{name}_b{batch}"


def split_batched(stem: str) -> tuple[str, int]:
    """(graph name, batch) of a file stem: `encoder_b8` -> ("encoder", 8), `encoder` -> ("encoder", 1)."""
    m = _BATCHED.match(stem)
    return (m["base"], int(m["batch"])) if m else (stem, 1)


def sized_name(name: str, frames: int) -> str:
    """File stem of graph `name` exported again for `frames` frames, a shorter bucket (`encoder_f50`)."""
    return f"{name}_f{frames}"


def split_sized(stem: str) -> tuple[str, int | None]:
    """(graph name, frames) of a file stem: `encoder_f50` -> ("encoder", 50), `encoder` ->
    ("encoder", None)."""
    m = _SIZED.match(stem)
    return (m["base"], int(m["frames"])) if m else (stem, None)


def slot_ladder(top: int) -> list[int]:
    """Slots a call of each graph `codec-export --slots top` writes: every power of two from 2
    below `top`, and `top`. A call of b slots costs about b rows whatever few are ready, so a
    server steps k ready slots through the smallest graph that holds them."""
    return [*(1 << i for i in range(1, top.bit_length()) if 1 << i < top), top]


def slots_name(name: str, slots: int, top: int) -> str:
    """File stem of slot graph `name` (`encoder_slots`) for `slots` slots a call, in a ladder up to
    `top`: the largest keeps the plain name (what folders of one slot graph hold), the others
    `encoder_slots_s4`."""
    return name if slots == top else ladder_name(name, slots)


def ladder_name(name: str, slots: int) -> str:
    """File stem of slot graph `name`'s smaller copy for `slots` slots a call (`encoder_slots_s4`)."""
    return f"{name}_s{slots}"


def split_slots(stem: str) -> tuple[str, int | None]:
    """(graph name, slots) of a file stem: `encoder_slots_s4` -> ("encoder_slots", 4), others ->
    (stem, None)."""
    m = _SLOTTED.match(stem)
    return (m["base"], int(m["slots"])) if m else (stem, None)


def read_manifest(folder: Path) -> dict | None:
    """manifest.json of an export folder as a dict (keys of older versions under their current
    names); None when there is none. A manifest that is there but unreadable is a
    `ModelFileError`: it is what says which codec the folder is."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"{path.stat().st_size} bytes")
        manifest = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ModelFileError(f"{path}: not a readable manifest ({type(e).__name__}); "
                             "re-run codec-export") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("codec"), str):
        raise ModelFileError(f"{path}: not a codecport manifest (no codec named); re-run codec-export")
    return current_names(manifest)


class GraphFolder:
    """The graphs of one export folder, opened lazily on one provider.

    Subclasses declare `name`/`label` (the codec), `graphs` (file stem -> (role, mode)),
    `old_names` (file stems older versions wrote for a graph), `sliding` (graphs run over long
    signals one window at a time; `map_windows` runs `parallel` of those calls at once, each
    session on its share of the cores), `batchable` (graphs `codec-export --batch B` also
    writes with batch dimension B, as `<name>_b<B>`; `batches` says which the folder holds) and
    `sized` (fixed-length graphs an export may also write for fewer frames, as `<name>_f<F>`:
    `sizes` says which the folder holds; they are in `present`). A slot graph (mode `slots`)
    may come with smaller copies, `<name>_s<B>` (a ladder): `ladders` says which B the folder
    holds; `slot_graphs` opens them all.

    `options` are the provider's (see `provider_options`) plus `CODECPORT_OPTIONS`, e.g.
    `{"io_binding": "0"}` to stream through numpy state instead of IO binding.
    """

    name = ""  # the codec: metadata "codec", registry name
    label = ""  # the codec's name in messages
    graphs: ClassVar[dict[str, tuple[str, str]]] = {}
    old_names: ClassVar[dict[str, str]] = {}
    sliding: tuple[str, ...] = ()
    batchable: tuple[str, ...] = ()
    sized: tuple[str, ...] = ()
    shared: tuple[str, ...] = ("codec", "export_id", "preset", "sample_rate", "frame_size",
                               "weights_sha256", "quantizer", "n_codebooks", "codebook_size")

    def __init__(self, model_dir: str | Path, provider: str = "cpu", fallback: str | None = None,
                 options: dict[str, str] | None = None, sessions: bool = True):
        """`sessions=False` reads the folder's facts from its manifest alone (or, without one,
        its first graph's metadata): no provider is resolved and no session opened (a driver that
        hands the folder to workers elsewhere, `codec-run info` with `read_graphs`)."""
        self.dir = Path(model_dir)
        self.options = dict(options or {})
        self.io_binding = codecport_option("io_binding", self.options)
        if not self.dir.is_dir():
            raise ModelFileError(f"{self.dir}: no such model folder; run codec-export {self.name} "
                                 f"-o {self.dir}")
        self.files = {}
        for g in self.graphs:
            path = graph_file(self.dir, g)
            if path is None and g in self.old_names:
                path = graph_file(self.dir, self.old_names[g])
            if path is not None:
                self.files[g] = path
        self.present = list(self.files)
        self.batches: dict[str, list[int]] = {}  # graph -> batch sizes of its batched copies
        for g in self.batchable:
            for p in sorted(self.dir.glob(f"{g}_b*.onnx")) + sorted(self.dir.glob(f"{g}_b*.ort")):
                base, b = split_batched(p.stem)
                if base == g and b > 1 and p.stem not in self.files:
                    self.files[p.stem] = p
                    self.batches.setdefault(g, []).append(b)
            self.batches.get(g, []).sort()
        self.sizes: dict[str, list[int]] = {}  # graph -> frames of its shorter copies
        for g in self.sized:
            for p in sorted(self.dir.glob(f"{g}_f*.onnx")) + sorted(self.dir.glob(f"{g}_f*.ort")):
                base, frames = split_sized(p.stem)
                if base == g and p.stem not in self.files:
                    self.files[p.stem] = p
                    self.present.append(p.stem)
                    self.sizes.setdefault(g, []).append(frames)
            self.sizes.get(g, []).sort()
        self.ladders: dict[str, list[int]] = {}  # slot graph -> slots a call of each of its copies
        for g, (_, mode) in self.graphs.items():
            if mode != "slots" or g not in self.files:
                continue
            for p in sorted(self.dir.glob(f"{g}_s*.onnx")) + sorted(self.dir.glob(f"{g}_s*.ort")):
                base, b = split_slots(p.stem)
                if base == g and p.stem not in self.files:
                    self.files[p.stem] = p
                    self.ladders.setdefault(g, []).append(b)
        if not self.present:
            raise ModelFileError(f"{self.dir}: holds no {self.label} graphs; run codec-export "
                                 f"{self.name} -o {self.dir}")
        manifest = read_manifest(self.dir)
        self._manifest_id = None if manifest is None else str(manifest.get("export_id"))
        if manifest is not None and manifest["codec"] != self.name:
            raise ModelFileError(f"{self.dir / MANIFEST} is for {manifest['codec']}, not "
                                 f"{self.name}; re-export the folder")
        self._graphs: dict[str, Graph] = {}
        self._lock = threading.Lock()
        self.sessions = sessions
        if not sessions:
            self.provider, self.parallel, self.threads = None, 1, None
            # The manifest holds every shared metadata value: read through a Graph's checks (a
            # folder without one, from its first graph's metadata, read without a session).
            meta = {k: str(v) for k, v in (manifest or {}).items() if isinstance(v, (str, int, float))}
            self.first = read_graph(self.files[self.present[0]], io=False) if manifest is None \
                else Graph(self.dir / MANIFEST, None, meta)
        else:
            self.provider = resolve_provider(provider, fallback)
            self.parallel = parallel_windows(self.provider, self.options)
            self.threads = intra_op_threads(self.options)
            try:
                self.first = self.graph(self.present[0])
            except ProviderError as e:
                # A provider that onnxruntime lists can still fail to start (CUDA libraries missing).
                if fallback is None or self.provider == resolve_provider(fallback):
                    raise
                log.warning("%s; falling back to %s", e, fallback)
                self.provider = resolve_provider(fallback)
                self.parallel = parallel_windows(self.provider, self.options)
                self.first = self.graph(self.present[0])
        self.meta = self.first.meta

    def missing(self, name: str) -> str:
        """What to do when `name`.onnx/.ort is absent."""
        return f"re-run codec-export {self.name}"

    def check_graph(self, name: str, g: Graph) -> None:
        """Codec-specific checks of a graph as it is opened: input/output shapes against its
        metadata. `ModelFileError` when they disagree."""

    def graph(self, name: str) -> Graph:
        """Graph `name`, opened on first use (once, whatever the threads asking) and checked."""
        g = self._graphs.get(name)
        if g is None:
            with self._lock:
                g = self._graphs.get(name) or self._open(name)
        return g

    def _open(self, name: str) -> Graph:
        if not self.sessions:
            raise ModelFileError(f"{self.dir} was opened for its facts only (no sessions); load it to run it")
        if name not in self.files:
            raise ModelFileError(f"{self.dir} has no {name}.onnx (or {name}.ort); "
                                 f"{self.missing(name)}")
        threads = self.threads
        if threads is None and name in self.sliding and self.parallel > 1 and \
                self.provider == "CPUExecutionProvider":
            threads = max(1, cpu_cores() // self.parallel)
        g = open_graph(self.files[name], self.provider, self.options, threads)
        self._check(name, g, next(iter(self._graphs.values()), None))
        self._graphs[name] = g
        return g

    def read_graphs(self, paths: list[Path]) -> list[Graph]:
        """Graph files of this folder read for their facts alone (`read_graph`: no session), each
        checked as `graph` checks a graph it opens (against the first of them): what
        `codec-run info` lists. A file the codec has no graph of that name for is checked as
        one of the folder's (codec, export, shared facts) but not for a role."""
        names = {p: n for n, p in self.files.items()}
        graphs: list[Graph] = []
        for path in paths:
            g = read_graph(path)
            self._check(names.get(path), g, graphs[0] if graphs else None)
            graphs.append(g)
        return graphs

    def _check(self, name: str | None, g: Graph, ref: Graph | None) -> None:
        """`ModelFileError` unless graph `name`, `g`, belongs with `ref` (None: it is the first)
        and the manifest, and is what its file name says (`check_graph`'s checks included)."""
        for key in self.shared:  # a damaged value named as such, not as a mismatch with `ref`
            if key in INT_RANGES and key in g.meta:
                g.ints(key) if "," in g.meta[key] else g.int(key)  # some are lists (vq_strides)
        if g.meta.get("codec") != self.name:
            raise ModelFileError(f"{g.path}: holds a {g.meta.get('codec')} model, not "
                                 f"{self.name}; use a {self.name} export")
        if self._manifest_id not in (None, g.meta.get("export_id")):
            raise ModelFileError(f"{g.path} does not belong with {self.dir}/manifest.json "
                                 f"(export_id {g.meta.get('export_id')} vs {self._manifest_id}); "
                                 "re-export the folder")
        if ref is not None:
            bad = [k for k in self.shared if g.meta.get(k) != ref.meta.get(k)]
            if bad:
                raise ModelFileError(f"{g.path} does not belong with {ref.path} ({bad[0]}: "
                                     f"{g.meta.get(bad[0])} vs {ref.meta.get(bad[0])}); "
                                     "re-export the folder")
        if name is None:
            return
        base, batch = split_batched(name)
        base, frames = split_sized(base)
        base, slots = split_slots(base)
        for key, said in (("frames", frames), ("slots", slots)):
            if said is not None and g.meta.get(key) != str(said):
                raise ModelFileError(f"{g.path}: holds {g.meta.get(key)} {key}, its name says {said}; "
                                     "re-export the folder")
        role, mode = self.graphs[base]
        for key, want in (("role", role), ("mode", mode), ("batch", str(batch))):
            if g.meta.get(key, "1" if key == "batch" else None) != want:
                raise ModelFileError(f"{g.path}: has {key} {g.meta.get(key)}, expected {want} "
                                     f"for {g.path.name}; re-export the folder")
        self.check_graph(base, g)

    def slot_graphs(self, name: str) -> list[Graph]:
        """Slot graph `name` and its smaller copies, opened."""
        return [self.graph(name),
                *(self.graph(ladder_name(name, b)) for b in sorted(self.ladders.get(name, [])))]

    def window_graph(self, name: str) -> Graph:
        """Graph `name` for `map_windows` calls, when it also serves single calls (it is not in
        `sliding`): on the CPU EP with several windows at once, a second session of the same file
        on its share of the cores, so that a single call keeps every core and windows run side by
        side (SNAC decoder, 4 windows on 2 cores: 1.37x faster than one at a time on both)."""
        base = self.graph(name)
        if name in self.sliding or self.parallel == 1 or self.threads is not None or \
                self.provider != "CPUExecutionProvider":
            return base
        key = f"{name}@parallel"
        with self._lock:
            if key not in self._graphs:
                self._graphs[key] = open_graph(self.files[name], self.provider, self.options,
                                               max(1, cpu_cores() // self.parallel))
            return self._graphs[key]

    def map_windows(self, fn: Callable, items: Iterable) -> Iterator:
        """`map(fn, items)` with up to `parallel` calls running at once, lazily and in order.

        ORT lets go of the GIL while a session runs, so the calls run on their own cores; one
        more result than that waits for the caller at most, so memory stays bounded however
        long the signal. The graphs `fn` uses must be opened (`graph(name)`) before.
        """
        if self.parallel == 1:
            yield from map(fn, items)
            return
        pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="codecport-window")
        pending: deque = deque()
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) > self.parallel:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
