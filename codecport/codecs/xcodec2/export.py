"""XCodec2 -> fixed-shape ONNX graphs: NeuCodec's exporter (codecs/neucodec/export.py) on XCodec2's
config, the folder marked as XCodec2's. The same two graphs (no DFT, no ConvTranspose, no Gather;
a mask for shorter clips), the decoder at 16 kHz and 320 samples a frame. `--len N` holds a clip
of N samples: `N // 320 + 1` frames, the official pad's frame included (`frames_of`)."""

from __future__ import annotations

from pathlib import Path

from ...errors import ExportError
from ...export.deviation import Probe
from ...export.graph import GraphSpec
from ..neucodec import export as neucodec
from ..neucodec.model import NeuCodec
from .runtime import XCodec2Codec

describe = neucodec.describe
check_options = neucodec.check_options

# Why `codec-export xcodec2` needs --len (the CLI asks before loading any weights).
LEN_NEEDED = ("the samples (at the rate it decodes to, 16 kHz for the released model) of the longest "
              "clip the fixed graphs encode and decode exactly in one call (shorter ones are masked, "
              "longer ones go through cross-faded windows)")


def export(model: NeuCodec, out_dir: Path, length: int | None, *, options: dict, **common) -> dict:
    """`codec-export xcodec2`: the encoder and decoder for `--len`."""
    if length is None:
        raise ExportError(f"pass --len N: {LEN_NEEDED}")
    return neucodec.export_neucodec(model, out_dir, length, runtime=XCodec2Codec,
                                    buckets=neucodec.parse_buckets(options.get("buckets")), **common)


def probe(manifest: dict, specs: list[GraphSpec] = ()) -> Probe:
    return neucodec.probe(manifest, specs, XCodec2Codec)
