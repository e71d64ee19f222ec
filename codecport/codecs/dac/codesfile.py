"""`.dac` files, compatible with the official `DACFile` (an `np.save` of a pickled dict).

The official reader calls `np.load(allow_pickle=True)`, which runs whatever the pickle says.
This reader unpickles with an allow-list of numpy's array-rebuilding functions only, then checks
that it got exactly that dict, with those keys and types.
"""

from __future__ import annotations

import io
import math
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...atomic import atomic_path
from ...errors import CodesError
from ...runtime.codefile import Format
from ...runtime.npyfile import read_header

DAC_VERSION = "1.0.0"
_META_TYPES = {"input_db": (float,), "original_length": (int,), "sample_rate": (int,),
               "chunk_length": (int,), "channels": (int,), "padding": (bool,),
               "dac_version": (str,)}
# What an np.save'd dict of arrays may reference: numpy's array/scalar reconstructors.
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
            ("numpy", "ndarray"), ("numpy", "dtype")}


@dataclass
class DacFile:
    codes: np.ndarray  # [channels, codebooks, frames], uint16 on disk
    chunk_length: int  # frames decoded per step
    original_length: int  # samples at `sample_rate`
    input_db: float  # loudness of the input, dB LUFS
    channels: int
    sample_rate: int  # of the original audio
    padding: bool  # official padding (True) or the chunked padding-off mode (False)
    dac_version: str = DAC_VERSION

    def save(self, path: Path) -> None:
        artifacts = {
            "codes": self.codes.astype(np.uint16),
            "metadata": {
                "input_db": np.array([self.input_db], dtype=np.float32),
                "original_length": int(self.original_length), "sample_rate": int(self.sample_rate),
                "chunk_length": int(self.chunk_length), "channels": int(self.channels),
                "padding": bool(self.padding), "dac_version": self.dac_version,
            },
        }
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.save(f, artifacts, allow_pickle=True)

    @classmethod
    def load(cls, path: Path) -> DacFile:
        obj = _restricted_load(path)
        if not isinstance(obj, dict) or set(obj) != {"codes", "metadata"}:
            raise CodesError(f"{path}: not a .dac file (expected a dict with codes and metadata)")
        codes, meta = obj["codes"], obj["metadata"]
        if not isinstance(codes, np.ndarray) or codes.dtype.kind not in "ui" or codes.ndim != 3:
            raise CodesError(f"{path}: codes must be an integer array [channels, codebooks, frames]")
        if not isinstance(meta, dict) or set(meta) != set(_META_TYPES):
            raise CodesError(f"{path}: metadata keys {sorted(meta) if isinstance(meta, dict) else meta}"
                             f" are not the official {sorted(_META_TYPES)}")
        db = meta["input_db"]
        if isinstance(db, np.ndarray) and db.dtype.kind == "f" and db.size >= 1:
            meta = {**meta, "input_db": float(db.reshape(-1)[0])}
        meta = {k: v.item() if isinstance(v, np.generic) else v for k, v in meta.items()}
        for key, types in _META_TYPES.items():
            v = meta[key]
            if not isinstance(v, types) or (types == (int,) and isinstance(v, bool)):
                raise CodesError(f"{path}: metadata {key} has type {type(v).__name__}, expected "
                                 f"{types[0].__name__}")
        if meta["dac_version"] != DAC_VERSION:
            raise CodesError(f"{path}: dac_version {meta['dac_version']!r} is not supported "
                             f"(only {DAC_VERSION})")
        return cls(codes=codes.astype(np.int64), **meta)


class _ArrayType:
    """What the pickle gets for `numpy.ndarray`: `_reconstruct` takes the class as an argument,
    but the class called itself (`ndarray(shape, dtype)`) would allocate any shape a file names
    (538 bytes asked for 4 GB), so the pickle holds this stand-in, which cannot be called."""


class _NumpyOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        if name == "ndarray":
            return _ArrayType
        found = super().find_class(module, name)
        if name != "_reconstruct":
            return found

        def reconstruct(subtype, shape, dtype):
            # It allocates `shape` before the data arrives: bound it by what a file can hold.
            if subtype is not _ArrayType or not isinstance(shape, tuple) or math.prod(shape) > MAX_BYTES:
                raise pickle.UnpicklingError(f"refusing an array of shape {shape}")
            return found(np.ndarray, shape, dtype)

        return reconstruct


