"""An .onnx file's facts read from its protobuf, without onnxruntime or the onnx package (the
runtime imports neither to learn what a graph is): its metadata and its inputs' and outputs'
shapes. The file is walked field by field and what is not wanted (the nodes, the weights) is
skipped by its length, so reading the facts of a 160 MB graph reads a few kB of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..errors import ModelFileError

# The most bytes of strings (metadata, input, output and initializer names) `read_onnx` keeps: a
# real export's are a few kB, and a file that declares more is not ours.
MAX_FACTS = 16 << 20
CHUNK = 1 << 16  # bytes read at a time; the rest of a field not wanted is skipped by seeking


def read_onnx(path: Path, io: bool = True) -> tuple[dict[str, str], tuple[list, list] | None]:
    """(metadata, (inputs, outputs) as (name, shape) pairs in graph order, None unless `io`) of an
    .onnx file, from its protobuf without onnxruntime or onnx: ModelProto's fields are walked in
    the file, keeping field 14 (metadata_props: {1: key, 2: value}) and, of the graph (7), its
    inputs (11), outputs (12) and initializers' names (5, 8: ONNX Runtime's inputs leave those
    out); everything else (the nodes, the weights) is skipped by its length, never read into
    memory. A dimension is its dim_value, its dim_param, or None. A file that is not a whole
    protobuf is a `ModelFileError`."""
    size = path.stat().st_size
    meta: dict[str, str] = {}
    ins, outs, weights = [], [], set()
    with open(path, "rb") as f:
        r = _Fields(f, path)
        for number, wire, n in r.fields(size):
            if wire != 2 or number not in ((14, 7) if io else (14,)):
                continue
            end = r.pos + n
            if number == 14:
                entry = {k: r.text(m) for k, w, m in r.fields(end) if k in (1, 2) and w == 2}
                meta[entry.get(1, "")] = entry.get(2, "")
                continue
            for k, w, m in r.fields(end):
                if w == 2 and k == 5:
                    weights.update(r.text(j) for i, v, j in r.fields(r.pos + m) if i == 8 and v == 2)
                elif w == 2 and k in (11, 12):
                    (ins if k == 11 else outs).append(_value_info(r, r.pos + m))
    return meta, ([a for a in ins if a[0] not in weights], outs) if io else None


def _value_info(r: _Fields, end: int) -> tuple[str, tuple | None]:
    """(name, shape) of a ValueInfoProto {1: name, 2: TypeProto {1: tensor_type {2: shape {1: dim
    {1: dim_value, 2: dim_param}}}}}; the shape None where it declares none."""
    name, shape = "", None
    for k, w, n in r.fields(end):
        if k == 1 and w == 2:
            name = r.text(n)
        elif k == 2 and w == 2:
            for tensor in r.each(r.pos + n, 1):
                for dims in r.each(tensor, 2):
                    shape = tuple(_dim(r, d) for d in r.each(dims, 1))
    return name, shape


def _dim(r: _Fields, end: int) -> int | str | None:
    value = None
    for k, w, n in r.fields(end):
        if k == 1 and w == 0:
            value = n - (1 << 64) if n >= 1 << 63 else n  # an int64, two's complement
        elif k == 2 and w == 2:
            value = r.text(n)
    return value


class _Fields:
    """Protobuf fields read forward from a file: tags and lengths a chunk at a time, a field not
    wanted skipped by seeking past it, and at most `MAX_FACTS` bytes of strings kept, so that the
    memory stays bounded whatever the file holds."""

    def __init__(self, f: BinaryIO, path: Path):
        self.f, self.path, self.left = f, path, MAX_FACTS
        self.buf, self.at, self.base = b"", 0, 0  # buf: the file's bytes from base; the file is past it

    def damaged(self, why: str) -> ModelFileError:
        return ModelFileError(f"{self.path}: not a loadable model ({why}); re-run codec-export")

    @property
    def pos(self) -> int:
        return self.base + self.at

    def seek(self, pos: int) -> None:
        if pos <= self.base + len(self.buf):
            self.at = pos - self.base
        else:
            self.f.seek(pos)
            self.buf, self.at, self.base = b"", 0, pos

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.buf):
            rest = self.buf[self.at:]
            self.buf, self.at, self.base = rest + self.f.read(max(CHUNK, n - len(rest))), 0, self.pos
            if len(self.buf) < n:
                raise self.damaged(f"truncated at byte {self.base + len(self.buf)}")
        self.at += n
        return self.buf[self.at - n:self.at]

    def text(self, n: int) -> str:
        self.left -= n
        if self.left < 0:
            raise self.damaged(f"its names and metadata pass {MAX_FACTS} bytes")
        try:
            return self.take(n).decode()
        except UnicodeDecodeError:
            raise self.damaged(f"a string at byte {self.pos - n} is not UTF-8") from None

    def varint(self) -> int:
        value = 0
        for shift in range(0, 70, 7):
            b = self.take(1)[0]
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value
        raise self.damaged(f"a varint of more than 10 bytes at byte {self.pos}")

    def fields(self, end: int) -> Iterator[tuple[int, int, int]]:
        """(number, wire type, value) of each field of the message that ends at byte `end`: a
        varint's value, or a length-delimited field's length, which the caller reads or walks
        (`fields(pos + n)`) or leaves, to be skipped."""
        while self.pos < end:
            at = self.pos
            key = self.varint()
            number, wire = key >> 3, key & 7
            if number == 0:  # no protobuf field is numbered 0: zeros (a preallocated file), noise
                raise self.damaged(f"a field numbered 0 at byte {at}")
            if wire == 0:
                yield number, wire, self.varint()
            elif wire in (1, 5):
                self.seek(self.pos + (8 if wire == 1 else 4))
            elif wire == 2:
                n = self.varint()
                start = self.pos
                if start + n > end:
                    raise self.damaged(f"a field of {n} bytes at byte {start} runs past byte {end}, "
                                       "its message's end: truncated or damaged")
                yield number, wire, n
                if self.pos == start:
                    self.seek(start + n)
                elif self.pos != start + n:
                    raise self.damaged(f"a field at byte {start} ends inside another")
            else:
                raise self.damaged(f"a field of wire type {wire} at byte {at}")
        if self.pos != end:
            raise self.damaged(f"a field runs past byte {end}, its message's end: truncated or damaged")

    def each(self, end: int, number: int) -> Iterator[int]:
        """The end of each length-delimited field `number` of the message ending at `end`, the
        reader at its start."""
        for k, w, n in self.fields(end):
            if k == number and w == 2:
                yield self.pos + n
