"""Mimi's declaration: what the front ends need before anything of it is loaded."""

from __future__ import annotations

from ...registry.spec import SLOTS, CodecSpec, Option

SPEC = CodecSpec(
    "mimi", "MimiCodec", default_preset="mimi", package=__package__, web=True,
    export_options=(
        Option("--step-frames", int, 1, "Code frames per call of the step graphs (80 ms each for "
                                        "the released Mimi).", minimum=1, aliases=("--frames",)),
        Option("--attention", ("whole-clip", "moshi-stream", "rustymimi"), "whole-clip",
               "Attention past 250 frames (10 s): equal to the whole clip (moshi's encode), "
               "moshi's streaming mode (step graphs), whose ring cache drops a step's oldest keys, "
               "or Kyutai's Rust Mimi (fixed and step graphs), which sees one key more.",
               aliases=("--window",)),
        SLOTS,
    ),
    # 0.1 s: the tiny preset's attention masks are constants of frames squared, so a short
    # fixed pair keeps the folder small (1.7 MiB at 0.2 s); the step graphs take any length.
    smoke=("--preset", "tiny", "--len", "2400"))
