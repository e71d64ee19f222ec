"""The inputs of `codec-run tokenize`: audio files, folders, globs, manifests and Parquet datasets
in Hugging Face's layout, each turned into `Item`s with a stable id and a key that says whether
the input changed since it was tokenized.

- a folder: every audio file under it (by suffix, the formats soundfile reads); `.parquet` files
  under it are read as datasets (below);
- a glob (`data/**/*.flac`): the files it matches;
- a manifest: `.txt` (one path a line, `#` comments), `.csv` / `.jsonl` / `.parquet` with a `path`
  column and an optional `id`; relative paths are relative to the manifest's folder;
- a Parquet dataset in Hugging Face's layout (a column of `{bytes, path}` structs, as
  `datasets.Audio` stores it): one item per row, its audio decoded from the bytes, id = the
  `id` column where there is one, else `<file>:<row>`.

The id of a file found by a folder, a glob or its own name is its path relative to the folder
that holds every input (a folder input is its own such folder; a glob's is the part before its
first wildcard): `codec-run tokenize corpus/` gives `spk1/a.wav`, `codec-run tokenize train/
test/` gives `train/a.wav` and `test/a.wav`. Ids are then unique across inputs by construction
and the same on every rerun of the same command. A manifest's rows keep their own ids (its `id`
column, else the path as written).

Listing reads no audio: file sizes and dates, and the Parquet files' footers and id columns.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import CodecportError
from ..runtime.audio import FileSource

# Suffixes of the formats soundfile (libsndfile) reads.
AUDIO_SUFFIXES = frozenset({".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff",
                            ".aifc", ".au", ".snd", ".caf", ".w64", ".rf64", ".sph", ".nist", ".voc"})
MANIFEST_SUFFIXES = (".txt", ".csv", ".jsonl")
MAX_MANIFEST_LINE = 1 << 16  # a path is short; a longer line is not a manifest
MISSING = "missing"  # the key of an input listed but gone (resuming keeps its codes from before)


class InputError(CodecportError):
    """An input of tokenize that cannot be listed (not a per-file failure: those are rows of the
    errors table)."""


@dataclass(frozen=True)
class Item:
    """One input: `id` (unique in the job), `path` (what the rows say it came from), `key` (size
    and date of its file, which resuming compares), and for a dataset row the Parquet file,
    its audio column and row number."""

    id: str
    path: str
    key: str
    parquet: str = ""
    column: str = ""
    row: int = -1

    def source(self, reader: ParquetRows | None = None) -> FileSource:
        """The item's audio, opened (header read and checked) but not decoded."""
        if not self.parquet:
            if self.key == MISSING and not os.path.exists(self.path):
                raise CodecportError(f"{self.path}: no such file (listed, but gone)")
            return FileSource(self.path)
        return FileSource(self.path, (reader or ParquetRows()).audio_bytes(self))


