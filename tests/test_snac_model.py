"""The SNAC torch reference against the official `snac` package, its masked windows, its
receptive field, its config, and its weights in the official Hugging Face layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from support import official_snac

from codecport.codecs.snac.model import PRESETS, SNAC, SnacConfig, init_random
from codecport.codecs.snac.weights import load
from codecport.errors import CheckpointError, ConfigError

SNAC_MD_24K = {"sampling_rate": 24000, "encoder_dim": 48, "encoder_rates": [2, 4, 8, 8], "decoder_dim": 1024,
               "decoder_rates": [8, 8, 4, 2], "attn_window_size": None, "codebook_size": 4096,
               "codebook_dim": 8, "vq_strides": [4, 2, 1], "noise": True, "depthwise": True}


def _official_noise(official, codes, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The official decode under `seed`, and the noise it drew: its noise blocks call
    `torch.randn` in order, so the same seed draws the same tensors again."""
    torch.manual_seed(seed)
    with torch.no_grad():
        audio = official.decode(codes)
    frames = codes[-1].shape[-1] * official.vq_strides[-1]
    torch.manual_seed(seed)
    shapes, n = [], frames
    for s in official.decoder_rates:
        n *= s
        shapes.append((codes[0].shape[0], 1, n))
    return audio, [torch.randn(s) for s in shapes]


@pytest.mark.parametrize("variant", ["tiny", "24khz", "44khz"])
def test_official_parity_codes_and_audio(variant):
    """Shared random weights: identical codes, and audio within 3e-5 when both decoders add the
    same noise (float rounding: the two sum their convolutions in other orders, 1.3e-5 apart
    for 44khz on an AVX-only CPU). 44khz brings the local attention and odd strides of the
    music models."""
    model = init_random(SNAC(PRESETS[variant]), seed=1).eval()
    official = official_snac(model)
    cfg = model.cfg
    rng = np.random.default_rng(2)
    x = torch.from_numpy(
        (0.3 * rng.standard_normal((2, 1, int(0.4 * cfg.sample_rate) + 13))).astype(np.float32))
    with torch.no_grad():
        want = official.encode(x)
        got = model.encode(x)
    assert len(got) == len(cfg.vq_strides)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and torch.equal(g, w)
    assert len(torch.unique(got[-1])) > 5  # the codes are spread, so equality means something
    audio, noise = _official_noise(official, want, seed=3)
    with torch.no_grad():
        ours = model.decode(got, noise)
    assert ours.shape == audio.shape
    assert float((ours - audio).abs().max()) <= 3e-5
    assert float(audio.std()) > 0.05


