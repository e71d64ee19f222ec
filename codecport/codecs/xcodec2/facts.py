"""XCodec2's part of codec-bench: NeuCodec's (codecs/neucodec/facts.py), with the official `xcodec2`
package (installed without its pins: scripts/official-neucodec.txt) as the official contender."""

from __future__ import annotations

from ..neucodec.facts import family_facts, import_stubbed, offline, run_package

RELEASED = ("xcodec2",)  # the official package builds this config only (its sizes are fixed)


def import_official():
    """The official `xcodec2` package's model module, imported offline."""
    mx, _ = import_stubbed("xcodec2.modeling_xcodec2", "xcodec2.configuration_bigcodec")
    return mx


def build_official(mx, semantic_layers: int = 24, intermediate: int | None = None):
    """The official `XCodec2Model(BigCodecConfig())`, built offline."""
    from xcodec2.configuration_bigcodec import BigCodecConfig

    return offline(mx, lambda: mx.XCodec2Model(BigCodecConfig()), semantic_layers, intermediate)


def run_official(job: dict) -> dict:
    """The official package on the bench's weights: `encode_code` on 16 kHz audio `[1, T]` (it
    reads the first row's features only, so one clip a call), `decode_code`."""
    try:
        mx = import_official()
    except ImportError as e:
        return {"skipped": f"xcodec2 does not import ({e})"}
    from .weights import XCODEC2

    return run_package(job, build_official(mx), "xcodec2", lambda x: x[:, 0], XCODEC2.to_official)


FACTS = family_facts("xcodec2", RELEASED, run_official)
