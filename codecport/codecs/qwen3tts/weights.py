"""Loading Qwen3-TTS tokenizer weights: what the official `save_pretrained` writes (config.json,
model.safetensors and/or pytorch_model.bin), from a folder, or from Hugging Face by name: the
release (`12hz`, Qwen/Qwen3-TTS-Tokenizer-12Hz), any repo id, or a Qwen3-TTS model's
`speech_tokenizer/` (`Qwen/Qwen3-TTS-12Hz-1.7B-Base/speech_tokenizer`). Nothing is unpickled: a
`.bin` is read with `weights_only`, safetensors preferred when both are there."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from pathlib import Path

import torch

from ...errors import CheckpointError, ConfigError
from ...models.checkpoint import load_state, load_torch, read_json, read_safetensors
from ...models.hub import hf_file, resolve, sha256_file
from ...models.limits import check_int
from ..mimi.weights import config_from_transformers, from_transformers
from .config import FULL_CONTEXT, PRESETS, RELEASES, Qwen3Config
from .model import Qwen3Model

log = logging.getLogger(__name__)
HINT = ("pass the folder the official save_pretrained writes (config.json, model.safetensors), a "
        "Hugging Face repo id, or 12hz")
SAFETENSORS, BIN, CONFIG = "model.safetensors", "pytorch_model.bin", "config.json"
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+(/[\w.-]+)?$")
# What the decoder's config may say, and what this port models.
_DECODER = {"hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
            "num_semantic_quantizers": 1}


def read_config(conf: dict, source: str) -> Qwen3Config:
    """`Qwen3Config` of the official config.json (its `encoder_config` and `decoder_config`)."""
    if conf.get("model_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
        raise CheckpointError(f"{source}: config.json is for model_type {conf['model_type']!r}, not "
                              "qwen3_tts_tokenizer_12hz; " + HINT)
    enc, dec = conf.get("encoder_config"), conf.get("decoder_config")
    if not isinstance(enc, dict) or not isinstance(dec, dict):
        raise CheckpointError(f"{source}: config.json has no encoder_config and decoder_config; {HINT}")
    # The official encoder attends to the whole clip (transformers' eager and sdpa Mimi ignore
    # its sliding_window of 250): only flash-attention would window it.
    encoder = dataclasses.replace(config_from_transformers({**enc, "model_type": "mimi"}, source),
                                  context=FULL_CONTEXT)
    heads = dec.get("num_attention_heads", 16)
    try:
        # Before anything is derived from it: head_dim's default divides by it, and the key-value
        # heads are compared with it (a 0 there would blame them).
        check_int("decoder_config.num_attention_heads", heads, 1, 256)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    for key, want in {**_DECODER, "num_key_value_heads": heads}.items():
        if key in dec and dec[key] != want:
            raise CheckpointError(f"{source}: decoder_config {key}={dec[key]!r} is not supported "
                                  f"(Qwen3-TTS's tokenizer uses {want!r})")
    try:
        cfg = Qwen3Config(
            encoder=encoder, n_codebooks=conf.get("encoder_valid_num_quantizers", 16),
            codebook_size=dec.get("codebook_size", 2048), codebook_dim=dec["codebook_dim"],
            latent_dim=dec.get("latent_dim", 1024), hidden=dec.get("hidden_size", 512),
            ffn=dec.get("intermediate_size", 1024), n_layers=dec.get("num_hidden_layers", 8),
            n_heads=heads, head_dim=dec.get("head_dim", dec.get("hidden_size", 512) // heads),
            window=dec.get("sliding_window", 72), rope_theta=float(dec.get("rope_theta", 10000.0)),
            rms_eps=float(dec.get("rms_norm_eps", 1e-5)), decoder_dim=dec.get("decoder_dim", 1536),
            upsample_rates=tuple(dec.get("upsample_rates", (8, 5, 4, 3))),
            upsampling_ratios=tuple(dec.get("upsampling_ratios", (2, 2))))
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError) as e:
        raise ConfigError(f"{source}: config.json is not Qwen3-TTS tokenizer's ({e})") from e
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    if dec.get("num_quantizers", cfg.n_codebooks) != cfg.n_codebooks:
        raise ConfigError(f"{source}: the decoder takes {dec['num_quantizers']} codebooks, the encoder "
                          f"keeps {cfg.n_codebooks}")
    return cfg


def to_ours(sd: dict[str, torch.Tensor], cfg: Qwen3Config, model: Qwen3Model, source: str) -> dict:
    """The official state dict under our names: the encoder's through Mimi's transformers map,
    the decoder's causal convs one level deeper (`conv.conv`, `convtr.convtr`)."""
    expected = set(model.state_dict())
    enc = {k[len("encoder."):]: v for k, v in sd.items() if k.startswith("encoder.")}
    out = {f"encoder.{k}": v for k, v in from_transformers(enc, cfg.encoder, source).items()
           if k.split(".")[0] in ("encoder", "encoder_transformer", "downsample", "quantizer")}
    for k, v in sd.items():
        if not k.startswith("decoder.") or k.endswith("rotary_emb.inv_freq"):
            continue
        for ours in (k, re.sub(r"\.conv\.(weight|bias)$", r".conv.conv.\1", k),
                     re.sub(r"\.conv\.(weight|bias)$", r".convtr.convtr.\1", k)):
            if ours in expected:
                out[ours] = v
                break
        else:
            out[k] = v  # unexpected: load_state names it
    return out


