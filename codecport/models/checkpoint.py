"""Checkpoint reading shared by the codecs: strict loading, safetensors, transformers folders."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import CheckpointError


def load_state(model: torch.nn.Module, sd: dict[str, torch.Tensor], source: str) -> None:
    """Strict load that names the first missing/unexpected key or mismatched shape."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    if missing:
        raise CheckpointError(f"{source}: missing key {missing[0]} ({len(missing)} missing); "
                              "is this a checkpoint of this model and variant?")
    if unexpected:
        raise CheckpointError(f"{source}: unexpected key {unexpected[0]} ({len(unexpected)} "
                              "unexpected); is this a checkpoint of this model and variant?")
    for k, v in expected.items():
        if tuple(sd[k].shape) != tuple(v.shape):
            raise CheckpointError(f"{source}: {k} has shape {tuple(sd[k].shape)}, the model "
                                  f"expects {tuple(v.shape)}; the config does not match the weights")
    model.load_state_dict({k: v.float() for k, v in sd.items()})


def read_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    """All tensors of `files` (safetensors never runs code while reading)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            sd.update(load_file(f))
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{f}: not a readable safetensors file ({e}); re-download it") from e
    return sd


def transformers_folder(path: Path) -> tuple[dict, list[Path]]:
    """(config.json, safetensors files) of a transformers checkpoint: a folder, or one of its
    safetensors files."""
    folder = path if path.is_dir() else path.parent
    files = sorted(folder.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not (folder / "config.json").is_file():
        raise CheckpointError(f"{path}: a transformers checkpoint needs config.json and "
                              "*.safetensors in one folder")
    try:
        conf = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder}/config.json: unreadable ({e})") from e
    if not isinstance(conf, dict):
        raise CheckpointError(f"{folder}/config.json: not a config (a JSON object of settings)")
    return conf, files
