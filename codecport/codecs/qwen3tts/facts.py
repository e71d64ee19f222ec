"""Qwen3-TTS tokenizer's part of codec-bench and the demo: our graphs against our torch reference
(the official `qwen-tts` pins transformers 4.57.3 and runs in an environment of its own:
scripts/official_qwen3tts.py, docs/qwen3tts.md)."""

from __future__ import annotations

from ...bench.facts import BenchFacts


def _torch_encode(model, x, k):
    return model.encode(x, k)


def _torch_decode(model, arrays):
    import torch

    return model.decode(torch.from_numpy(arrays[0]))[:, 0].numpy()


FACTS = BenchFacts(demo_preset="tiny", demo_seconds=0.5, torch_encode=_torch_encode,
                   torch_decode=_torch_decode)
