"""Code files: every format codecport reads and writes, in one place, picked by suffix.

- `.npy`: one bare array `[channels, codebooks, frames]` (codecs of one time scale); it decodes
  to the model's full frames at the model's rate.
- `.npz`: `codes_0`, `codes_1`, ... (one per time scale, coarse first) and the fields that give
  the original audio back (`Codes`' fields). Several time scales of one codebook each (SNAC) are
  written `[channels, frames]`, the official `encode`'s shape. A `.npz` of arrays only (`codes`,
  or `codes_0`, `codes_1`, ..., or `np.savez`'s `arr_0`, ..., as users of the official packages
  save them) is read as bare codes, like a `.npy`.

A codec with a format of its own (DAC's official `.dac`) or a layout (`--layout NAME`: another
arrangement of its codes in a file, as SNAC's `orpheus`, the flat sequence Orpheus TTS emits)
declares it in its `codesfile` module; the registry adds it here (`add`) when it finds the codec.

Readers return `(arrays, fields)` and writers take them; `Codes` (codes.py) is built on these.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..errors import CodesError
from .graph import RENAMED
from .npyfile import read_npy, read_npz

# The fields beside the arrays, by type (codecport 0.2 wrote `variant` for `preset`: graph.RENAMED).
INTS, FLOATS, TEXTS = ("sample_rate", "num_samples", "chunk_frames"), ("loudness_db",), \
    ("codec", "mode", "preset", "export_id")

Reader = Callable[[Path], tuple[list[np.ndarray], dict]]
Writer = Callable[[Path, list[np.ndarray], dict], None]


@dataclass(frozen=True)
class Format:
    """A codes file format: `suffix`, the codec whose codes it holds (None: any), how it is read
    and written."""

    suffix: str
    codec: str | None
    read: Reader
    write: Writer


@dataclass(frozen=True)
class Layout:
    """Another arrangement of `codec`'s codes in a `suffix` file (`--layout name`)."""

    name: str
    suffix: str
    codec: str
    help: str
    read: Reader
    write: Writer


def _write_npy(path: Path, arrays: list[np.ndarray], fields: dict) -> None:
    check_npy(path, len(arrays))
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, arrays[0])


def _read_npy(path: Path) -> tuple[list[np.ndarray], dict]:
    return [read_npy(path, CodesError)], {}


def _flat(arrays: list[np.ndarray]) -> bool:
    """Several time scales of one codebook each: each written `[channels, frames]`."""
    return len(arrays) > 1 and all(a.shape[1] == 1 for a in arrays)


def _write_npz(path: Path, arrays: list[np.ndarray], fields: dict) -> None:
    flat = _flat(arrays)
    out = {f"codes_{i}": a[:, 0] if flat else a for i, a in enumerate(arrays)}
    out.update({k: np.array(v) for k, v in fields.items() if v is not None})
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **out)


def _read_npz(path: Path) -> tuple[list[np.ndarray], dict]:
    try:
        z = read_npz(path, CodesError)
    except CodesError as e:
        raise CodesError(f"{e}; not a codes file") from None
    names = []
    for prefix in ("codes_", "arr_"):
        names = list(itertools.takewhile(z.__contains__, (f"{prefix}{i}" for i in itertools.count())))
        if names:
            break
    if not names and "codes" in z:  # one array; before codecport 0.2 with `length`
        names, z = ["codes"], {**z, "num_samples": z["length"]} if "length" in z else z
    if not names:
        raise CodesError(f"{path}: holds no codes (no codes_0, codes or arr_0 array); not a codes file")
    fields = {}
    for key, value in z.items():
        key = RENAMED.get(key, key)
        if key in (*INTS, *FLOATS, *TEXTS):
            fields[key] = _field(path, key, value)
    arrays = [z[n] for n in names]
    if len(arrays) > 1:  # [channels, frames] per time scale, as the official encode gives them
        arrays = [a[:, None] if a.ndim == 2 else a for a in arrays]
    return arrays, fields


