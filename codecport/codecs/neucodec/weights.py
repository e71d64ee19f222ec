"""Loading NeuCodec weights: the official `pytorch_model.bin` by released name (with w2v-BERT 2.0
from its own Hugging Face repo, as the official `from_pretrained` builds it), a folder, or a file.

The official `from_pretrained` calls `torch.load` without `weights_only`, which runs any code a
pickle holds; here the state dict is read with `weights_only=True`, and safetensors as they are.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ...errors import CheckpointError
from ...models.checkpoint import fold_weight_norm, load_state, load_torch, read_json, read_safetensors
from ...models.hub import hf_file, resolve, sha256_file
from .config import (
    DISTILL_CONFIGS,
    DISTILL_REPO,
    PRESETS,
    RELEASES,
    SEMANTIC_FILE,
    SEMANTIC_REPO,
    WEIGHTS_FILE,
)
from .model import NeuCodec, NeuCodecConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Family:
    """A codec built on NeuCodec's model: its presets, released repos and weights file."""

    label: str
    presets: dict[str, NeuCodecConfig]
    releases: dict[str, str]  # released name -> Hugging Face repo
    weights_file: str
    # Key suffixes its official checkpoints spell otherwise than ours: (theirs, ours).
    renames: tuple[tuple[str, str], ...] = ()

    def to_ours(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {_renamed(k, self.renames): v for k, v in sd.items()}

    def to_official(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {_renamed(k, tuple((b, a) for a, b in self.renames)): v for k, v in sd.items()}

    @property
    def hint(self) -> str:
        return (f"pass a {self.label} folder ({self.weights_file} or {_other(self.weights_file)}), such a "
                "file, or a released name")


def _renamed(key: str, renames: tuple[tuple[str, str], ...]) -> str:
    for old, new in renames:
        if key.endswith(old):
            return key[: -len(old)] + new
    return key


def _other(name: str) -> str:
    return "pytorch_model.bin" if name.endswith(".safetensors") else "model.safetensors"


NEUCODEC = Family("NeuCodec", PRESETS, RELEASES, WEIGHTS_FILE)
SEMANTIC_DIR = "w2v-bert-2.0"  # where a folder keeps its own copy of the semantic model
DISTILL_DIR = "distilhubert"  # the distilled variant's (weights and configs)
PREFIX = "semantic_model."
# Training-only parts the official loader drops too.
DROPPED = ("fc_post_s", "SemanticDecoder")


def read_state(path: Path, hint: str = NEUCODEC.hint) -> dict[str, torch.Tensor]:
    """The state dict of a `.safetensors` or torch file (a `{"state_dict": ...}` wrapper unwrapped)."""
    sd = read_safetensors([path]) if path.suffix == ".safetensors" else load_torch(path, hint)
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not sd or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path}: not a state dict (a mapping of names to tensors); {hint}")
    return sd


def _dims(cfg: NeuCodecConfig) -> dict[str, tuple[int, ...]]:
    """Shapes that tell the presets apart, from the config alone (the full model takes seconds)."""
    dims = {"fc_post_a.weight": (cfg.hidden, cfg.vq_dim),
            "generator.head.out.weight": (4 * cfg.hop + 2, cfg.hidden),
            "generator.quantizer.project_in.weight": (len(cfg.levels), cfg.vq_dim)}
    if cfg.distill:
        hubert = cfg.distill.hubert
        return {**dims, f"{PREFIX}feature_projection.projection.weight": (hubert.hidden, hubert.conv_dim),
                "fc_sq_prior.weight": (hubert.hidden, cfg.distill.feature)}
    return {**dims,
            f"{PREFIX}feature_projection.projection.weight": (cfg.semantic.hidden, cfg.semantic.features)}


# transformers' HubertConfig settings this model is written for (codecs/neucodec/distill.py).
HUBERT_FIXED = {"feat_extract_norm": "group", "do_stable_layer_norm": False, "conv_bias": False,
                "hidden_act": "gelu", "feat_extract_activation": "gelu"}


def _json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; the distilled NeuCodec needs {DISTILL_REPO}'s {path.name} "
                              f"beside its weights (in {path.parent}/), as the official model reads it")
    try:
        data = read_json(path)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a JSON config ({type(e).__name__}); "
                              f"fetch {DISTILL_REPO}'s {path.name} again") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: not a JSON object; fetch {DISTILL_REPO}'s {path.name} again")
    return data