def official_config(cfg: Qwen3Config) -> dict:
    """The official config.json of `cfg`, as `save_pretrained` writes it (`read_config` reads it
    back to `cfg`): what the bench's official contender builds the official model from."""
    e = cfg.encoder
    encoder = {
        "model_type": "mimi", "_frame_rate": e.frame_rate, "sampling_rate": e.sample_rate,
        "audio_channels": 1,
        "num_filters": e.n_filters, "upsampling_ratios": list(e.ratios), "kernel_size": e.kernel_size,
        "residual_kernel_size": e.residual_kernel_size, "last_kernel_size": e.last_kernel_size,
        "dilation_growth_rate": 2, "compress": e.compress, "num_residual_layers": 1, "use_causal_conv": True,
        "pad_mode": "constant", "use_conv_shortcut": False, "trim_right_ratio": 1.0,
        "hidden_size": e.dimension, "num_hidden_layers": e.n_layers, "num_attention_heads": e.n_heads,
        "num_key_value_heads": e.n_heads, "head_dim": e.dimension // e.n_heads,
        "intermediate_size": e.ffn, "hidden_act": "gelu", "norm_eps": 1e-5, "rope_theta": e.max_period,
        # The official attention ignores its sliding_window (see read_config): the release's 250.
        "max_position_embeddings": FULL_CONTEXT, "sliding_window": 250,
        "num_quantizers": e.n_codebooks, "num_semantic_quantizers": e.n_semantic,
        "codebook_size": e.codebook_size, "codebook_dim": e.codebook_dim,
        "vector_quantization_hidden_dimension": e.codebook_dim, "upsample_groups": e.dimension}
    decoder = {
        "codebook_size": cfg.codebook_size, "codebook_dim": cfg.codebook_dim,
        "num_quantizers": cfg.n_codebooks,
        "num_semantic_quantizers": 1, "semantic_codebook_size": cfg.codebook_size,  # (unused officially)
        "vector_quantization_hidden_dimension": cfg.codebook_dim, "latent_dim": cfg.latent_dim,
        "hidden_size": cfg.hidden, "intermediate_size": cfg.ffn, "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_heads, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
        "max_position_embeddings": FULL_CONTEXT, "sliding_window": cfg.window, "attention_bias": False,
        "attention_dropout": 0.0, "decoder_dim": cfg.decoder_dim, "upsample_rates": list(cfg.upsample_rates),
        "upsampling_ratios": list(cfg.upsampling_ratios)}
    return {"model_type": "qwen3_tts_tokenizer_12hz", "architectures": ["Qwen3TTSTokenizerV2Model"],
            "encoder_config": encoder, "decoder_config": decoder,
            "encoder_valid_num_quantizers": cfg.n_codebooks,
            "input_sample_rate": cfg.sample_rate, "output_sample_rate": cfg.sample_rate,
            "encode_downsample_rate": cfg.frame_size, "decode_upsample_rate": cfg.frame_size}


