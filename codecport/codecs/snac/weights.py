"""Loading SNAC weights in the official Hugging Face layout: `config.json` (the model's kwargs)
beside `pytorch_model.bin` (a state dict, weight norm unfolded), by released name through the
Hub client, from a folder, or a `.bin` file with `--preset` (or a config.json beside it).

The official `SNAC.from_pretrained` calls `torch.load` without `weights_only`, which runs any
code a pickle holds; here the state dict is read with `weights_only=True`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ...errors import CheckpointError, ConfigError
from ...models.checkpoint import fold_weight_norm, load_state, load_torch, read_json
from ...models.hub import hf_file, resolve, sha256_file
from .config import CONFIG_FILE, RELEASES, WEIGHTS_FILE
from .model import PRESETS, SNAC, SnacConfig

log = logging.getLogger(__name__)
HINT = "pass a SNAC folder (config.json + pytorch_model.bin), its pytorch_model.bin, or a released name"


def _release(name: str, revision: str | None) -> Path:
    """The released model's folder in the Hugging Face cache (both files fetched)."""
    repo = RELEASES[name]
    weights = hf_file(repo, WEIGHTS_FILE, revision)
    config = hf_file(repo, CONFIG_FILE, revision)
    if config.parent != weights.parent:  # one snapshot holds both; anything else is a torn cache
        raise CheckpointError(f"{repo}: config.json and {WEIGHTS_FILE} came from different revisions; "
                              "pass --revision")
    return weights.parent


def read_config(path: Path) -> SnacConfig:
    """`SnacConfig` of a `config.json`, every field checked."""
    try:
        conf = read_json(path)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable config ({e}); re-download it") from e
    try:
        return SnacConfig.from_kwargs(conf)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of a `pytorch_model.bin`, weight norm folded."""
    sd = load_torch(path, HINT)
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: not a state dict (a mapping of names to tensors); {HINT}")
    return fold_weight_norm(sd)


def load(weights: str, preset: str | None = None, revision: str | None = None) -> tuple[SNAC, str]:
    """Model with weights loaded, and the sha256 of the weights file (for export metadata)."""
    releases = {name: (lambda name=name: _release(name, revision)) for name in RELEASES}
    if revision is not None and weights not in RELEASES:
        raise CheckpointError("--revision is for weights fetched from Hugging Face by released name "
                              f"({', '.join(RELEASES)})")
    path = resolve(weights, releases)
    folder, file = (path, path / WEIGHTS_FILE) if path.is_dir() else (path.parent, path)
    if not file.is_file():
        raise CheckpointError(f"{folder}: has no {WEIGHTS_FILE}; {HINT}")
    config = folder / CONFIG_FILE
    if config.is_file():
        cfg = read_config(config)
        if preset is not None and cfg != PRESETS[preset]:
            log.warning("the checkpoint's config differs from preset %s; using the checkpoint's", preset)
    elif preset is not None:
        cfg = PRESETS[preset]
    else:
        raise CheckpointError(f"{folder}: no config.json beside the weights; pass --preset")
    model = SNAC(cfg)
    sd = read_state(file)
    # The official checkpoints carry the rotary table's inverse frequencies; a model without
    # attention has none, and a file without them gets the ones the model computes.
    for key, value in model.state_dict().items():
        if key.endswith("rel_pos.inv_freq"):
            sd.setdefault(key, value)
    load_state(model, sd, str(file))
    return model.eval(), sha256_file(file)
