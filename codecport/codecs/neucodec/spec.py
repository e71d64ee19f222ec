"""NeuCodec's declaration: what the front ends need before anything of it is loaded."""

from __future__ import annotations

from ...registry.spec import BUCKETS, CodecSpec

SPEC = CodecSpec(
    "neucodec", "NeuCodecCodec", default_preset="neucodec", package=__package__, web=True,
    export_options=(BUCKETS,),
    smoke=("--preset", "tiny", "--len", "4000"))  # 0.5 s: 25 frames at the tiny preset's 8 kHz
