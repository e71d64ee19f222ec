"""XCodec2's declaration: what the front ends need before anything of it is loaded."""

from __future__ import annotations

from ...registry.spec import BUCKETS, CodecSpec

SPEC = CodecSpec(
    "xcodec2", "XCodec2Codec", default_preset="xcodec2", package=__package__, web=True,
    export_options=(BUCKETS,),
    smoke=("--preset", "tiny", "--len", "4000"))  # NeuCodec's model: its tiny preset, lined up as XCodec2
