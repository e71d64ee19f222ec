"""Reading `.npy` and `.npz` files that may be damaged or hostile, with bounded memory.

numpy's own `np.load` trusts the header: a 100-byte file can claim a shape of terabytes, and a
small deflated `.npz` member can inflate to gigabytes. Here every header is read first and
checked against what the file really holds (its size, the archive's declared member size and
its compression ratio) and against the caller's limit, before a byte of data is allocated.
Object arrays (pickles) are refused outright.
"""

from __future__ import annotations

import math
import tokenize
import zipfile
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import CodecportError

MAX_BYTES = 4 << 30  # one array; codes of 10 hours of DAC-44k are 225 MB as int64
# A deflated member that inflates more than this many times is not codes or weights (random-ish
# integers and floats compress 1.5-5x); past `SMALL` bytes it is refused as a likely zip bomb.
MAX_RATIO, SMALL = 200, 64 << 20


def read_header(f: BinaryIO, what: str, error: type[CodecportError],
                objects: bool = False) -> tuple[tuple[int, ...], np.dtype, bool]:
    """(shape, dtype, fortran order) of the `.npy` header at `f`, or `error`. Object arrays
    (pickles) are refused unless `objects` (the `.dac` reader unpickles them its own way)."""
    try:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"unsupported .npy format version {version}")
        shape, fortran, dtype = read(f)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError, MemoryError, tokenize.TokenError) as e:
        # numpy parses the header with Python's own tokenizer: a damaged one fails in its terms
        raise error(f"{what}: not a readable .npy array ({type(e).__name__}: {e})") from None
    if dtype.hasobject and not objects:
        raise error(f"{what}: holds Python objects (a pickle), which codecport does not load")
    if any(int(d) < 0 for d in shape) or dtype.itemsize == 0:
        raise error(f"{what}: a damaged .npy header (shape {list(shape)}, dtype {dtype.str}); "
                    "write the file again")
    return tuple(int(d) for d in shape), dtype, bool(fortran)


def _read_array(f: BinaryIO, what: str, data_bytes: int, error: type[CodecportError],
                max_bytes: int) -> np.ndarray:
    """The array whose header starts at `f`, given that `data_bytes` follow the header."""
    start = f.tell()
    shape, dtype, fortran = read_header(f, what, error)
    want = math.prod(shape) * dtype.itemsize
    have = data_bytes - (f.tell() - start)
    if want > max_bytes:
        raise error(f"{what}: an array of {want / 2**20:.0f} MiB {list(shape)} is more than codecport "
                    f"reads ({max_bytes / 2**20:.0f} MiB)")
    if want != have:
        raise error(f"{what}: the header promises {want} bytes of data, the file holds {have}; "
                    "it is truncated or damaged")
    data = f.read(want)
    if len(data) != want:
        raise error(f"{what}: ends after {len(data)} of {want} bytes of data; it is truncated")
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def read_npy(path: Path, error: type[CodecportError], max_bytes: int = MAX_BYTES) -> np.ndarray:
    """A bare `.npy` array, or `error` saying what is wrong with the file."""
    try:
        with open(path, "rb") as f:
            size = Path(path).stat().st_size
            if size == 0:
                raise error(f"{path}: the file is empty")
            return _read_array(f, str(path), size, error, max_bytes).copy()
    except OSError as e:
        raise error(f"{path}: cannot read it ({e.strerror or e})") from e


def read_npz(path: Path, error: type[CodecportError], max_bytes: int = MAX_BYTES,
             max_members: int = 256) -> dict[str, np.ndarray]:
    """Every array of a `.npz` (`np.savez` or `np.savez_compressed`), by name, with each
    member's declared size, compression ratio and header checked before it is inflated."""
    try:
        if Path(path).stat().st_size == 0:
            raise error(f"{path}: the file is empty")
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            if len(infos) > max_members:
                raise error(f"{path}: holds {len(infos)} members, more than an export or codes "
                            f"file ({max_members})")
            total = sum(i.file_size for i in infos)
            if total > max_bytes:
                raise error(f"{path}: its members add up to {total / 2**20:.0f} MiB, more than "
                            f"codecport reads ({max_bytes / 2**20:.0f} MiB)")
            out = {}
            for info in infos:
                what = f"{path}[{info.filename}]"
                if not info.filename.endswith(".npy"):
                    raise error(f"{what}: not an array; is this a file written by codecport?")
                ratio = info.file_size / max(info.compress_size, 1)
                if info.compress_type != zipfile.ZIP_STORED and ratio > MAX_RATIO and info.file_size > SMALL:
                    raise error(f"{what}: would inflate {ratio:.0f} times to {info.file_size / 2**20:.0f} "
                                "MiB; refusing a likely zip bomb")
                with z.open(info) as f:
                    out[info.filename[:-len(".npy")]] = _read_array(f, what, info.file_size, error, max_bytes)
            return out
    except zipfile.BadZipFile as e:
        raise error(f"{path}: not a readable .npz archive ({e})") from e
    except (OSError, EOFError, ValueError, NotImplementedError, RuntimeError) as e:
        # zipfile raises bare OSError/EOFError on truncation, ValueError/NotImplementedError on
        # an unknown compression, RuntimeError on a member marked encrypted
        raise error(f"{path}: the archive is damaged ({e})") from e
