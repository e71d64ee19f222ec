"""The output of `codec-run tokenize`: a folder of Parquet shards that `pyarrow.dataset` and
`datasets.load_dataset("parquet", data_dir=...)` read as one table.

    part-<run>-<n>.parquet   rows: id, path, codes [channels][codebooks][frames], n_frames,
                             sample_rate, num_samples, duration_s, codec, preset, n_codebooks,
                             export_id, input_key
    __errors__/errors.parquet  the inputs that failed in the last run: id, path, error
    .codecport.json          the model the codes come from (codes of another are refused)

A shard is written under a temporary name and renamed into place, so a killed job leaves whole
shards or none; a shard of ours that does not open (copied half) is deleted and its rows
redone; any other file that is not a shard of this model's codes is refused, never touched.
Neither reader takes hidden files (`.`) or a folder named `__x__` as part of the dataset (pyarrow
leaves out every `_` and `.` name, `datasets` only those).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..atomic import atomic_path, unwritable
from ..errors import CodecportError
from .corpus import MISSING

log = logging.getLogger(__name__)

META, ERRORS, LOCK = ".codecport.json", "__errors__/errors.parquet", ".codecport.lock"
MODEL_FIELDS = ("codec", "preset", "export_id", "n_codebooks")
ROW_MODEL = ("codec", "preset", "export_id")  # the model fields every row holds as .codecport.json does
OLD_PRESET = "variant"  # what codecport 0.2 called the preset, in .codecport.json and the rows
# The names this module writes: its shards (`flush`), and the temporary files `atomic_path` makes
# of them and of META while writing. Only these are ever deleted unasked.
SHARD = re.compile(r"part-[0-9a-f]{12}-\d{5}\.parquet")
OUR_TEMP = re.compile(r"\.(part-[0-9a-f]{12}-\d{5}\.parquet|\.codecport\.json)\..+\.part")


def _pa():
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa, pq


def code_type(codebook_size: int):
    """The smallest integer type that holds every code."""
    pa, _ = _pa()
    return pa.int16() if codebook_size <= 1 << 15 else pa.int32()


def schema(codec):
    pa, _ = _pa()
    codes = pa.list_(pa.list_(pa.list_(code_type(codec.codebook_size))))
    return pa.schema([
        ("id", pa.string()), ("path", pa.string()),
        # `codes` is the first time scale; a multi-scale codec adds codes_1, codes_2...
        *[(codes_column(level), codes) for level in range(codec.levels)],
        ("n_frames", pa.int32()), ("sample_rate", pa.int32()), ("num_samples", pa.int64()),
        ("duration_s", pa.float64()), ("codec", pa.string()), ("preset", pa.string()),
        ("n_codebooks", pa.int16()), ("export_id", pa.string()), ("input_key", pa.string()),
        ("error", pa.string()),
    ])


def codes_column(level: int) -> str:
    """The column of one time scale's codes: `codes`, then `codes_1`, `codes_2`..."""
    return "codes" if level == 0 else f"codes_{level}"


def _codes_array(arrays: list[np.ndarray], value_type):
    """`[channels][codebooks][frames]` lists, built from the flat values and three offset
    arrays (no Python list per code)."""
    pa, _ = _pa()
    inner = np.concatenate([[0], *[np.full(a.shape[0] * a.shape[1], a.shape[2]) for a in arrays]])
    middle = np.concatenate([[0], *[np.full(a.shape[0], a.shape[1]) for a in arrays]])
    outer = np.concatenate([[0], [a.shape[0] for a in arrays]])
    flat = np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(0)
    values = pa.array(flat.astype(value_type.to_pandas_dtype()), value_type)
    for offsets in (inner, middle, outer):
        values = pa.ListArray.from_arrays(pa.array(np.cumsum(offsets), pa.int32()), values)
    return values


def result_table(codec, items, results: dict):
    """The rows of `items`: `results[id]` is their `Codes`, or the exception that failed them."""
    pa, _ = _pa()
    sch = schema(codec)
    empty = np.zeros((0, 0, 0), np.int64)
    cols = {name: [] for name in sch.names}
    levels: list[list[np.ndarray]] = [[] for _ in range(codec.levels)]
    for item in items:
        r = results.get(item.id, CodecportError("no result came back for this input"))
        if not isinstance(r, BaseException) and len(r.arrays) != codec.levels:
            r = CodecportError(f"{len(r.arrays)} time scales of codes, the codec declares {codec.levels}")
        ok = not isinstance(r, BaseException)
        for level, arrays in enumerate(levels):
            arrays.append(r.arrays[level] if ok else empty)
        a = levels[0][-1]
        cols["id"].append(item.id)
        cols["path"].append(item.path)
        cols["n_frames"].append(a.shape[2] if ok else 0)
        cols["sample_rate"].append(r.sample_rate if ok else 0)
        cols["num_samples"].append(r.num_samples if ok else 0)
        cols["duration_s"].append(r.num_samples / r.sample_rate if ok else 0.0)
        cols["codec"].append(codec.name)
        cols["preset"].append(codec.preset)
        cols["n_codebooks"].append(r.n_codebooks if ok else 0)  # over every time scale
        cols["export_id"].append(codec.export_id)
        cols["input_key"].append(item.key)
        cols["error"].append(None if ok else _one_line(r))
    value_type = sch.field("codes").type.value_type.value_type.value_type
    coded = {codes_column(level): arrays for level, arrays in enumerate(levels)}
    data = {n: (_codes_array(coded[n], value_type) if n in coded else pa.array(v, sch.field(n).type))
            for n, v in cols.items()}
    return pa.table(data, schema=sch)


