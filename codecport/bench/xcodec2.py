"""XCodec2's part of codec-bench: NeuCodec's (bench/neucodec.py), with the official `xcodec2`
package (installed without its pins: scripts/official-neucodec.txt) as the official contender."""

from __future__ import annotations

from .facts import BenchFacts, Official
from .neucodec import PARTS, clip_samples, import_stubbed, run_package, torch_codes, torch_encode

RELEASED = "xcodec2"  # the official package builds this config only (its sizes are fixed)


def import_official():
    """The official `xcodec2` package's model module, imported offline."""
    mx, _ = import_stubbed("xcodec2.modeling_xcodec2", "xcodec2.configuration_bigcodec")
    return mx


def build_official(mx, semantic_layers: int = 24, intermediate: int | None = None):
    """The official `XCodec2Model(BigCodecConfig())`, built without the network: its
    `from_pretrained` calls for w2v-BERT 2.0 and its feature extractor get the released config
    (24 layers, as the official encode runs them all to read the 16th; `intermediate` narrows
    the feed-forward for tests) and transformers' extractor."""
    from unittest import mock

    from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertConfig, Wav2Vec2BertModel
    from xcodec2.configuration_bigcodec import BigCodecConfig

    w2v = Wav2Vec2BertConfig(num_hidden_layers=semantic_layers, output_hidden_states=True,
                             **({"intermediate_size": intermediate} if intermediate else {}))
    with mock.patch.object(mx.Wav2Vec2BertModel, "from_pretrained", lambda *a, **k: Wav2Vec2BertModel(w2v)), \
            mock.patch.object(mx.AutoFeatureExtractor, "from_pretrained",
                              lambda *a, **k: SeamlessM4TFeatureExtractor()):
        return mx.XCodec2Model(BigCodecConfig()).eval()


def run_official(job: dict) -> dict:
    """The official package on the bench's weights: `encode_code` on 16 kHz audio `[1, T]` (it
    reads the first row's features only, so one clip a call), `decode_code`."""
    try:
        mx = import_official()
    except ImportError as e:
        return {"skipped": f"xcodec2 does not import ({e})"}
    from ..models.xcodec2_weights import XCODEC2

    return run_package(job, build_official(mx), "xcodec2", lambda x: x[:, 0], XCODEC2.to_official)


FACTS = BenchFacts(
    # The released model is NeuCodec's size (hundreds of millions of parameters); the demo's stays small.
    demo_preset="tiny", demo_seconds=1.0, clip_samples=clip_samples,
    torch_encode=torch_encode, torch_codes=torch_codes,
    official=Official("xcodec2", "xcodec2", "pip install --no-deps -r scripts/official-neucodec.txt (its own "
                                            "pins would replace codecport's torch)"),
    contenders={"official": run_official},
    skip=lambda contender, preset: "the released config only (the official sizes are fixed)"
    if contender == "official" and preset != RELEASED else None,
    parts=PARTS,
)