def _field(path: Path, key: str, v: np.ndarray):
    if v.shape != ():
        raise CodesError(f"{path}: {key} must be one value, got shape {list(v.shape)}")
    if key in TEXTS:
        if v.dtype.kind != "U":
            raise CodesError(f"{path}: {key} must be text, got {v.dtype}")
        return str(v)
    if key in INTS:
        if v.dtype.kind not in "ui":
            raise CodesError(f"{path}: {key} must be an integer, got {v.dtype}")
        return int(v)
    if v.dtype.kind != "f" or not math.isfinite(float(v)):
        raise CodesError(f"{path}: {key} must be a finite number, got {v}")
    return float(v)


FORMATS = {f.suffix: f for f in (
    Format(".npy", None, _read_npy, _write_npy),
    Format(".npz", None, _read_npz, _write_npz),
)}
LAYOUTS: dict[str, Layout] = {}


def _slot(entry: Format | Layout) -> tuple[dict, str]:
    return (FORMATS, entry.suffix) if isinstance(entry, Format) else (LAYOUTS, entry.name)


def check_new(entry: Format | Layout) -> None:
    """ValueError when another format or layout holds `entry`'s suffix or name."""
    table, key = _slot(entry)
    if table.get(key, entry) != entry:
        raise ValueError(f"{key} is declared twice ({table[key].codec} and {entry.codec})")


def add(entry: Format | Layout) -> None:
    """A codec's own format or layout, from its `codesfile` module (the registry adds them)."""
    check_new(entry)
    table, key = _slot(entry)
    table[key] = entry


def suffixes(codec: str) -> tuple[str, ...]:
    """The suffixes `codec`'s codes are written as: `.npy`, `.npz` and its own formats."""
    return tuple(s for s, f in FORMATS.items() if f.codec in (None, codec))


def layout(name: str, codec: str | None) -> Layout:
    """Layout `name`, which must be `codec`'s (when given), else `CodesError`."""
    lay = LAYOUTS.get(name)
    if lay is None:
        raise CodesError(f"no layout named {name!r}; codecport has {', '.join(LAYOUTS) or 'none'}")
    if codec not in (None, lay.codec):
        raise CodesError(f"the {name} layout is for {lay.codec} codes; this folder holds {codec}")
    return lay


def check_npy(path: Path, levels: int) -> None:
    """A bare `.npy` holds one array: codes of several time scales need `.npz` or a layout."""
    if levels > 1:
        hint = f" (or a flat layout: --layout {' / '.join(LAYOUTS)})" if LAYOUTS else ""
        raise CodesError(f"{path}: codes of {levels} time scales do not fit one .npy; write .npz{hint}")


def format_of(path: Path, layout_name: str | None = None) -> Format | Layout:
    """How `path` is read or written: its layout when named, else the format of its suffix."""
    if layout_name is not None:
        lay = layout(layout_name, None)
        if path.suffix != lay.suffix:
            raise CodesError(f"{path}: the {lay.name} layout is written as {lay.suffix}")
        return lay
    fmt = FORMATS.get(path.suffix)
    if fmt is None:
        raise CodesError(f"{path}: {path.suffix or 'no suffix'} is not a codes format; use "
                         f"{', '.join(FORMATS)}")
    return fmt


def read(path: Path, layout_name: str | None = None) -> tuple[list[np.ndarray], dict]:
    """(arrays, fields) of a codes file; a codec's own format or layout names its codec."""
    fmt = format_of(path, layout_name)
    if not path.is_file():
        raise CodesError(f"{path}: no such codes file")
    arrays, fields = fmt.read(path)
    if fmt.codec is not None:
        fields = {"codec": fmt.codec, **fields}
    return arrays, fields


def write(path: Path, arrays: list[np.ndarray], fields: dict, layout_name: str | None = None) -> None:
    """A codes file (atomically), in its layout when named, else the format of its suffix."""
    fmt = format_of(path, layout_name)
    if fmt.codec is not None and fields.get("codec") not in (None, fmt.codec):
        raise CodesError(f"{path}: {fmt.suffix} files hold {fmt.codec} codes, these are "
                         f"{fields['codec']}")
    fmt.write(path, arrays, fields)