def file_key(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def _root(raw: str) -> Path:
    """The folder input `raw`'s files lie under (see the module doc)."""
    path = Path(raw)
    if path.is_dir():
        return _absolute(path)
    if not path.exists() and glob.has_magic(raw):
        parts = Path(raw).parts
        static = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
        return _absolute(Path(*parts[:static])) if static else Path.cwd()
    return _absolute(path).parent


def _absolute(path: Path) -> Path:
    """`path` made absolute without following links: a link's id is its own place (a Hugging Face
    snapshot's files are links into a blobs folder outside it)."""
    return Path(os.path.abspath(path))


def read_inputs(inputs: list[str]) -> list[Item]:
    """Every item of `inputs`, in order; duplicate ids are an `InputError`."""
    roots = [_root(raw) for raw in inputs]
    try:
        common = Path(os.path.commonpath(roots))
    except ValueError:  # inputs on different drives: ids are absolute paths
        common = Path(roots[0].anchor)
    items, seen = [], {}
    for raw in inputs:
        for item in _items_of(raw, common):
            if item.id in seen:
                fix = ("a dataset's files (its splits) repeat the ids of their id column: tokenize "
                       "each split into its own -o" if item.parquet else
                       "give the inputs unique ids (an id column in a manifest)")
                raise InputError(f"id {item.id!r} comes twice ({seen[item.id]} and {item.path}); {fix}")
            seen[item.id] = item.path
            items.append(item)
    return items


def _id(path: Path, common: Path) -> str:
    """`path`'s id: its place under `common`."""
    return _absolute(path).relative_to(common).as_posix()


def _items_of(raw: str, common: Path) -> Iterator[Item]:
    path = Path(raw)
    if path.is_dir():
        found, other = 0, set()
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            if f.suffix.lower() in AUDIO_SUFFIXES:
                found += 1
                yield Item(_id(f, common), str(f.resolve()), file_key(f))
            elif f.suffix.lower() == ".parquet":
                for item in _dataset_rows(f, prefix=_id(f, common)):
                    found += 1
                    yield item
            else:
                other.add(f.suffix.lower() or f.name)
        if not found:
            seen = f" (it holds {', '.join(sorted(other)[:6])})" if other else " (it is empty)"
            raise InputError(f"{raw}: holds no audio file tokenize reads{seen}; it reads "
                             f"{', '.join(sorted(AUDIO_SUFFIXES))}, and Parquet datasets with an "
                             "audio column")
        return
    if not path.exists() and glob.has_magic(raw):
        matches = sorted(glob.glob(raw, recursive=True))
        if not matches:
            raise InputError(f"{raw}: matches no file; check the pattern (quote it for the shell)")
        for m in matches:
            if Path(m).is_file():
                yield from _file_items(Path(m), common)
        return
    if not path.is_file():
        raise InputError(f"{raw}: no such file or folder")
    yield from _file_items(path, common)


def _file_items(path: Path, common: Path) -> Iterator[Item]:
    suffix = path.suffix.lower()
    if suffix in MANIFEST_SUFFIXES:
        yield from _manifest(path)
    elif suffix == ".parquet":
        yield from _parquet(path, _id(path, common))
    else:  # an audio file; a file soundfile cannot read becomes a row of the errors table
        yield Item(_id(path, common), str(path.resolve()), file_key(path))


def _lines(f, path: Path) -> Iterator[str]:
    """`f`'s lines, none longer than `MAX_MANIFEST_LINE` (a huge line is not read whole)."""
    n = 0
    while line := f.readline(MAX_MANIFEST_LINE + 1):
        n += 1
        if len(line) > MAX_MANIFEST_LINE:
            raise InputError(f"{path}: line {n} is longer than {MAX_MANIFEST_LINE // 1024} KiB: not a "
                             "manifest; one path a line (.txt), or a 'path' column (.csv, .jsonl)")
        yield line


def _rows_of_manifest(path: Path) -> Iterator[dict]:
    try:
        # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8", Notepad) is not part of the first name
        with open(path, newline="", encoding="utf-8-sig") as f:
            if path.suffix.lower() == ".txt":
                for line in _lines(f, path):
                    line = line.strip()
                    if line and not line.startswith("#"):
                        yield {"path": line}
            elif path.suffix.lower() == ".csv":
                reader = csv.DictReader(_lines(f, path))
                if "path" not in (reader.fieldnames or []):
                    raise InputError(f"{path}: has no 'path' column (columns: {reader.fieldnames}); "
                                     "name the audio files' column 'path'")
                yield from reader
            else:
                for n, line in enumerate(_lines(f, path), 1):
                    if not line.strip():
                        continue
                    row = json.loads(line)
                    if not isinstance(row, dict):
                        raise InputError(f"{path}: line {n} is not a JSON object; one object a line, "
                                         "with a 'path' key")
                    yield row
    except (UnicodeDecodeError, ValueError, csv.Error) as e:
        raise InputError(f"{path}: not a readable manifest ({e}); one path a line (.txt), or a "
                         "'path' column (.csv, .jsonl)") from e


def _manifest(path: Path) -> Iterator[Item]:
    base = path.parent
    n = 0
    for n, row in enumerate(_rows_of_manifest(path), 1):
        yield _manifest_item(path, n, row.get("path"), row.get("id"), base)
    if not n:  # as an empty folder is: a job of nothing is a mistake, not a success
        raise InputError(f"{path}: lists no file (it is empty, or comments only); one path a line "
                         "(.txt), or a 'path' column (.csv, .jsonl)")


def _manifest_item(manifest: Path, n: int, value, id_value, base: Path) -> Item:
    if not isinstance(value, str) or not value or len(value) > MAX_MANIFEST_LINE:
        raise InputError(f"{manifest}: row {n} has no path; every row needs one")
    file = Path(value) if os.path.isabs(value) else base / value
    try:
        key = file_key(file)
    except OSError:
        key = MISSING  # listed, but gone: a row of the errors table, not the end of the job
    ident = value if id_value in (None, "") else str(id_value)
    return Item(ident, str(file.resolve()), key)


def _parquet(path: Path, ident: str) -> Iterator[Item]:
    """A manifest with a `path` column, or a dataset with an audio column (rows `ident:row`)."""
    pq = _pyarrow_parquet()
    schema = _schema(path)
    if _audio_column(schema) is not None:
        yield from _dataset_rows(path, prefix=ident)
        return
    if "path" not in schema.names:
        raise InputError(f"{path}: has neither a 'path' column nor an audio column of "
                         "{bytes, path} structs (Hugging Face datasets' Audio)")
    cols = ["path", "id"] if "id" in schema.names else ["path"]
    table = pq.read_table(path, columns=cols)
    ids = table.column("id").to_pylist() if "id" in cols else [None] * table.num_rows
    for n, (value, given) in enumerate(zip(table.column("path").to_pylist(), ids), 1):
        yield _manifest_item(path, n, value, given, path.parent)


def _dataset_rows(path: Path, prefix: str) -> Iterator[Item]:
    pq = _pyarrow_parquet()
    schema = _schema(path)
    column = _audio_column(schema)
    if column is None:
        return  # a Parquet file beside the audio that holds none (a table of labels...)
    rows = pq.ParquetFile(path).metadata.num_rows
    ids = [None] * rows
    if "id" in schema.names:
        ids = pq.read_table(path, columns=["id"]).column("id").to_pylist()
    key, resolved = file_key(path), str(path.resolve())
    for row in range(rows):
        ident = f"{prefix}:{row}" if ids[row] in (None, "") else str(ids[row])
        yield Item(ident, f"{resolved}#{row}", f"{key}:{row}", resolved, column, row)


def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError as e:  # a base dependency; a broken install says so
        raise InputError(f"reading Parquet needs pyarrow ({e}); pip install pyarrow") from e
    return pq


def _schema(path: Path):
    pq = _pyarrow_parquet()
    try:
        return pq.read_schema(path)
    except Exception as e:
        raise InputError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from e


def _audio_column(schema) -> str | None:
    """The first column of `{bytes, path}` structs (Hugging Face datasets' Audio feature)."""
    import pyarrow as pa

    for f in schema:
        if not pa.types.is_struct(f.type) or f.type.get_field_index("bytes") < 0:
            continue
        kind = f.type.field("bytes").type
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            return f.name
    return None


class ParquetRows:
    """Reads the audio bytes of dataset rows, one row group at a time (the last one kept, as
    the items of a file come in order)."""

    def __init__(self):
        self._file, self._meta, self._group, self._table = None, None, None, None

    def audio_bytes(self, item: Item) -> bytes:
        pq = _pyarrow_parquet()
        try:
            if self._file != item.parquet:
                self._file, self._meta, self._group = item.parquet, pq.ParquetFile(item.parquet), None
            start = 0
            for g in range(self._meta.num_row_groups):
                n = self._meta.metadata.row_group(g).num_rows
                if item.row < start + n:
                    break
                start += n
            else:
                raise CodecportError(f"{item.path}: the dataset has no row {item.row} any more")
            if self._group != g:
                self._table = self._meta.read_row_group(g, columns=[item.column]).column(item.column)
                self._group = g
            value = self._table[item.row - start].as_py()
        except CodecportError:
            raise
        except Exception as e:
            self._file = None
            raise CodecportError(f"{item.path}: cannot read the row ({str(e).splitlines()[0]})") from e
        data = (value or {}).get("bytes")
        if not data:
            raise CodecportError(f"{item.path}: the row holds no audio bytes (a path-only Audio "
                                 "column?); tokenize the audio files themselves")
        return data
