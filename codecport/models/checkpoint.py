"""Checkpoint reading shared by the codecs: strict loading, safetensors, transformers folders."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from ..errors import CheckpointError
from .hub import cache_dir

MAX_CONFIG_BYTES = 1 << 20  # a model's config.json is a few kB


def load_state(model: torch.nn.Module, sd: dict[str, torch.Tensor], source: str) -> None:
    """Strict load that names the first missing/unexpected key or mismatched shape."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    if missing:
        raise CheckpointError(f"{source}: missing key {missing[0]} ({len(missing)} missing); "
                              "is this a checkpoint of this model and preset?")
    if unexpected:
        raise CheckpointError(f"{source}: unexpected key {unexpected[0]} ({len(unexpected)} "
                              "unexpected); is this a checkpoint of this model and preset?")
    for k, v in expected.items():
        if not isinstance(sd[k], torch.Tensor) or sd[k].is_complex():
            # A complex tensor would load with its imaginary part dropped (torch only warns).
            what = (f"a {sd[k].dtype} tensor" if isinstance(sd[k], torch.Tensor)
                    else f"not a tensor ({type(sd[k]).__name__})")
            raise CheckpointError(f"{source}: {k} is {what}; the model expects real weights; "
                                  "is this a checkpoint of this model?")
        if tuple(sd[k].shape) != tuple(v.shape):
            raise CheckpointError(f"{source}: {k} has shape {tuple(sd[k].shape)}, the model "
                                  f"expects {tuple(v.shape)}; the config does not match the weights")
        if sd[k].is_floating_point() and not torch.isfinite(sd[k]).all():
            # (a weight-norm pair whose v is all zeros folds to NaN too)
            raise CheckpointError(f"{source}: {k} holds NaN or infinite values; the checkpoint is "
                                  "damaged: re-download it")
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
            raise CheckpointError(f"{f}: not a readable safetensors file ({e}); {again(f)}") from e
    return sd


def read_json(path: Path):
    """The JSON document of a config file, bounded: a `ValueError` for one past
    `MAX_CONFIG_BYTES`, nested past the parser's depth, or not UTF-8 JSON."""
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{size} bytes, not a config")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError("nested past the JSON parser's depth") from None


def transformers_folder(path: Path) -> tuple[dict, list[Path]]:
    """(config.json, safetensors files) of a transformers checkpoint: a folder, or one of its
    safetensors files."""
    folder = path if path.is_dir() else path.parent
    files = sorted(folder.glob("*.safetensors")) if path.is_dir() else [path]
    if not files or not (folder / "config.json").is_file():
        raise CheckpointError(f"{path}: a transformers checkpoint needs config.json and "
                              "*.safetensors in one folder")
    try:
        conf = read_json(folder / "config.json")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder}/config.json: unreadable ({e})") from e
    if not isinstance(conf, dict):
        raise CheckpointError(f"{folder}/config.json: not a config (a JSON object of settings)")
    return conf, files


