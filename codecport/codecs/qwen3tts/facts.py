"""Qwen3-TTS tokenizer's part of codec-bench and the demo: our graphs against our torch reference
and the official package, qwen-tts, which pins transformers 4.57.3 and so runs in an environment of
its own (`--official-python`, official.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ...atomic import atomic_path
from ...bench.facts import BenchFacts, Official

log = logging.getLogger(__name__)
OFFICIAL = Path(__file__).with_name("official.py")


def _torch_encode(model, x, k):
    return model.encode(x, k)


def _torch_decode(model, arrays):
    import torch

    return model.decode(torch.from_numpy(arrays[0]))[:, 0].numpy()


def prepare_official(work: Path, python: Path) -> None:
    """The bench's weights as the official `save_pretrained` writes them (`official/`): its
    config.json, and model.safetensors under the names and shapes the official package itself
    lists for that config (official.py's `keys`). Where qwen-tts does not import, nothing is written
    and the contender says why."""
    from safetensors.torch import load_file, save_file

    from ...bench.run import run_worker
    from .config import Qwen3Config
    from .weights import official_config, to_official

    cfg = Qwen3Config.from_kwargs(json.loads((work / "config.json").read_text()))
    out = work / "official"
    out.mkdir(exist_ok=True)
    with atomic_path(out / "config.json") as tmp:
        tmp.write_text(json.dumps(official_config(cfg), indent=2))
    # absolute, not resolved: a venv's python is a symlink that must stay one
    listed = run_worker({"contender": "qwen-tts (listing its weights)", "dir": str(work),
                         "python": str(python.absolute()), "script": str(OFFICIAL),
                         "config": str(out / "config.json")})
    if "skipped" in listed:
        log.info("%s", listed["skipped"])
        return
    sd = to_official(load_file(work / "weights.safetensors"), {k: (tuple(s), d) for k, (s, d) in
                                                               listed["keys"].items()}, cfg)
    with atomic_path(out / "model.safetensors") as tmp:
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp))


FACTS = BenchFacts(
    demo_preset="tiny", demo_seconds=0.5, torch_encode=_torch_encode, torch_decode=_torch_decode,
    official=Official("qwen-tts", None, "pip install torch==2.13.0 qwen-tts==0.1.1 in an environment of its "
                      "own (it pins transformers 4.57.3) and pass --official-python ENV/bin/python",
                      script=OFFICIAL),
    prepare_official=prepare_official,
)
