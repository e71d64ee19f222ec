"""What codec-bench and the demo would need of the toy codec."""

from __future__ import annotations

from codecport.bench.facts import BenchFacts


def _torch_encode(model, x, k):
    return model.encode(x)[:, :k]


def _torch_decode(model, arrays):
    import torch

    return model.decode(torch.from_numpy(arrays[0]))[:, 0].numpy()


FACTS = BenchFacts(demo_preset="toy", demo_seconds=0.5, torch_encode=_torch_encode,
                   torch_decode=_torch_decode)
