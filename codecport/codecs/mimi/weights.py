"""Loading Mimi weights: moshi's safetensors, transformers' `MimiModel` folder, or by name."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import torch

from ...errors import CheckpointError, ConfigError
from ...models.checkpoint import load_state, read_safetensors, transformers_folder
from ...models.hub import hf_file, resolve, sha256_file
from ...models.limits import check_int, check_ints
from .config import RELEASES
from .model import PRESETS, MimiConfig, MimiModel

log = logging.getLogger(__name__)



def moshi_config(cfg: MimiConfig) -> dict:
    """moshi's `_mimi_config` with the sizes of `cfg`: what `moshi.models.loaders.get_mimi(path,
    moshi_config(cfg))` needs to build moshi's own model of this config (the bench's official
    contender, scripts/check_official_mimi.py)."""
    seanet = {"channels": 1, "dimension": cfg.dimension, "causal": True, "n_filters": cfg.n_filters,
              "n_residual_layers": 1, "activation": "ELU", "compress": cfg.compress,
              "dilation_base": 2, "disable_norm_outer_blocks": 0, "kernel_size": cfg.kernel_size,
              "residual_kernel_size": cfg.residual_kernel_size,
              "last_kernel_size": cfg.last_kernel_size, "norm": "none", "pad_mode": "constant",
              "ratios": list(cfg.ratios), "true_skip": True}
    return {
        "sample_rate": cfg.sample_rate, "channels": 1, "frame_rate": cfg.frame_rate, "seanet": seanet,
        "quantizer": {"dimension": cfg.codebook_dim, "n_q": cfg.n_codebooks, "bins": cfg.codebook_size,
                      "input_dimension": cfg.dimension, "output_dimension": cfg.dimension},
        "transformer": {"d_model": cfg.dimension, "num_heads": cfg.n_heads, "num_layers": cfg.n_layers,
                        "causal": True, "layer_scale": 0.01, "context": cfg.context,
                        "conv_layout": True, "max_period": cfg.max_period, "gating": "none",
                        "norm": "layer_norm", "positional_embedding": "rope",
                        "dim_feedforward": cfg.ffn, "input_dimension": cfg.dimension,
                        "output_dimensions": [cfg.dimension]},
    }


def read_official(path: Path) -> dict[str, torch.Tensor]:
    """moshi's state dict, with both attention spellings mapped to `in_proj_weight`/`out_proj`.

    moshi >= 0.2 renames `in_proj_weight` -> `in_projs.0.weight` and `out_proj.weight` ->
    `out_projs.0.weight` when it loads; files written by it may carry either spelling.
    """
    sd = read_safetensors([path])
    out = {}
    for k, v in sd.items():
        k = re.sub(r"\.in_projs\.0\.weight$", ".in_proj_weight", k)
        k = re.sub(r"\.out_projs\.0\.weight$", ".out_proj.weight", k)
        out[k] = v
    return out


def _unpermute_rope(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo transformers' conversion permutation of q/k rows (interleaved -> rotate-half).

    The conversion applies `w.view(h, d/2, 2, C).transpose(1, 2)`: rows (2i, 2i+1) of each head
    move to (i, i + d/2), so rotate-half RoPE rotates the same pairs. The inverse puts them back
    for our interleaved RoPE.
    """
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


_HF_LAYER = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2", "mlp.fc1": "linear1",
             "mlp.fc2": "linear2", "self_attn_layer_scale": "layer_scale_1",
             "mlp_layer_scale": "layer_scale_2", "self_attn.o_proj": "self_attn.out_proj"}
_HF_RVQ = {"semantic_residual_vector_quantizer": "rvq_first",
           "acoustic_residual_vector_quantizer": "rvq_rest"}
_HF_CODEBOOK = {"embed_sum": "embedding_sum", "cluster_usage": "cluster_usage",
                "initialized": "_initialized"}


def _hf_key(key: str, expected: set[str]) -> str:
    m = re.match(r"^(encoder|decoder)\.layers\.(\d+)\.(block\.\d+\.)?conv\.(weight|bias)$", key)
    if m:
        side, i, block, w = m.groups()
        name = f"{side}.model.{i}.{block or ''}conv.conv.{w}"
        return name if name in expected else f"{side}.model.{i}.convtr.convtr.{w}"
    m = re.match(r"^(encoder|decoder)_transformer\.layers\.(\d+)\.(.+)\.(weight|bias|scale)$", key)
    if m:
        side, j, part, w = m.groups()
        return f"{side}_transformer.transformer.layers.{j}.{_HF_LAYER.get(part, part)}.{w}"
    m = re.match(r"^quantizer\.(\w+)\.layers\.(\d+)\.codebook\.(\w+)$", key)
    if m and m.group(1) in _HF_RVQ:
        rvq, i, buf = m.groups()
        return f"quantizer.{_HF_RVQ[rvq]}.vq.layers.{i}._codebook.{_HF_CODEBOOK.get(buf, buf)}"
    m = re.match(r"^quantizer\.(\w+)\.(input_proj|output_proj)\.weight$", key)
    if m and m.group(1) in _HF_RVQ:
        return f"quantizer.{_HF_RVQ[m.group(1)]}.{m.group(2)}.weight"
    return {"downsample.conv.weight": "downsample.conv.conv.conv.weight",
            "upsample.conv.weight": "upsample.convtr.convtr.convtr.weight"}.get(key, key)


def config_from_transformers(conf: dict, source: str) -> MimiConfig:
    """`MimiConfig` from transformers' config.json; refuses options Mimi's export does not model."""
    if conf.get("model_type", "mimi") != "mimi":
        raise CheckpointError(f"{source}: config.json is for model_type {conf['model_type']!r}, not mimi")
    heads = conf.get("num_attention_heads", 8)
    unsupported = {"use_causal_conv": True, "num_residual_layers": 1, "use_conv_shortcut": False,
                   "pad_mode": "constant", "audio_channels": 1, "trim_right_ratio": 1.0,
                   "num_key_value_heads": heads, "hidden_act": "gelu", "norm_eps": 1e-5}
    for key, want in unsupported.items():
        # Only what the file says: a default taken from a bad field (heads NaN) is not the file's.
        if key in conf and conf[key] != want:
            raise CheckpointError(f"{source}: config {key}={conf[key]!r} is not supported "
                                  f"(Mimi uses {want!r})")
    try:
        return _config(conf, heads)
    except (TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError) as e:
        raise ConfigError(f"{source}: config.json is not Mimi's ({e})") from e


def _config(conf: dict, heads: int) -> MimiConfig:
    sr, ratios = conf.get("sampling_rate", 24000), conf.get("upsampling_ratios") or [8, 6, 5, 4]
    # Checked before the frame rate is derived from them: the product of a list holding a list
    # repeats that list (a config.json saying [[1, 2], 88061255015] asked for terabytes).
    check_int("sampling_rate", sr, 1_000, 1_000_000)
    check_ints("upsampling_ratios", tuple(ratios) if isinstance(ratios, list) else ratios, 1, 64, 8)
    # transformers saves `_frame_rate: null` unless one was given and then derives the rate from a
    # stride-2 downsample (its `frame_size`); a fixed 12.5 Hz fits the released ratios only.
    frame_rate = conf.get("_frame_rate") or conf.get("frame_rate") or sr / (2 * math.prod(ratios))
    rope = conf.get("rope_parameters") or {}
    return MimiConfig(
        sample_rate=sr, n_filters=conf.get("num_filters", 64), ratios=tuple(ratios),
        dimension=conf.get("hidden_size", 512), kernel_size=conf.get("kernel_size", 7),
        last_kernel_size=conf.get("last_kernel_size", 3),
        residual_kernel_size=conf.get("residual_kernel_size", 3), compress=conf.get("compress", 2),
        n_heads=heads, n_layers=conf.get("num_hidden_layers", 8),
        ffn=conf.get("intermediate_size", 2048), context=conf.get("sliding_window", 250),
        max_period=float(rope.get("rope_theta", conf.get("rope_theta", 10000.0))),
        downsample_stride=round(math.ceil(sr / math.prod(ratios)) / frame_rate),
        n_codebooks=conf.get("num_quantizers", 32), n_semantic=conf.get("num_semantic_quantizers", 1),
        codebook_size=conf.get("codebook_size", 2048),
        codebook_dim=conf.get("vector_quantization_hidden_dimension", 256))


def read_transformers(path: Path) -> tuple[dict[str, torch.Tensor], MimiConfig]:
    """State dict (moshi names) and config of a transformers `MimiModel` folder."""
    conf, files = transformers_folder(path)
    cfg = config_from_transformers(conf, str(path))
    return from_transformers(read_safetensors(files), cfg, path), cfg


def from_transformers(sd: dict[str, torch.Tensor], cfg: MimiConfig, path) -> dict[str, torch.Tensor]:
    """A transformers `MimiModel` state dict (of config `cfg`) under moshi's names: what a
    `MimiModel` loads. `path` names the file in errors."""
    expected = set(MimiModel(cfg).state_dict())
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in sd.items():
        m = re.match(r"^(\w+_transformer\.layers\.\d+)\.self_attn\.([qkv])_proj\.weight$", k)
        if m:
            qkv.setdefault(m.group(1), {})[m.group(2)] = v
        else:
            out[_hf_key(k, expected)] = v
    for stem, parts in qkv.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(f"{path}: {stem}.self_attn lacks one of q_proj/k_proj/v_proj")
        bad = next((n for n in "qkv" if tuple(parts[n].shape) != (cfg.dimension, cfg.dimension)), None)
        if bad is not None:  # (the rope un-permutation and the concatenation would fail inside torch)
            raise CheckpointError(f"{path}: {stem}.self_attn.{bad}_proj.weight has shape "
                                  f"{tuple(parts[bad].shape)}, the config's hidden_size asks for "
                                  f"{(cfg.dimension, cfg.dimension)}; the config does not match the weights")
        side, j = stem.split(".layers.")
        out[f"{side}.transformer.layers.{j}.self_attn.in_proj_weight"] = torch.cat([
            _unpermute_rope(parts["q"], cfg.n_heads), _unpermute_rope(parts["k"], cfg.n_heads),
            parts["v"]])
    return out


def _is_transformers_file(path: Path) -> bool:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "pt") as f:
            names = list(f.keys())
    except (SafetensorError, OSError):  # unreadable: the official reader reports it properly
        return False
    return any(k.startswith("encoder.layers.") for k in names)


def resolve_weights(weights: str, revision: str | None = None) -> Path:
    """A released name, URL or local path -> a local file or folder (downloading if needed)."""
    if revision is not None and weights not in RELEASES:
        raise CheckpointError("--revision picks a revision of a released name on Hugging Face; "
                              f"{weights} is a path or URL")
    return resolve(weights, {name: (lambda name=name: hf_file(*RELEASES[name], revision=revision))
                             for name in RELEASES})


def load(weights: str, preset: str | None = None, revision: str | None = None,
         polyphase: bool = True) -> tuple[MimiModel, str]:
    """Model with weights loaded, and the sha256 of the weights file(s).

    A transformers folder (or its safetensors beside config.json) brings its own config; moshi's
    file carries none, so it takes preset `preset` (default `mimi`).
    """
    path = resolve_weights(weights, revision)
    if path.is_dir() or (path.suffix == ".safetensors" and _is_transformers_file(path)):
        sd, cfg = read_transformers(path)
        digest = sha256_file(*(sorted(path.glob("*.safetensors")) if path.is_dir() else [path]))
        if preset is not None and cfg != PRESETS[preset]:
            log.warning("the checkpoint's config differs from preset %s; using the checkpoint's", preset)
    elif path.suffix == ".safetensors":
        sd, cfg, digest = read_official(path), PRESETS[preset or "mimi"], sha256_file(path)
    else:
        raise CheckpointError(f"{path}: Mimi weights are .safetensors (moshi's file or a "
                              "transformers folder); other formats are not read")
    model = MimiModel(cfg, polyphase=polyphase)
    load_state(model, sd, str(path))
    return model.eval(), digest


load_mimi = load  # the name the scripts and tests use
