"""Reading checkpoints (models/checkpoint.py), the parts every codec shares: what a damaged or
lying file becomes. Each case is one `CheckpointError` before the model is touched."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from codecport.errors import CheckpointError
from codecport.models.checkpoint import fold_weight_norm, load_state, load_torch, transformers_folder


def _conv():
    return torch.nn.Sequential(torch.nn.Conv1d(2, 4, 3))


def test_a_compressed_or_lying_zip_checkpoint_is_refused_before_it_loads(tmp_path):
    """torch.save stores its members uncompressed: a deflated member (a few MB that inflate to
    gigabytes as torch reads them) is refused by name, and so are members that claim more
    bytes than the file holds. The same state saved by torch.save loads."""
    plain = tmp_path / "plain.pth"
    torch.save({"w": torch.zeros(100_000)}, plain)
    assert load_torch(plain, "hint")["w"].shape == (100_000,)
    packed = tmp_path / "packed.pth"
    with zipfile.ZipFile(plain) as zi, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as zo:
        for m in zi.infolist():
            zo.writestr(m.filename, zi.read(m.filename))
    assert packed.stat().st_size < plain.stat().st_size / 10  # zeros: what a bomb is made of
    with pytest.raises(CheckpointError, match=r"is compressed, which torch.save never writes"):
        load_torch(packed, "hint")
    lying = tmp_path / "lying.pth"
    data = bytearray(plain.read_bytes())
    with zipfile.ZipFile(plain) as z:
        big = max(z.infolist(), key=lambda m: m.file_size)
    # The largest member's uncompressed size in the central directory, made 1 GB.
    at = data.find(b"PK\x01\x02")
    while data[at + 46:at + 46 + int.from_bytes(data[at + 28:at + 30], "little")] != big.filename.encode():
        at = data.find(b"PK\x01\x02", at + 1)
    data[at + 24:at + 28] = (1 << 30).to_bytes(4, "little")
    lying.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="claim more bytes than the file holds"):
        load_torch(lying, "hint")


@pytest.mark.parametrize("bad", ["nan", "inf", "zero_v"])
def test_weights_that_are_not_finite_are_named(bad):
    """NaN or infinite weights (a damaged file; a weight-norm v of zeros folds to NaN) were taken,
    and the export then blamed the audio ("pass audio in [-1, 1]") or its own validation."""
    model = _conv()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    if bad == "zero_v":
        w = sd.pop("0.weight")
        sd["0.weight_g"], sd["0.weight_v"] = w.flatten(1).norm(dim=1).reshape(-1, 1, 1), torch.zeros_like(w)
        sd = fold_weight_norm(sd)
    else:
        sd["0.weight"][1, 0, 2] = float(bad)
    with pytest.raises(CheckpointError, match=r"src: 0\.weight holds NaN or infinite values"):
        load_state(model, sd, "src")


def test_a_weight_norm_pair_that_does_not_fit_is_named():
    """A g of the wrong shape, or a complex one (whose imaginary part torch drops), is not a
    weight-norm pair: named, where it was an internal broadcast error or silently half-loaded."""
    w = torch.randn(4, 2, 3)
    good = {"c.weight_g": w.flatten(1).norm(dim=1).reshape(-1, 1, 1), "c.weight_v": w}
    assert torch.allclose(fold_weight_norm(good)["c.weight"], w, atol=1e-6)
    for g in (torch.ones(3), torch.ones(4, 1, 1, dtype=torch.complex64)):
        with pytest.raises(CheckpointError, match=r"c\.weight_g and c\.weight_v are not a weight-norm pair"):
            fold_weight_norm({"c.weight_g": g, "c.weight_v": w})


@pytest.mark.parametrize("content", ["[" * 100_000, "huge"])
def test_a_transformers_config_too_deep_or_too_big_is_one_error(tmp_path, content):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    config = folder / "config.json"
    if content == "huge":
        with open(config, "wb") as f:  # sparse: 2 GiB on paper, nothing on disk
            f.truncate(2 << 30)
    else:
        config.write_text(content)
    with pytest.raises(CheckpointError, match=r"config\.json: unreadable"):
        transformers_folder(folder)
    config.write_text(json.dumps({"a": 1}))
    assert transformers_folder(folder)[0] == {"a": 1}