def to_official(sd: dict[str, torch.Tensor], shapes: dict[str, tuple[tuple[int, ...], str]],
                cfg: Qwen3Config) -> dict[str, torch.Tensor]:
    """Our state dict under the official names, `shapes` being the official model's (name ->
    (shape, dtype)). `to_ours` only renames, splits, joins and permutes, so it is run on a probe
    whose every element holds its own index: each of our elements then says which official one
    it came from. Official entries `to_ours` leaves out (the rotary tables) are left out here;
    an official tensor that is only partly covered is an error."""
    offsets, probe, n = {}, {}, 0
    for k, (shape, _) in shapes.items():
        offsets[k] = n
        n += math.prod(shape)
        probe[k] = torch.arange(offsets[k], n, dtype=torch.float64).reshape(shape)
    flat = torch.full((n,), math.nan, dtype=torch.float64)
    for k, where in to_ours(probe, cfg, Qwen3Model(cfg), "the official layout").items():
        if k in sd:
            flat[where.reshape(-1).long()] = sd[k].reshape(-1).double()
    out = {}
    for k, (shape, dtype) in shapes.items():
        v = flat[offsets[k]:offsets[k] + math.prod(shape)]
        if not torch.isnan(v).all():
            if torch.isnan(v).any():
                raise CheckpointError(f"the official {k} is only partly ours; the mapping is wrong")
            out[k] = v.reshape(shape).to(getattr(torch, dtype))
    return out


def _release(repo: str, subfolder: str, revision: str | None) -> Path:
    """The folder of a Hugging Face repo (or its subfolder) in the cache, config and weights."""
    prefix = f"{subfolder}/" if subfolder else ""
    config = hf_file(repo, prefix + CONFIG, revision)
    weights = hf_file(repo, prefix + SAFETENSORS, revision)
    if config.parent != weights.parent:  # one snapshot holds both; anything else is a torn cache
        raise CheckpointError(f"{repo}: {CONFIG} and {SAFETENSORS} came from different revisions; "
                              "pass --revision")
    return weights.parent


def resolve_folder(weights: str, revision: str | None = None) -> Path:
    """A released name, a repo id (with a subfolder), a URL or a local path -> a local folder or
    file."""
    releases = {name: (lambda repo=repo: _release(repo, "", revision))
                for name, (repo, _) in RELEASES.items()}
    local = Path(weights).expanduser()
    if weights not in releases and not local.exists() and REPO_ID.match(weights):
        repo, _, sub = weights.partition("/")[2].partition("/")
        repo = f"{weights.split('/')[0]}/{repo}"
        return _release(repo, sub, revision)
    if revision is not None and weights not in releases:
        raise CheckpointError("--revision picks a revision of a release or repo on Hugging Face; "
                              f"{weights} is a path or URL")
    return resolve(weights, releases)


def load(weights: str, preset: str | None = None, revision: str | None = None) -> tuple[Qwen3Model, str]:
    """Model with weights loaded, and the sha256 of the weights file."""
    path = resolve_folder(weights, revision)
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        file = next((folder / f for f in (SAFETENSORS, BIN) if (folder / f).is_file()), None)
        if file is None:
            raise CheckpointError(f"{folder}: holds neither {SAFETENSORS} nor {BIN}; {HINT}")
    else:
        file = path
    # The weights first: a file that is no checkpoint is named as such, whatever lies beside it.
    if file.suffix == ".safetensors":
        sd = read_safetensors([file])
    else:
        sd = load_torch(file, HINT)
        if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise CheckpointError(f"{file}: not a state dict (a mapping of names to tensors); {HINT}")
    if not (folder / CONFIG).is_file():
        raise CheckpointError(f"{folder}: no {CONFIG} beside {file.name}; {HINT}")
    try:
        conf = read_json(folder / CONFIG)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{folder / CONFIG}: unreadable config ({e}); re-download it") from e
    if not isinstance(conf, dict):
        raise CheckpointError(f"{folder / CONFIG}: not a config (a JSON object); {HINT}")
    cfg = read_config(conf, str(folder / CONFIG))
    if preset is not None and cfg != PRESETS[preset]:
        log.warning("the checkpoint's config differs from preset %s; using the checkpoint's", preset)
    model = Qwen3Model(cfg)
    load_state(model, to_ours(sd, cfg, model, str(file)), str(file))
    return model.eval(), sha256_file(file)
