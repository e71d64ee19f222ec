"""The wire protocol of `codec-serve` (docs/serve.md), shared by the server and the client: the
handshake's fields, the binary layouts of PCM and codes, and the refusals. No I/O here.

One WebSocket is one stream. The client's first message is a text JSON request (`Request`); the
server answers `{"op": "ready", ...}` with the codec's facts, then both sides send binary
messages: PCM as little-endian float32 (`f32`) or int16 (`s16`) mono samples; codes as
little-endian int32, a message holding whole (coarse) frames, level by level, coarse first, each
level `[codebooks, frames * codes_per_frame]` row-major (`CodeLayout`). In a duplex stream each
server message starts with a 4-byte tag (`CODE` or `WAVE`) saying which of the two it holds.
`{"op": "end"}` ends the input; the server sends the rest, then `{"op": "done"}`, and closes.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

import numpy as np

from ..errors import CodecportError

PROTOCOL = 1
OPS = ("encode", "decode", "duplex")
SIDES = {"encode": ("encoder",), "decode": ("decoder",), "duplex": ("encoder", "decoder")}
PCM_FORMATS = {"f32": np.dtype("<f4"), "s16": np.dtype("<i2")}
CODES_DTYPE = np.dtype("<i4")
TAG_CODES, TAG_AUDIO = b"CODE", b"WAVE"  # duplex only: what a server message holds
TEXT_LIMIT = 1 << 16  # bytes of a text message (the handshake, the end)
FIELDS = {"op", "protocol", "pcm", "sample_rate", "codebooks", "noise"}
RATES = (1_000, 1_000_000)  # input sample rates taken, Hz (as codec-run encode takes)

# The close code each refusal ends the WebSocket with (RFC 6455 section 7.4.1).
CLOSE_CODES = {"bad_request": 1008, "bad_input": 1008, "too_large": 1009, "busy": 1013,
               "timeout": 1008, "behind": 1008, "too_fast": 1008, "shutting_down": 1001, "internal": 1011}


class ProtocolError(CodecportError):
    """A message the server refuses: `code` (a key of `CLOSE_CODES`) and a one-line message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code

    def to_json(self) -> str:
        return error_message(self.code, str(self))


def error_message(code: str, message: str) -> str:
    return json.dumps({"op": "error", "code": code, "message": message})