def fold_weight_norm(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Replace (g, v) pairs by `w = g * v / ||v||` (norm over every dim but the one `g` keeps:
    0, or HuBERT's position conv's 2), once.

    Handles both spellings: `weight_g`/`weight_v` (torch.nn.utils.weight_norm) and
    `parametrizations.weight.original0`/`original1` (torch.nn.utils.parametrizations).
    """
    out: dict[str, torch.Tensor] = {}
    pairs = {".weight_g": ".weight_v", ".parametrizations.weight.original0":
             ".parametrizations.weight.original1"}
    for key, value in sd.items():
        for g_suffix, v_suffix in pairs.items():
            if key.endswith(v_suffix):
                break
            if key.endswith(g_suffix):
                stem = key[: -len(g_suffix)]
                v = sd.get(stem + v_suffix)
                if v is None:
                    raise CheckpointError(f"{key} has no matching {stem + v_suffix}; "
                                          "the checkpoint is incomplete")
                # Over every dim but the one `g` keeps (0, or 2 for HuBERT's position conv).
                kept = [d for d in range(v.dim())
                        if value.dim() == v.dim() and value.shape[d] == v.shape[d] > 1]
                dims = [d for d in range(v.dim()) if d not in (kept or [0])]
                if not (isinstance(value, torch.Tensor) and isinstance(v, torch.Tensor)) \
                        or value.is_complex() or v.is_complex() or v.dim() == 0 \
                        or [n for d, n in enumerate(value.shape) if n > 1] != [v.shape[d] for d in kept]:
                    shapes = [tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                              for t in (value, v)]
                    raise CheckpointError(f"{key} and {stem + v_suffix} are not a weight-norm pair "
                                          f"(real tensors, {shapes[0]} against {shapes[1]}); is this a "
                                          "checkpoint of this model?")
                norm = v.float().pow(2).sum(dims, keepdim=True).sqrt()
                out[stem + ".weight"] = (value.float() * v.float() / norm).to(v.dtype)
                break
        else:
            out[key] = value
    return out


def unfold_weight_norm(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The official checkpoint's spelling of a folded state dict: each conv weight `w` as
    `weight_g = ||w||` (norm over every dim but 0) and `weight_v = w`, which the official
    weight-normed layers (and `fold_weight_norm`) turn back into `w`."""
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        if key.endswith(".weight") and value.dim() == 3:  # convs; codebooks are 2-D embeddings
            stem = key[: -len(".weight")]
            out[stem + ".weight_g"] = value.flatten(1).norm(dim=1).reshape(-1, 1, 1).clone()
            out[stem + ".weight_v"] = value.clone()
        else:
            out[key] = value
    return out


def unfold_parametrized(sd: dict[str, torch.Tensor], kept: dict[str, int]) -> dict[str, torch.Tensor]:
    """`sd` with the weight of each layer of `kept` (its name -> the dim its `g` keeps) spelled as
    torch's weight-norm parametrisation writes it: `parametrizations.weight.original0` = `g`, the
    norm over every other dim, and `original1` = the weight; `fold_weight_norm` turns them back."""
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        stem = key[: -len(".weight")]
        if key.endswith(".weight") and stem in kept:
            dims = [d for d in range(value.dim()) if d != kept[stem]]
            out[f"{stem}.parametrizations.weight.original0"] = value.pow(2).sum(dims, keepdim=True).sqrt()
            out[f"{stem}.parametrizations.weight.original1"] = value
        else:
            out[key] = value
    return out


def weight_norm_dims(module: torch.nn.Module) -> dict[str, int]:
    """The weight-normed layers of `module` (torch's parametrisation) -> the dim each `g` keeps:
    what `unfold_parametrized` needs to spell a state dict as `module` holds it."""
    from torch.nn.utils import parametrize

    return {name: next((d for d, n in enumerate(m.parametrizations.weight.original0.shape) if n > 1), 0)
            for name, m in module.named_modules() if parametrize.is_parametrized(m, "weight")}


def sniff_torch_file(path: Path, hint: str) -> bool:
    """Whether `path` is a zip archive (torch's format since 1.6) rather than a legacy pickle;
    `CheckpointError` if it starts like neither: a WAV or a text file passed as --weights is
    named as what it is."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it ({e.strerror or e})") from e
    if head.startswith(b"PK\x03\x04"):
        return True
    if len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return False
    what = {b"RIFF": "a WAV file", b"fLaC": "a FLAC file", b"OggS": "an OGG file",
            b"\x93NUM": "a numpy .npy file"}
    kind = next((v for k, v in what.items() if head.startswith(k)), f"it starts with {head[:8]!r}")
    raise CheckpointError(f"{path}: not a torch checkpoint ({kind}); {hint}")


def again(path: Path) -> str:
    """What to do about a damaged weights file: fetch it again, or, for codecport's own cached
    download of a `--weights URL` (which a rerun would reuse), delete it first."""
    if path.resolve().is_relative_to((cache_dir() / "urls").resolve()):
        return f"it is codecport's cached download: delete {path} and run again"
    return "re-download it"


def check_zip_members(path: Path) -> None:
    """`CheckpointError` unless the zip archive's members are stored as `torch.save` writes them
    (uncompressed) and fit in the file: a compressed member, or sizes that lie, could make a
    small file take gigabytes as it loads."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({e}); {again(path)}") from e
    packed = next((m for m in members if m.compress_type != zipfile.ZIP_STORED), None)
    if packed is not None:
        raise CheckpointError(f"{path}: {packed.filename} is compressed, which torch.save never "
                              "writes; re-save the state dict with torch.save")
    if sum(m.file_size for m in members) > path.stat().st_size:
        raise CheckpointError(f"{path}: its members claim more bytes than the file holds; "
                              f"{again(path)}")


def load_torch(path: Path, hint: str):
    """`torch.load(path, weights_only=True)`: plain tensors and data only, never code. A file
    that is not a checkpoint, is damaged, or would unpickle objects is one `CheckpointError`
    (`hint` says what to pass instead)."""
    if sniff_torch_file(path, hint):
        check_zip_members(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path}: refused to unpickle it: it holds objects other than "
                              f"tensors and plain data ({reason}); only load files you trust, "
                              "re-saved as a plain state dict") from e
    except (RuntimeError, EOFError, OSError) as e:
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({e}); {again(path)}") from e
    except Exception as e:  # a damaged pickle fails in its unpickler's own terms (IndexError, KeyError...)
        raise CheckpointError(f"{path}: not a readable torch checkpoint ({type(e).__name__}: {e}); "
                              f"{again(path)}") from e
