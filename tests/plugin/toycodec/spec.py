"""The toy codec's declaration (its distribution's `codecport.codecs` entry point names `SPEC`)."""

from __future__ import annotations

from codecport.registry import CodecSpec

SPEC = CodecSpec("toy", "ToyCodec", default_preset="toy", package=__package__,
                 smoke=("--len", "4000"))