MAX_BYTES = 4 << 30  # a .dac of 10 hours of DAC-44k codes is 60 MB


def write(path: Path, arrays: list[np.ndarray], fields: dict) -> None:
    """Codes as an official `.dac` file: they must carry what `decompress` needs."""
    missing = [f for f in ("num_samples", "loudness_db", "mode") if fields.get(f) is None]
    if missing:
        raise CodesError(f"{path}: a .dac file needs the original length, rate and loudness, which "
                         f"these codes lack ({', '.join(missing)}); encode the audio itself, or "
                         "write .npy")
    codes = arrays[0]
    if len(arrays) != 1 or fields["mode"] not in ("fixed", "chunked", "whole") or \
            codes.min() < 0 or codes.max() > np.iinfo(np.uint16).max:  # `Codes` are non-empty integers
        raise CodesError(f"{path}: these codes do not fit the .dac format (DAC codes, 0 to 65535); "
                         "write .npy")
    # Whole-clip codes are what `decompress` decodes in one call: padding on, one chunk of all.
    chunked = fields["mode"] == "chunked"
    step = fields.get("chunk_frames")
    if chunked and not (isinstance(step, int | np.integer) and step > 0 and codes.shape[-1] % step == 0):
        raise CodesError(f"{path}: chunked codes need the chunk length that divides their {codes.shape[-1]} "
                         f"frames, these carry {step!r}; encode the audio itself, or write .npy")
    DacFile(codes=codes, chunk_length=step if chunked else codes.shape[-1],
            original_length=fields["num_samples"], input_db=fields["loudness_db"], channels=codes.shape[0],
            sample_rate=fields["sample_rate"], padding=not chunked).save(path)


def read(path: Path) -> tuple[list[np.ndarray], dict]:
    """An official `.dac` file's codes and fields, every field checked against the others."""
    f = DacFile.load(path)
    if f.channels != f.codes.shape[0]:
        raise CodesError(f"{path}: {f.codes.shape[0]} code rows for {f.channels} channels; the "
                         "file is inconsistent")
    if f.chunk_length < 1 or (f.padding and f.chunk_length != f.codes.shape[-1]) or \
            (not f.padding and f.codes.shape[-1] % f.chunk_length):
        raise CodesError(f"{path}: chunk_length {f.chunk_length} does not divide its "
                         f"{f.codes.shape[-1]} frames; the file is inconsistent")
    return [f.codes], {"sample_rate": f.sample_rate, "num_samples": f.original_length,
                       "loudness_db": f.input_db, "mode": "fixed" if f.padding else "chunked",
                       "chunk_frames": None if f.padding else f.chunk_length}


def _restricted_load(path: Path):
    if path.stat().st_size > MAX_BYTES:
        raise CodesError(f"{path}: {path.stat().st_size / 2**20:.0f} MiB is more than a .dac file holds")
    try:
        with open(path, "rb") as f:
            shape, dtype, _ = read_header(f, str(path), CodesError, objects=True)
            if dtype != np.dtype(object) or shape != ():
                raise CodesError(f"{path}: not a .dac file (an array of {dtype}, not a dict)")
            data = f.read()
    except OSError as e:
        raise CodesError(f"{path}: cannot read it ({e.strerror or e})") from e
    try:
        # np.save pickles the 0-d object array itself; its single item is the dict.
        return _NumpyOnly(io.BytesIO(data)).load()[()]
    except pickle.UnpicklingError as e:
        raise CodesError(f"{path}: refused: the file holds more than arrays and plain values ({e})") from None
    except Exception as e:  # noqa: BLE001 (damaged pickle data fails in many ways; all mean "not a .dac")
        raise CodesError(f"{path}: not a readable .dac file ({type(e).__name__}: {e})") from None


FORMATS = (Format(".dac", "dac", read, write),)  # runtime/codefile.py, where the registry adds it