def test_a_masked_window_computes_the_clip_alone(tiny_snac):
    """A clip inside a longer window, the rest masked: the latent and audio of the clip are
    what the model gives for the clip by itself (both of its edges inside the window)."""
    cfg, unit, hop = tiny_snac.cfg, tiny_snac.cfg.unit_frames, tiny_snac.cfg.hop_length
    clip_frames, window, at = 5 * unit, 12 * unit, 3 * unit
    rng = np.random.default_rng(4)
    x = torch.from_numpy((0.3 * rng.standard_normal((1, 1, clip_frames * hop))).astype(np.float32))
    # junk around
    big = torch.from_numpy((0.3 * rng.standard_normal((1, 1, window * hop))).astype(np.float32))
    big[..., at * hop:(at + clip_frames) * hop] = x
    mask = torch.zeros(1, 1, window)
    mask[..., at:at + clip_frames] = 1
    with torch.no_grad():
        alone = tiny_snac.encode_latent(x)
        inside = tiny_snac.encode_latent(big, mask)[..., at:at + clip_frames]
        assert float((alone - inside).abs().max()) <= 1e-5
        z = torch.randn(1, cfg.latent, window)
        noise = [torch.randn(s) for s in tiny_snac.noise_shapes(window)]
        audio = tiny_snac.decode_latent(z, noise, mask)[..., at * hop:(at + clip_frames) * hop]
        up = list(np.cumprod(cfg.decoder_rates))
        own = [n[..., at * u:(at + clip_frames) * u] for n, u in zip(noise, up)]
        want = tiny_snac.decode_latent(z[..., at:at + clip_frames], own)
    assert float((audio - want).abs().max()) <= 1e-5


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_the_computed_receptive_field_holds_and_is_tight(tiny_snac, side):
    """Impulses in the middle of a long input, at every place within a coarse frame (attention
    windows make the reach depend on it): the outputs they change lie within the margin computed
    from the config (geometry.py), and reach past the margin less one coarse frame."""
    cfg, unit, hop = tiny_snac.cfg, tiny_snac.cfg.unit_frames, tiny_snac.cfg.hop_length
    margin = cfg.margins()[0 if side == "encoder" else 1]
    frames = 4 * margin + 8 * unit
    torch.manual_seed(0)
    reach = 0
    with torch.no_grad():
        x = 0.3 * torch.randn(1, 1, frames * hop)
        z = torch.randn(1, cfg.latent, frames)
        zeros = [torch.zeros(s) for s in tiny_snac.noise_shapes(frames)]
        base = tiny_snac.encode_latent(x) if side == "encoder" else tiny_snac.decode_latent(z, zeros)
        for mid in range(frames // 2, frames // 2 + unit):
            if side == "encoder":
                for at in (mid * hop, mid * hop + hop - 1):
                    y = x.clone()
                    y[..., at] += 1.0
                    changed = torch.nonzero((tiny_snac.encode_latent(y) - base).abs().amax(dim=1)[0]
                                            > 1e-7)[:, 0]
                    reach = max(reach, mid - int(changed.min()), int(changed.max()) - mid)
            else:
                w = z.clone()
                w[..., mid] += 1.0
                changed = torch.nonzero((tiny_snac.decode_latent(w, zeros) - base).abs()[0, 0] > 1e-7)[:, 0]
                reach = max(reach, mid - int(changed.min()) // hop, int(changed.max()) // hop - mid)
    assert margin - unit < reach <= margin, (reach, margin)


def test_the_presets_are_the_published_configs():
    assert PRESETS["24khz"].to_kwargs() == {**SNAC_MD_24K, "latent_dim": None}
    for name, rate in (("32khz", 32000), ("44khz", 44100)):
        cfg = PRESETS[name]
        assert (cfg.sample_rate, cfg.hop_length, cfg.attn_window_size, cfg.vq_strides) == \
            (rate, 384, 32, (8, 4, 2, 1))
    assert SnacConfig.from_kwargs(SNAC_MD_24K) == PRESETS["24khz"]
    assert PRESETS["24khz"].margins() == (12, 12)  # 3 coarse frames each side
    assert 19.0e6 < PRESETS["24khz"].approx_params() < 21.0e6  # the release has 19.8 M


@pytest.mark.parametrize("change, match", [
    ({"model_type": "snac"}, "not one of SNAC's"),
    ({"latent_dim": 100}, "not the encoder's width"),
    ({"vq_strides": [4, 3, 1]}, "must divide the first"),
    ({"vq_strides": 4}, "must be a list"),
    ({"noise": "yes"}, "true or false"),
    ({"encoder_rates": [2, 0]}, "outside"),
    ({"decoder_dim": 1 << 30}, "outside"),
    ({"encoder_dim": 4096, "encoder_rates": [2] * 8}, "past any SNAC model"),
])
def test_a_bad_config_is_refused_before_any_layer(change, match):
    with pytest.raises(ConfigError, match=match):
        SnacConfig.from_kwargs({**SNAC_MD_24K, **change})


def _official_folder(tmp_path, model, config=None):
    """A folder in the official Hugging Face layout: config.json and the official model's
    `state_dict()` (weight norm as parametrizations) in pytorch_model.bin."""
    folder = tmp_path / "snac_model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config or model.cfg.to_kwargs()))
    torch.save(official_snac(model).state_dict(), folder / "pytorch_model.bin")
    return folder


def test_weights_load_from_the_official_layout(tmp_path, tiny_snac, tiny_snac_official):
    folder = _official_folder(tmp_path, tiny_snac)
    model, digest = load(str(folder))
    assert model.cfg == tiny_snac.cfg and len(digest) == 64
    x = torch.randn(1, 1, 2000)
    with torch.no_grad():
        for a, b in zip(model.encode(x), tiny_snac_official.encode(x), strict=True):
            assert torch.equal(a, b)
    # The .bin alone takes its config from beside it, or from --variant.
    assert load(str(folder / "pytorch_model.bin"))[0].cfg == tiny_snac.cfg
    (folder / "config.json").unlink()
    assert load(str(folder / "pytorch_model.bin"), preset="tiny")[0].cfg == tiny_snac.cfg
    with pytest.raises(CheckpointError, match="no config.json beside the weights; pass --preset"):
        load(str(folder))


class _Payload:
    def __reduce__(self):
        return (print, ("this ran",))


def test_bad_checkpoints_are_one_clear_error(tmp_path, tiny_snac, capsys):
    folder = _official_folder(tmp_path, tiny_snac)
    sd = official_snac(tiny_snac).state_dict()
    torch.save({**sd, "evil": _Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="refused to unpickle"):
        load(str(folder))
    assert "this ran" not in capsys.readouterr().out
    (folder / "pytorch_model.bin").write_bytes(b"RIFF....WAVEfmt ")
    with pytest.raises(CheckpointError, match="not a torch checkpoint .a WAV file.; pass a SNAC folder"):
        load(str(folder))
    torch.save({k: v for k, v in sd.items() if "decoder" not in k}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="missing key decoder"):
        load(str(folder))
    key = next(k for k in sd if k.endswith(".bias"))
    # a complex tensor would load with its imaginary part dropped, torch only warning
    torch.save({**sd, key: torch.complex(sd[key], sd[key])}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=f"{key} is a torch.complex64 tensor; the model expects real"):
        load(str(folder))
    other = init_random(SNAC(SnacConfig(**{**PRESETS["tiny"].__dict__, "codebook_dim": 8})), 0)
    torch.save(official_snac(other).state_dict(), folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="has shape .* the config does not match"):
        load(str(folder))
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable config"):
        load(str(folder))
    (folder / "config.json").write_text(json.dumps({**tiny_snac.cfg.to_kwargs(), "vq_strides": [3, 2]}))
    with pytest.raises(ConfigError, match="config.json: config vq_strides"):
        load(str(folder))
    with pytest.raises(CheckpointError, match="no such file"):
        load(str(tmp_path / "nowhere"))
    with pytest.raises(CheckpointError, match="--revision is for weights fetched"):
        load(str(folder), revision="v1")