def _one_line(e: BaseException) -> str:
    text = (str(e).strip().splitlines() or [""])[0]
    return text if isinstance(e, CodecportError) else f"{type(e).__name__}: {text}"


class OutputDir:
    """A tokenize output folder, for one model: resumes what is there, adds shards atomically."""

    def __init__(self, path: Path, codec, n_codebooks: int):
        self.path, self.codec = path, codec
        self.model = {"codec": codec.name, "preset": codec.preset, "export_id": codec.export_id,
                      "n_codebooks": n_codebooks}
        self.preset_column = "preset"  # a folder codecport 0.2 began keeps its column's name
        try:
            if path.exists() and not path.is_dir():
                raise CodecportError(f"{path} is a file; pass a folder to -o")
        except OSError as e:  # a name too long, a parent that is a file...
            raise unwritable(path, e) from e
        self.run = uuid.uuid4().hex[:12]
        self._shards, self._buffer, self._errors = 0, [], []
        self._check_model()  # refused now, touching nothing; again under the lock (`lock`)

    def _check_model(self) -> None:
        meta = self.path / META
        if meta.is_file() and self._holds_codes():
            try:
                have = json.loads(meta.read_text())
                if OLD_PRESET in have and "preset" not in have:
                    have["preset"] = have.pop(OLD_PRESET)
                    self.preset_column = OLD_PRESET
                have = {k: have[k] for k in MODEL_FIELDS}
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise CodecportError(f"{meta} is damaged ({e}); delete {self.path} to start over") from e
            if have != self.model:
                diff = next(k for k in MODEL_FIELDS if have[k] != self.model[k])
                raise CodecportError(
                    f"{self.path} holds codes of another model ({diff} {have[diff]}, this model's is "
                    f"{self.model[diff]}); codes are never mixed: pass another -o, or delete it")
        elif not meta.is_file() and self._holds_anything():
            raise CodecportError(f"{self.path} holds files that are not a codecport tokenize output; "
                                 "pass another -o, or empty it first")

    def _holds_codes(self) -> bool:
        """Whether the folder holds shards: a run that wrote no row yet (its errors table
        aside) claims it for no model."""
        return self.path.is_dir() and any(self.path.glob("part-*.parquet"))

    def _holds_anything(self) -> bool:
        """Whether the folder holds anything but our lock, model note and temporary files."""
        try:
            return self.path.is_dir() and any(p.name not in (META, LOCK) and not OUR_TEMP.fullmatch(p.name)
                                              for p in self.path.iterdir())
        except OSError as e:
            raise unwritable(self.path, e) from e

    @contextmanager
    def lock(self):
        """Held for the whole run: two jobs writing one folder would double rows. The folder's
        model is checked again once it is held: another job may have begun it since."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            f = open(self.path / LOCK, "a+")  # noqa: SIM115 (held for the run, closed below)
        except OSError as e:
            raise unwritable(self.path, e) from e
        with f:
            try:
                import fcntl
            except ImportError:  # Windows: no advisory locks; one job per folder is on the user
                fcntl = None
            if fcntl is not None:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise CodecportError(f"another codec-run tokenize is writing {self.path}; wait "
                                         "for it, or pass another -o") from None
            self._check_model()
            if not (self.path / META).is_file() or not self._holds_codes():
                with atomic_path(self.path / META) as tmp:
                    tmp.write_text(json.dumps(self.model, indent=2))
            for tmp in self.path.glob(".*.part"):  # a killed run's shard that was being written
                if OUR_TEMP.fullmatch(tmp.name):
                    tmp.unlink()
            yield self

    def shards(self) -> list[Path]:
        return sorted(self.path.glob("part-*.parquet"))

    def todo(self, items: list) -> list:
        """The items the folder does not hold with their current key. Rows of a changed input,
        doubled rows and shards of ours cut short are removed first; a row of an input the job
        lists under another id (the same file and key: ids of codecport 0.2, or an input set that
        grew) takes the job's id; a row of an input listed but gone is kept. A shard of another
        model, or a file that is no shard of ours, is refused before anything is changed."""
        want = {item.id: item.key for item in items}
        by_file = {(item.path, item.key): item.id for item in items}
        tables = {shard: t for shard in self.shards() if (t := self._read_shard(shard)) is not None}
        seen, drop, rename = set(), {}, {}
        for shard, t in tables.items():
            rows = zip(t.column("id").to_pylist(), t.column("path").to_pylist(),
                       t.column("input_key").to_pylist())
            for i, (ident, path, key) in enumerate(rows):
                if ident not in want and (path, key) in by_file:
                    rename.setdefault(shard, {})[i] = ident = by_file[path, key]
                if ident in seen or (ident in want and want[ident] not in (key, MISSING)):
                    drop.setdefault(shard, []).append(i)
                else:
                    if want.get(ident) == MISSING:
                        log.warning("%s: listed but gone; its codes from before are kept", ident)
                    seen.add(ident)
        for shard in {*drop, *rename}:
            self._rewrite(shard, drop.get(shard, []), rename.get(shard, {}))
        return [item for item in items if item.id not in seen]

    def _read_shard(self, shard: Path):
        """`shard`'s id, path and key columns, once its rows are known to be this model's; None
        for a shard of ours cut short (deleted: its rows are done again). Anything else that is
        not such a shard is refused, and left as it is."""
        _, pq = _pa()
        columns = ["id", "path", "input_key",
                   *(self.preset_column if k == "preset" else k for k in ROW_MODEL)]
        move = f"move it out of {self.path}, or pass another -o"
        try:
            names = pq.read_schema(shard).names
            t = pq.read_table(shard, columns=columns) if set(columns) <= set(names) else None
        except Exception as e:
            if isinstance(e, OSError) and e.errno is not None:  # no permission, an I/O error: it may be whole
                raise CodecportError(f"cannot read {shard} ({str(e).splitlines()[0]}); "
                                     f"check it, or {move}") from e
            # pyarrow's ArrowInvalid, or its OSError of a damaged footer: a damaged file
            if not SHARD.fullmatch(shard.name):
                raise CodecportError(f"{shard} does not open as Parquet ({str(e).splitlines()[0]}); "
                                     f"{move}") from e
            log.warning("%s does not open (%s): deleted, its rows are done again", shard,
                        str(e).splitlines()[0])
            shard.unlink()
            return None
        if t is None:
            raise CodecportError(f"{shard} is not a shard of codes (it has no "
                                 f"{next(c for c in columns if c not in names)!r} column); {move}")
        for k, column in zip(ROW_MODEL, columns[3:]):
            other = [v for v in t.column(column).unique().to_pylist() if v != self.model[k]]
            if other:
                raise CodecportError(f"{shard} holds codes of another model ({k} {other[0]}, this model's is "
                                     f"{self.model[k]}); codes are never mixed: {move}")
        return t

    def _rewrite(self, shard: Path, drop: list[int], ids: dict[int, str]) -> None:
        """`shard` without rows `drop`, rows `ids` under new ids."""
        pa, pq = _pa()
        table = pq.read_table(shard)
        if ids:
            column = table.column("id").to_pylist()
            for i, ident in ids.items():
                column[i] = ident
            table = table.set_column(table.schema.get_field_index("id"), "id", pa.array(column, pa.string()))
        keep = np.setdiff1d(np.arange(table.num_rows), drop)
        log.info("%s: %d row(s) of changed or doubled inputs removed, %d renamed",
                 shard.name, len(drop), len(ids))
        if not len(keep):
            shard.unlink()
            return
        with atomic_path(shard) as tmp:
            pq.write_table(table.take(keep), tmp)

    def add(self, table):
        """Buffer the rows of a result table; returns (the good rows, [(id, error)...])."""
        _pa()
        import pyarrow.compute as pc

        failed = pc.is_valid(table.column("error"))
        bad = table.filter(failed)
        ok = table.filter(pc.invert(failed)).drop_columns(["error"])
        if self.preset_column != "preset":
            ok = ok.rename_columns([self.preset_column if n == "preset" else n for n in ok.column_names])
        ids, why = bad.column("id").to_pylist(), bad.column("error").to_pylist()
        self._errors += list(zip(ids, bad.column("path").to_pylist(), why))
        errors = list(zip(ids, why))
        if ok.num_rows:
            self._buffer.append(ok)
        return ok, errors

    @property
    def buffered(self) -> int:
        return sum(t.num_rows for t in self._buffer)

    def flush(self) -> None:
        """Write the buffered rows as one shard."""
        pa, pq = _pa()
        if not self._buffer:
            return
        table = pa.concat_tables(self._buffer)
        name = f"part-{self.run}-{self._shards:05d}.parquet"
        with atomic_path(self.path / name) as tmp:
            pq.write_table(table, tmp)
        self._shards += 1
        self._buffer = []

    def finish(self) -> None:
        """The errors table of this run (none: no table)."""
        pa, pq = _pa()
        errors = self.path / ERRORS
        if not self._errors:
            errors.unlink(missing_ok=True)
            if errors.parent.is_dir() and not any(errors.parent.iterdir()):
                errors.parent.rmdir()
            return
        ids, paths, why = zip(*self._errors)
        with atomic_path(errors) as tmp:
            pq.write_table(pa.table({"id": list(ids), "path": list(paths), "error": list(why)}), tmp)