def hubert_facts(cfg: NeuCodecConfig, config: Path, preprocessor: Path) -> NeuCodecConfig:
    """`cfg` with DistilHuBERT's heads, epsilon and input normalisation as its `config.json` and
    `preprocessor_config.json` say; a config this model does not compute is refused."""
    conf, pre = _json(config), _json(preprocessor)
    hubert = cfg.distill.hubert
    for key, want in HUBERT_FIXED.items():
        if conf.get(key, want) != want:
            raise CheckpointError(f"{config}: {key} is {conf[key]!r}; codecport computes DistilHuBERT with "
                                  f"{want!r} only")
    sizes = {"hidden_size": hubert.hidden, "num_hidden_layers": hubert.layers,
             "intermediate_size": hubert.intermediate,
             "num_conv_pos_embeddings": hubert.pos_kernel, "num_conv_pos_embedding_groups": hubert.pos_groups,
             "conv_kernel": list(hubert.conv_kernels), "conv_stride": list(hubert.conv_strides)}
    for key, want in sizes.items():
        if key in conf and conf[key] != want:
            raise CheckpointError(f"{config}: {key} is {conf[key]!r}, the weights' preset has {want!r}")
    # transformers' defaults where a file leaves a key out
    heads, eps, normalize = conf.get("num_attention_heads"), conf.get("layer_norm_eps", hubert.eps), \
        pre.get("do_normalize", True)
    proj_norm = conf.get("feat_proj_layer_norm", True)
    if type(heads) is not int or heads < 1 or hubert.hidden % heads or not isinstance(eps, float) or \
            not math.isfinite(eps) or eps <= 0 or \
            not isinstance(normalize, bool) or not isinstance(proj_norm, bool):
        raise CheckpointError(f"{config}: num_attention_heads, layer_norm_eps, feat_proj_layer_norm or "
                              "do_normalize is missing or not valid for these weights")
    hubert = replace(hubert, heads=heads, eps=eps, normalize=normalize, proj_norm=proj_norm)
    return replace(cfg, distill=replace(cfg.distill, hubert=hubert))


def _mismatch(sd: dict[str, torch.Tensor], cfg: NeuCodecConfig) -> str | None:
    for key, want in _dims(cfg).items():
        if key not in sd:
            return f"it has no {key}"
        if tuple(sd[key].shape) != want:
            return f"{key} has shape {tuple(sd[key].shape)}, not {want}"
    return None


def pick_preset(sd: dict[str, torch.Tensor], preset: str | None, source: str,
                family: Family = NEUCODEC) -> str:
    """`preset` if the checkpoint's shapes fit it, else the one preset they fit."""
    if preset is not None:
        if why := _mismatch(sd, family.presets[preset]):
            raise CheckpointError(f"{source}: not a checkpoint of preset {preset}: {why}")
        return preset
    reasons = {name: _mismatch(sd, cfg) for name, cfg in family.presets.items()}
    fits = [name for name, why in reasons.items() if why is None]
    if not fits:
        raise CheckpointError(f"{source}: fits no {family.label} preset (" +
                              "; ".join(f"{n}: {why}" for n, why in reasons.items()) + f"); {family.hint}")
    log.info("%s: preset %s", source, fits[0])
    return fits[0]


def _weights_file(path: Path, family: Family) -> Path:
    if not path.is_dir():
        return path
    # safetensors first: it cannot hold code, so it is the one to read when a folder has both.
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return path / name
    raise CheckpointError(f"{path}: has no pytorch_model.bin or model.safetensors; {family.hint}")


def load(weights: str, preset: str | None = None, revision: str | None = None,
         family: Family = NEUCODEC) -> tuple[NeuCodec, str]:
    """Model with weights loaded (eval mode), and the sha256 of the files read (for export metadata)."""
    releases = family.releases
    if revision is not None and weights not in releases:
        raise CheckpointError("--revision is for weights fetched from Hugging Face by released name "
                              f"({', '.join(releases)})")
    released = weights in releases
    path = resolve(weights, {name: (lambda name=name: hf_file(releases[name], family.weights_file, revision))
                             for name in releases})
    file = _weights_file(path, family)
    files, sd = [file], family.to_ours(read_state(file, family.hint))
    distill = any(k.startswith("fc_sq_prior.") for k in sd)  # the distilled variant's projection
    repo, folder, what = (DISTILL_REPO, DISTILL_DIR, "DistilHuBERT") if distill else \
        (SEMANTIC_REPO, SEMANTIC_DIR, "w2v-BERT 2.0")
    if not any(k.startswith(PREFIX) for k in sd):
        # The official checkpoint leaves the semantic model out: it comes from its own repo.
        if released:
            semantic = hf_file(repo, SEMANTIC_FILE)
        else:
            semantic = file.parent / folder / SEMANTIC_FILE
            if not semantic.is_file():
                raise CheckpointError(
                    f"{file}: the checkpoint holds no semantic model ({what}); put {repo}'s "
                    f"{SEMANTIC_FILE} in {file.parent / folder}/, or pass a state dict that "
                    f"includes {PREFIX}*")
        files.append(semantic)
        sd.update({PREFIX + k: v for k, v in read_safetensors([semantic]).items()})
    if distill:  # what its weights cannot show, from DistilHuBERT's own configs (as the official reads them)
        configs = [hf_file(DISTILL_REPO, f) if released else file.parent / DISTILL_DIR / f
                   for f in DISTILL_CONFIGS]
        files += configs
    name = pick_preset(sd, preset, str(file), family)
    cfg = family.presets[name]
    if distill:
        cfg = hubert_facts(cfg, *configs)
    model = NeuCodec(cfg)
    sd = fold_weight_norm({k: v for k, v in sd.items()
                           if not any(d in k for d in DROPPED) and not model.unused(k)})
    load_state(model, sd, str(file))
    return model.eval(), sha256_file(*files)
