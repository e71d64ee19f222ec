"""SNAC's declaration: what the front ends need before anything of it is loaded."""

from __future__ import annotations

from ...registry.spec import SLOTS, CodecSpec, Option

SPEC = CodecSpec(
    "snac", "SnacCodec", default_preset="24khz", package=__package__, codes_file=True,
    export_options=(
        Option("--step-frames", int, 1, "Window units the step decoder (decoder_step.onnx) gives audio "
                                        "for per call: a unit is a coarse frame at 24 kHz, four (one "
                                        "attention window) at 32 and 44 kHz.", minimum=1,
               aliases=("--stream-frames",)),
        SLOTS,
    ),
    smoke=("--preset", "tiny", "--len", "4800"))
