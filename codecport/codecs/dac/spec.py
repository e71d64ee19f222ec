"""DAC's declaration: what the front ends need before anything of it is loaded."""

from __future__ import annotations

from ...registry.spec import CodecSpec, Option

SPEC = CodecSpec(
    "dac", "DacCodec", default_preset="44khz", package=__package__, web=True, codes_file=True,
    export_options=(
        Option("--chunk-len", int, None, "Samples of the chunked graphs' window, for long audio "
                                         "[default: --len].", minimum=1),
    ),
    # 2 s at 16 kHz: the tiny preset's hop is 6 samples, so each call of a 10 s graph (as this was
    # until 2026-12-03) ran 26 667 frames, and every DAC test paid for it.
    smoke=("--preset", "tiny", "--len", "32000"))