@dataclass(frozen=True)
class CodeLayout:
    """Codes of a message: for each level (time scale, coarse first) `rows` codebooks of
    `per_frame` codes a coarse frame; a message of F frames holds, level after level, an int32
    block `[rows, F * per_frame]`, row-major."""

    levels: tuple[tuple[int, int], ...]  # (rows, per_frame) of each level
    codebook_size: int

    @classmethod
    def of(cls, codec, codebooks: int) -> CodeLayout:
        rows = codebooks // codec.levels
        coarse = codec.strides[0]
        return cls(tuple((rows, coarse // s) for s in codec.strides), codec.codebook_size)

    @property
    def frame_values(self) -> int:
        """int32 values per coarse frame over every level."""
        return sum(r * p for r, p in self.levels)

    def to_json(self) -> list[list[int]]:
        return [list(lv) for lv in self.levels]

    def pack(self, levels: list[np.ndarray]) -> bytes:
        """The message of `levels` (one `[rows, frames_l]` array per level)."""
        return b"".join(np.ascontiguousarray(a, CODES_DTYPE).tobytes() for a in levels)

    def frames(self, levels: list[np.ndarray]) -> int:
        return levels[0].shape[-1] // self.levels[0][1]

    def unpack(self, data: bytes) -> list[np.ndarray]:
        """`[rows, frames * per_frame]` int64 per level; `ProtocolError("bad_input")` for a length
        that is not whole frames or a code out of `[0, codebook_size)`."""
        size = self.frame_values * CODES_DTYPE.itemsize
        if len(data) % size:
            raise ProtocolError("bad_input", f"a codes message of {len(data)} bytes is not whole frames: "
                                             f"each frame is {self.frame_values} int32 codes ({size} bytes), "
                                             f"levels {self.to_json()} as [codebooks, codes a frame]")
        values = np.frombuffer(data, CODES_DTYPE)
        frames = len(values) // self.frame_values
        out, at = [], 0
        for rows, per in self.levels:
            n = rows * per * frames
            out.append(values[at:at + n].reshape(rows, per * frames).astype(np.int64))
            at += n
        if values.size and (values.min() < 0 or values.max() >= self.codebook_size):
            raise ProtocolError("bad_input", f"codes must be in [0, {self.codebook_size}), found "
                                             f"[{values.min()}, {values.max()}]; "
                                             "were they made by another model?")
        return out


def pcm_from_bytes(data: bytes, fmt: str) -> np.ndarray:
    """float32 samples of a PCM message (`s16` divided by 32768); `ProtocolError` for a length
    that is not whole samples or a sample that is NaN or infinite."""
    dtype = PCM_FORMATS[fmt]
    if len(data) % dtype.itemsize:
        raise ProtocolError("bad_input", f"a {fmt} PCM message holds whole {dtype.itemsize}-byte samples, "
                                         f"got {len(data)} bytes")
    x = np.frombuffer(data, dtype)
    if fmt == "s16":
        return x.astype(np.float32) / np.float32(32768)
    if not np.isfinite(x).all():
        raise ProtocolError("bad_input", "the PCM holds NaN or infinite samples; send finite float32 audio")
    return x.astype(np.float32)


def pcm_to_bytes(samples: np.ndarray, fmt: str) -> bytes:
    """A PCM message of float samples: float32, or int16 (x 32768, rounded, clipped)."""
    if fmt == "s16":
        return np.clip(np.round(samples * 32768), -32768, 32767).astype("<i2").tobytes()
    return np.ascontiguousarray(samples, "<f4").tobytes()


@dataclass(frozen=True)
class Request:
    """A client's handshake, checked against the codec: `op`, the PCM format (`pcm`) of what it
    sends (encode, duplex) or receives (decode, duplex), the input's `sample_rate`, the
    stream's `codebooks` (all levels counted), and the decoder's `noise` (a seed or "zero")."""

    op: str
    pcm: str
    sample_rate: int
    codebooks: int
    noise: int | str | None

    @property
    def sides(self) -> tuple[str, ...]:
        return SIDES[self.op]


def bad(message: str) -> ProtocolError:
    return ProtocolError("bad_request", message)


def _int(value, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad(f"{name} must be an integer from {lo} to {hi}, got {json.dumps(value)}")
    return value


def parse_json(text: str | bytes) -> dict:
    if len(text) > TEXT_LIMIT:
        raise ProtocolError("too_large", f"a text message holds at most {TEXT_LIMIT} bytes")
    try:
        msg = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"a text message must be JSON ({e})") from None
    except RecursionError:  # "[[[[...": json's parser recurses a level a bracket
        raise bad("a text message nests too deep; the protocol's messages are flat JSON objects") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise bad('a text message must be a JSON object with an "op"')
    return msg


def parse_request(text: str, codec) -> Request:
    """The handshake `text` as a `Request` for `codec`, or `ProtocolError` saying what is wrong."""
    msg = parse_json(text)
    op = msg["op"]
    if op not in OPS:
        raise bad(f"the first message's op must be one of {', '.join(OPS)}, got {op!r}")
    unknown = sorted(set(msg) - FIELDS)
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)}; the handshake takes {', '.join(sorted(FIELDS))}")
    version = msg.get("protocol", PROTOCOL)
    if type(version) is not int or version != PROTOCOL:  # true and 1.0 equal 1 in Python
        raise bad(f"this server speaks protocol {PROTOCOL}, the client asked for {version!r}")
    missing = [side for side in SIDES[op] if side not in codec.streams]
    if missing:
        have = " and ".join(codec.streams) or "no"
        raise bad(f"{codec.label} streams only its {have} side here, not its {missing[0]}; ask for "
                  + " or ".join(o for o in OPS if all(s in codec.streams for s in SIDES[o])))
    pcm = msg.get("pcm", "f32")
    if not isinstance(pcm, str) or pcm not in PCM_FORMATS:
        raise bad(f"pcm must be one of {', '.join(PCM_FORMATS)}, got {json.dumps(pcm)}")
    rate = codec.sample_rate
    if "sample_rate" in msg:
        if op == "decode":
            raise bad("a decode stream's audio comes at the model's rate; leave out sample_rate")
        rate = _int(msg["sample_rate"], "sample_rate", *RATES)
    k = msg.get("codebooks")
    if k is not None:
        k = _int(k, "codebooks", 1, codec.n_codebooks)
    try:
        k = codec.codebooks(k)
    except CodecportError as e:
        raise bad(str(e)) from None
    if op != "encode" and codec.quantizer == "graph" and k != codec.n_codebooks:
        raise bad(f"this {codec.label} folder's decoder has the quantizer inside and takes all "
                  f"{codec.n_codebooks} codebooks; ask for codebooks {codec.n_codebooks}")
    noise = msg.get("noise")
    if noise is not None:
        if op == "encode" or not codec.draws_noise:
            raise bad(f"{codec.label}'s {'encoder' if op == 'encode' else 'decoder'} draws no noise; "
                      "leave out noise")
        if noise != "zero":
            noise = _int(noise, "noise", 0, (1 << 63) - 1)
    elif op != "encode" and codec.draws_noise:
        noise = secrets.randbits(63)  # fresh noise, as the official decode; the reply says which
    return Request(op, pcm, rate, k, noise)



def ready_message(codec, request: Request, slots: dict) -> dict:
    """The server's answer to a handshake: the codec's facts and this stream's."""
    layout = CodeLayout.of(codec, request.codebooks)
    return {
        "op": "ready", "protocol": PROTOCOL, "codec": codec.name, "preset": codec.preset,
        "export_id": codec.export_id, "stream": request.op,
        "sample_rate": codec.sample_rate, "input_sample_rate": request.sample_rate, "pcm": request.pcm,
        "frame_size": codec.frame_size, "frame_rate": codec.frame_rate,
        "coarse_frame_samples": codec.frame_size * codec.strides[0],
        "codebooks": request.codebooks, "n_codebooks": codec.n_codebooks,
        "codebook_size": codec.codebook_size, "levels": codec.levels, "strides": list(codec.strides),
        "code_layout": layout.to_json(), "codes_dtype": "int32le", "group_frames": codec.group_frames,
        "noise": request.noise,
        "slot": {side: s.index for side, s in slots.items()},
        "step_frames": {side: s.step_frames for side, s in slots.items()},
        "runs": {side: s.runs for side, s in slots.items()},
        "latency": {side: {"frames": s.latency.frames, "samples": s.latency.samples}
                    for side, s in slots.items()},
    }

