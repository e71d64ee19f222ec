"""Loading DAC weights: official `.pth`, transformers safetensors, or a released model by name."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

from ...errors import CheckpointError, ConfigError
from ...models.checkpoint import (
    fold_weight_norm,
    load_state,
    load_torch,
    read_safetensors,
    transformers_folder,
    unfold_weight_norm,  # noqa: F401 (the bench and tests use it from here)
)
from ...models.hub import cache_dir, download, resolve, sha256_file
from .config import RELEASES
from .model import DAC, PRESETS, DacConfig

log = logging.getLogger(__name__)

RELEASE_BASE = "https://github.com/descriptinc/descript-audio-codec/releases/download"
HINT = "pass an official DAC .pth, a transformers DacModel folder, or a released name"
BASE_URL_ENV = "CODECPORT_DAC_BASE_URL"  # mirror (or test server) laid out as <base>/<tag>/<file>


def release_url(name: str) -> str:
    tag, file = RELEASES[name]
    return f"{os.environ.get(BASE_URL_ENV, RELEASE_BASE).rstrip('/')}/{tag}/{file}"


def read_official(path: Path) -> tuple[dict[str, torch.Tensor], DacConfig | None]:
    """State dict (weight norm folded) and config of an official `.pth`."""
    ckpt = load_torch(path, HINT)
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path}: expected a dict with 'state_dict', got {type(ckpt).__name__}")
    sd = ckpt.get("state_dict", ckpt)
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: 'state_dict' is not a mapping of names to tensors")
    kwargs = (ckpt.get("metadata") or {}).get("kwargs") if isinstance(ckpt.get("metadata"), dict) else None
    cfg = DacConfig.from_kwargs(kwargs) if isinstance(kwargs, dict) else None
    return fold_weight_norm(sd), cfg


# transformers residual-unit part -> index in the official nn.Sequential.
_RU_INDEX = {"snake1": 0, "conv1": 1, "snake2": 2, "conv2": 3}


def _hf_to_official(key: str, n_blocks: int) -> str:
    m = re.match(r"^(encoder|decoder)\.block\.(\d+)\.res_unit(\d)\.(snake1|conv1|snake2|conv2)\.(.*)$", key)
    if m:
        side, k, j, part, rest = m.groups()
        if side == "encoder":
            return f"encoder.block.{int(k) + 1}.block.{int(j) - 1}.block.{_RU_INDEX[part]}.{rest}"
        return f"decoder.model.{int(k) + 1}.block.{int(j) + 1}.block.{_RU_INDEX[part]}.{rest}"
    m = re.match(r"^encoder\.block\.(\d+)\.(snake1|conv1)\.(.*)$", key)
    if m:
        k, part, rest = m.groups()
        return f"encoder.block.{int(k) + 1}.block.{3 if part == 'snake1' else 4}.{rest}"
    m = re.match(r"^decoder\.block\.(\d+)\.(snake1|conv_t1)\.(.*)$", key)
    if m:
        k, part, rest = m.groups()
        return f"decoder.model.{int(k) + 1}.block.{0 if part == 'snake1' else 1}.{rest}"
    for side, seq in (("encoder", "block"), ("decoder", "model")):
        m = re.match(rf"^{side}\.(conv1|snake1|conv2)\.(.*)$", key)
        if m:
            part, rest = m.groups()
            idx = {"conv1": 0, "snake1": n_blocks + 1, "conv2": n_blocks + 2}[part]
            return f"{side}.{seq}.{idx}.{rest}"
    return key


def read_transformers(path: Path) -> tuple[dict[str, torch.Tensor], DacConfig]:
    """State dict and config of a transformers `DacModel` folder (config.json + safetensors)."""
    conf, files = transformers_folder(path)
    sd = read_safetensors(files)
    if conf.get("model_type", "dac") != "dac":
        raise CheckpointError(f"{path}: config.json is for model_type {conf['model_type']!r}, not dac")
    try:
        rates = tuple(conf.get("downsampling_ratios", (2, 4, 8, 8)))
        enc_dim = int(conf.get("encoder_hidden_size", 64))
        latent = conf.get("hidden_size", enc_dim * 2 ** min(len(rates), 16))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: config.json is not DAC's ({e})") from e
    cfg = DacConfig.from_kwargs({
        "sample_rate": conf.get("sampling_rate", 16000), "encoder_dim": enc_dim,
        "encoder_rates": rates, "latent_dim": latent,
        "decoder_dim": conf.get("decoder_hidden_size", 1536),
        "decoder_rates": conf.get("upsampling_ratios", rates[::-1]),
        "n_codebooks": conf.get("n_codebooks", 9), "codebook_size": conf.get("codebook_size", 1024),
        "codebook_dim": conf.get("codebook_dim", 8),
    })
    sd = fold_weight_norm(sd)
    return {_hf_to_official(k, len(rates)): v for k, v in sd.items()}, cfg


def resolve_weights(weights: str) -> Path:
    """A released name, URL or local path -> a local file or folder (downloading if needed)."""
    return resolve(weights, {name: (lambda name=name: download(release_url(name), cache_dir() / "dac" /
                                                                RELEASES[name][0] / RELEASES[name][1]))
                             for name in RELEASES})


def load(weights: str, preset: str | None = None, revision: str | None = None,
         polyphase: bool = True) -> tuple[DAC, str]:
    """Model with weights loaded, and the sha256 of the weights file (for export metadata).

    The config comes from the checkpoint when it carries one, else from `preset`. DAC's
    releases are GitHub assets, which have no revisions.
    """
    if revision is not None:
        raise CheckpointError("--revision is for weights on Hugging Face; DAC's releases are GitHub "
                              "assets (pass --weights URL for another file)")
    path = resolve_weights(weights)
    if path.is_dir() or path.suffix == ".safetensors":
        sd, cfg = read_transformers(path)
        digest = sha256_file(*(sorted(path.glob("*.safetensors")) if path.is_dir() else [path]))
    else:
        sd, cfg = read_official(path)
        digest = sha256_file(path)
    if cfg is None:
        if preset is None:
            raise CheckpointError(f"{path}: the checkpoint carries no config; pass --preset")
        cfg = PRESETS[preset]
    elif preset is not None and cfg != PRESETS[preset]:
        log.warning("the checkpoint's config differs from preset %s; using the checkpoint's", preset)
    model = DAC(cfg, polyphase=polyphase)
    load_state(model, sd, str(path))
    return model.eval(), digest


load_dac = load  # the name the scripts and tests use
