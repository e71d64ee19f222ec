"""Qwen3-TTS tokenizer's declaration: what the front ends need before anything of it is loaded."""

from __future__ import annotations

from ...registry.spec import SLOTS, CodecSpec, Option

SPEC = CodecSpec(
    "qwen3tts", "Qwen3Codec", default_preset="12hz", package=__package__,
    export_options=(
        Option("--step-frames", int, 1, "Code frames per call of the decoder's step graph (80 ms each "
                                        "for the released model).", minimum=1),
        SLOTS,
    ),
    # 20 frames of the tiny preset's 24 samples: the decoder's window of 8 keys is passed.
    smoke=("--preset", "tiny", "--len", "480"))
