"""The Mimi torch reference: parity with transformers, both checkpoint formats, streaming, polyphase."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from support import noise

from codecport.codecs.mimi import weights as mimi_weights
from codecport.codecs.mimi.model import PRESETS, MimiModel, init_random
from codecport.codecs.mimi.weights import config_from_transformers, load_mimi
from codecport.errors import CheckpointError
from codecport.models.streaming import StreamState

TINY = PRESETS["tiny"]
SHORT, LONG = 20, 200  # code frames; LONG is 400 transformer positions, past the 250-position window
# Audio tolerance vs transformers: float32 rounding differs (SDPA vs an explicit softmax, rotate-half
# RoPE with `1/base**x` frequencies vs moshi's exp-log, cdist vs the expanded distance), which moves
# the audio by ~1e-6 at peak ~1. A wrong window, permutation or tap shifts it by ~1e-2 or more.
ATOL = 1e-5

# transformers' MimiConfig for the tiny preset. num_key_value_heads defaults to 8, not to the
# head count, and transformers' frame rate is free, so both are spelled out.
HF_TINY = {
    "num_filters": TINY.n_filters, "upsampling_ratios": list(TINY.ratios), "hidden_size": TINY.dimension,
    "num_hidden_layers": TINY.n_layers, "intermediate_size": TINY.ffn,
    "num_attention_heads": TINY.n_heads, "num_key_value_heads": TINY.n_heads,
    "codebook_size": TINY.codebook_size, "codebook_dim": TINY.codebook_dim,
    "vector_quantization_hidden_dimension": TINY.codebook_dim, "num_quantizers": TINY.n_codebooks,
    "upsample_groups": TINY.dimension, "sampling_rate": TINY.sample_rate, "frame_rate": TINY.frame_rate,
}


def clip(frames: int, seed: int = 1) -> torch.Tensor:
    """Audio `[1, 1, frames * 24]` for the tiny preset."""
    return torch.from_numpy(noise(frames * TINY.frame_size, seed=seed))[None]


@torch.no_grad()
def _randomize_hf(hf: transformers.MimiModel, seed: int) -> None:
    """Seeded weights with O(1) activations and spread-out codes for a transformers MimiModel.

    Its own init keeps layer scales at 0.01, codebooks at zero and projections at std 0.02, so
    the transformers would be near identities (no window or RoPE to compare) and every code 0.
    """
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g)
    for name, p in hf.named_parameters():
        if name.endswith(".scale"):
            p.copy_(0.1 + 0.4 * torch.rand(p.shape, generator=g))
        elif "layernorm.weight" in name:
            p.copy_(1 + 0.1 * rand(p.shape))
        elif name.endswith(".bias"):
            p.copy_(0.05 * rand(p.shape))
        else:
            module = hf.get_submodule(name.rsplit(".", 1)[0])
            fan_in = p[0].numel()
            if isinstance(module, torch.nn.ConvTranspose1d):  # each output: 2 taps of C_in/g inputs
                fan_in = 2 * p.shape[0] // module.groups
            p.copy_(rand(p.shape) / math.sqrt(fan_in))
    # Codebooks scaled to the projected latents of a noise clip, level 0 centred on them.
    z = hf.encoder(clip(8, seed=5)).latents
    q = hf.quantizer
    for rvq in (q.semantic_residual_vector_quantizer, q.acoustic_residual_vector_quantizer):
        proj = rvq.input_proj(z)[0]  # [D, T]
        mean, std = proj.mean(1), proj.std(1)
        for i, vq in enumerate(rvq.layers):
            cb = vq.codebook
            rows = (mean if i == 0 else 0) + std * 0.7 ** i * rand(cb.embed_sum.shape)
            cb.cluster_usage.copy_(0.5 + 2 * torch.rand(cb.cluster_usage.shape, generator=g))
            cb.embed_sum.copy_(rows * cb.cluster_usage[:, None])
            cb._embed = None  # transformers caches the rows on first use


@pytest.fixture(scope="module")
def hf_model() -> transformers.MimiModel:
    hf = transformers.MimiModel(transformers.MimiConfig(**HF_TINY)).eval()
    _randomize_hf(hf, seed=3)
    return hf


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory, hf_model) -> Path:
    folder = tmp_path_factory.mktemp("hf_mimi")
    hf_model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf_reference(hf_model) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """frames -> (transformers' codes, transformers' audio decoded from them), for both clips."""
    out = {}
    with torch.no_grad():
        for frames in (SHORT, LONG):
            codes = hf_model.encode(clip(frames)).audio_codes
            out[frames] = codes, hf_model.decode(codes).audio_values
    return out


@pytest.fixture(scope="module")
def ours(hf_folder) -> MimiModel:
    """Our model loaded from the transformers folder: weights independent of `init_random`."""
    model, _ = load_mimi(str(hf_folder))
    return model


def assert_matches_hf(model: MimiModel, frames: int, hf_reference) -> None:
    want_codes, want_audio = hf_reference[frames]
    with torch.no_grad():
        codes = model.encode(clip(frames))
        audio = model.decode(codes)
    assert torch.equal(codes, want_codes)
    assert audio.shape == want_audio.shape
    assert (audio - want_audio).abs().max() <= ATOL


def official_file(sd: dict[str, torch.Tensor], path: Path, spelling: str = "in_proj_weight") -> Path:
    """Write `sd` (our names = moshi's) as moshi's safetensors; `in_projs` = moshi >= 0.2 names."""
    if spelling == "in_projs":
        sd = {k.replace(".in_proj_weight", ".in_projs.0.weight")
              .replace(".out_proj.weight", ".out_projs.0.weight"): v for k, v in sd.items()}
    save_file({k: v.contiguous() for k, v in sd.items()}, path)
    return path


# ---- transformers parity ------------------------------------------------------------------
def test_transformers_config_is_the_preset(ours):
    assert ours.cfg == TINY


@pytest.mark.parametrize("kwargs, preset", [(HF_TINY, "tiny"), ({}, "mimi")])
def test_transformers_config_without_frame_rate(kwargs, preset):
    """transformers writes `_frame_rate: null` unless given one; the rate then follows the ratios."""
    conf = json.loads(transformers.MimiConfig(**{k: v for k, v in kwargs.items()
                                                 if k != "frame_rate"}).to_json_string())
    conf.pop("_frame_rate", None)
    assert config_from_transformers(conf, "test") == PRESETS[preset]


@pytest.mark.parametrize("frames", [SHORT, LONG])
def test_transformers_parity(ours, hf_model, hf_reference, frames):
    x = clip(frames)
    with torch.no_grad():
        want_latent = hf_model.encoder(x).latents
        assert (ours.encode_latent(x) - want_latent).abs().max() <= ATOL * want_latent.abs().max()
    assert_matches_hf(ours, frames, hf_reference)
    codes = hf_reference[frames][0]
    # Not degenerate: every level picks among several rows.
    assert all(len(level.unique()) >= 5 for level in codes[0])


def test_attention_window_matters_on_the_long_clip(ours, hf_reference):
    """The long clip's parity depends on the 250-position window: a wider one changes it."""
    wide = MimiModel(dataclasses.replace(TINY, context=4 * LONG)).eval()
    wide.load_state_dict(ours.state_dict())
    want_codes, _ = hf_reference[LONG]
    with torch.no_grad():
        codes = wide.encode(clip(LONG))
        gap = (wide.decode(want_codes) - ours.decode(want_codes)).abs().max()
        # Positions within the window see the same keys either way.
        assert torch.equal(wide.encode(clip(SHORT)), hf_reference[SHORT][0])
    assert not torch.equal(codes, want_codes)
    assert gap > 100 * ATOL


def test_rope_permutation_matters(hf_folder, hf_reference, monkeypatch):
    """Loading without undoing transformers' q/k row permutation must not pass for parity."""
    monkeypatch.setattr(mimi_weights, "_unpermute_rope", lambda w, heads: w)
    model, _ = load_mimi(str(hf_folder))
    want_codes, want_audio = hf_reference[LONG]
    with torch.no_grad():
        codes = model.encode(clip(LONG))
        audio = model.decode(want_codes)
    assert not torch.equal(codes, want_codes)
    assert (audio - want_audio).abs().max() > 100 * ATOL


# ---- moshi's format -----------------------------------------------------------------------
@pytest.mark.parametrize("spelling", ["in_proj_weight", "in_projs"])
def test_official_format(ours, hf_reference, tmp_path, spelling):
    path = official_file(ours.state_dict(), tmp_path / "tokenizer.safetensors", spelling)
    other = {"in_proj_weight": "in_projs.0.weight", "in_projs": "in_proj_weight"}[spelling]
    keys = list(load_file(path))
    assert any(spelling in k for k in keys) and not any(other in k for k in keys)
    model, digest = load_mimi(str(path), preset="tiny")
    assert model.cfg == TINY
    assert len(digest) == 64
    for frames in (SHORT, LONG):
        assert_matches_hf(model, frames, hf_reference)


# ---- polyphase transposed convs -----------------------------------------------------------
def test_polyphase_matches_native_tiny(ours, hf_reference):
    native = MimiModel(TINY, polyphase=False).eval()
    native.load_state_dict(ours.state_dict())
    codes = hf_reference[LONG][0]
    with torch.no_grad():
        want = native.decode(codes)
        assert (ours.decode(codes) - want).abs().max() <= 1e-5
        # The native ConvTranspose has no step form: streaming it must fail loudly.
        with pytest.raises(ValueError, match="polyphase"), \
                native.streaming(native.zero_state("decoder"), "decoder"):
            native.decode(codes[..., :1])


def test_polyphase_matches_native_mimi_preset():
    cfg = PRESETS["mimi"]
    poly = init_random(MimiModel(cfg), seed=0).eval()
    with torch.device("meta"):  # skip a second 96M-parameter init; the weights come from `poly`
        native = MimiModel(cfg, polyphase=False)
    native.load_state_dict(poly.state_dict(), assign=True)
    codes = torch.randint(0, cfg.codebook_size, (1, cfg.n_codebooks, 3),
                          generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = native.eval().decode(codes)
        got = poly.decode(codes)
    assert got.shape == (1, 1, 3 * cfg.frame_size)
    assert want.abs().max() > 1e-2  # audio, not silence
    assert (got - want).abs().max() <= 1e-5


# ---- streaming ----------------------------------------------------------------------------
@pytest.fixture
def one_thread():
    """Hundreds of tiny steps: a second intra-op thread costs more hand-off than it saves work
    (a tiny step took 47 ms with two threads on a loaded 2-core machine, 4 ms with one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("step", [1, 3])
def test_streaming_equals_whole_clip(tiny_mimi, one_thread, step):
    """Steps of `step` frames from the zero state, state fed back as the step graphs do."""
    model, cfg = tiny_mimi, tiny_mimi.cfg
    frames = 129  # 258 positions: the last steps drop keys out of the 250-position window
    assert frames * cfg.downsample_stride > cfg.context
    x = clip(frames, seed=7)
    with torch.no_grad():
        want_codes = model.encode(x)
        want_audio = model.decode(want_codes)

        def run(side: str, pieces: list[torch.Tensor], fn) -> torch.Tensor:
            state = model.zero_state(side)
            inputs, offset, out = state.inputs, state.offset, []
            for piece in pieces:
                st = StreamState(inputs, offset)
                with model.streaming(st, side):
                    out.append(fn(piece))
                assert {k: v.shape for k, v in st.outputs.items()} == \
                    {k: v.shape for k, v in inputs.items()}
                n = piece.shape[-1] // (cfg.frame_size if side == "encoder" else 1)
                inputs, offset = st.outputs, offset + n * cfg.downsample_stride
            assert offset.item() == frames * cfg.downsample_stride
            return torch.cat(out, -1)

        codes = run("encoder", list(x.split(step * cfg.frame_size, -1)), model.encode)
        audio = run("decoder", list(want_codes.split(step, -1)), model.decode)
    assert torch.equal(codes, want_codes)
    assert (audio - want_audio).abs().max() <= 1e-5


def test_rows_stepped_together_are_each_a_stream_alone(tiny_mimi, one_thread):
    """Several streams a step (the slot graphs): the SEANet lays the rows end to end on the time
    axis (one conv over all of them, streaming.fold_rows), each with its own context, offset and
    first-step padding. Every row equals its stream stepped alone; the rows start at different
    steps, so their contexts and offsets differ."""
    model, cfg = tiny_mimi, tiny_mimi.cfg
    rows, steps, starts = 3, 4, [0, 1, 2]
    g = torch.Generator().manual_seed(3)
    for side in ("encoder", "decoder"):
        shapes = model.state_shapes(side)
        alone = [model.zero_state(side) for _ in range(rows)]
        inputs = {k: torch.zeros(rows, *s[1:]) for k, s in shapes.items()}
        offset = torch.zeros(rows, dtype=torch.int64)
        for step in range(steps):
            shape = (rows, 1, cfg.frame_size) if side == "encoder" else (rows, cfg.dimension, 1)
            x = torch.randn(*shape, generator=g) * 0.3
            live = [r for r in range(rows) if step >= starts[r]]
            fn = model.encode_latent if side == "encoder" else model.decode_latent
            with torch.no_grad():
                st = StreamState(inputs, offset)
                with model.streaming(st, side):
                    got = fn(x)
                for r in live:
                    one = StreamState(alone[r].inputs, alone[r].offset)
                    with model.streaming(one, side):
                        want = fn(x[r:r + 1])
                    assert (got[r:r + 1] - want).abs().max() <= 1e-5, (side, step, r)
                    for k, v in one.outputs.items():
                        assert (st.outputs[k][r:r + 1] - v).abs().max() <= 1e-5, (side, step, k)
                    alone[r] = StreamState(one.outputs, one.offset + cfg.downsample_stride)
            # A row not yet started stays in the zero state (as a free slot is kept).
            inputs = {k: torch.stack([v[r] if r in live else inputs[k][r] for r in range(rows)])
                      for k, v in st.outputs.items()}
            offset = offset + torch.tensor([cfg.downsample_stride if r in live else 0 for r in range(rows)])


# ---- bad checkpoints ----------------------------------------------------------------------
class Payload:
    """Unpickling it creates `marker`: proof that a loader ran pickle code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def test_payload_runs_when_unpickled(tmp_path):
    """Control for the tests below: the payload does leave its marker when unpickled."""
    pickle.loads(pickle.dumps(Payload(tmp_path / "marker")))
    assert (tmp_path / "marker").is_dir()


def test_missing_key(ours, tmp_path):
    sd = dict(ours.state_dict())
    del sd["decoder_transformer.transformer.layers.1.linear2.weight"]
    path = official_file(sd, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=r"missing key decoder_transformer\.transformer\."
                                              r"layers\.1\.linear2\.weight \(1 missing\)"):
        load_mimi(str(path), preset="tiny")


def test_unexpected_key(ours, tmp_path):
    sd = {**ours.state_dict(), "encoder.model.99.conv.conv.weight": torch.zeros(1)}
    path = official_file(sd, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=r"unexpected key encoder\.model\.99"):
        load_mimi(str(path), preset="tiny")


def test_wrong_shape(ours, tmp_path):
    key = "quantizer.rvq_rest.vq.layers.0._codebook.embedding_sum"
    sd = {**ours.state_dict(), key: torch.zeros(32, TINY.codebook_dim)}
    path = official_file(sd, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=rf"{key} has shape \(32, 8\), the model expects \(64, 8\)"):
        load_mimi(str(path), preset="tiny")


def test_official_file_with_the_wrong_preset(ours, tmp_path):
    """moshi's file carries no config: the default (full) preset must fail as a mismatch, not crash."""
    path = official_file(ours.state_dict(), tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match="missing key .* model and preset"):
        load_mimi(str(path))


def test_pth_is_refused_unread(ours, tmp_path):
    path = tmp_path / "weights.pth"
    torch.save({"state_dict": Payload(tmp_path / "marker")}, path)
    with pytest.raises(CheckpointError, match=r"\.safetensors.*other formats are not read"):
        load_mimi(str(path), preset="tiny")
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize("kind", ["truncated", "garbage", "empty", "pickle"])
@pytest.mark.parametrize("layout", ["official", "transformers"])
def test_corrupt_safetensors(hf_folder, ours, tmp_path, kind, layout):
    """Unreadable files fail as CheckpointError, and a pickle named .safetensors is never run."""
    if layout == "transformers":
        folder = Path(shutil.copytree(hf_folder, tmp_path / "hf"))
        path = folder / "model.safetensors"
    else:
        path = official_file(ours.state_dict(), tmp_path / "m.safetensors")
    good = path.read_bytes()
    marker = tmp_path / "marker"
    path.write_bytes({"truncated": good[: len(good) // 2], "garbage": os.urandom(4096), "empty": b"",
                      "pickle": pickle.dumps({"w": Payload(marker)})}[kind])
    with pytest.raises(CheckpointError, match="not a readable safetensors file.*re-download"):
        load_mimi(str(path.parent if layout == "transformers" else path), preset="tiny")
    assert not marker.exists()


@pytest.mark.parametrize("key, value", [("use_conv_shortcut", True), ("num_key_value_heads", 1),
                                        ("pad_mode", "reflect"), ("num_residual_layers", 2)])
def test_unsupported_transformers_config(hf_folder, tmp_path, key, value):
    folder = Path(shutil.copytree(hf_folder, tmp_path / "hf"))
    conf = json.loads((folder / "config.json").read_text())
    conf[key] = value
    (folder / "config.json").write_text(json.dumps(conf))
    with pytest.raises(CheckpointError, match=rf"config {key}={value!r} is not supported"):
        load_mimi(str(folder))


def test_transformers_folder_without_config(hf_folder, tmp_path):
    folder = Path(shutil.copytree(hf_folder, tmp_path / "hf"))
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="needs config.json"):
        load_mimi(str(folder))


def test_transformers_file_lacking_a_projection(hf_folder, tmp_path):
    folder = Path(shutil.copytree(hf_folder, tmp_path / "hf"))
    sd = load_file(folder / "model.safetensors")
    del sd["encoder_transformer.layers.1.self_attn.k_proj.weight"]
    save_file(sd, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"encoder_transformer\.layers\.1\.self_attn lacks one"):
        load_mimi(str(folder))


def test_transformers_projection_of_the_wrong_shape(hf_folder, tmp_path):
    """A q/k/v projection the config's hidden_size does not fit is named (it failed inside torch's
    reshape for the rope un-permutation, an internal error)."""
    folder = Path(shutil.copytree(hf_folder, tmp_path / "hf"))
    sd = load_file(folder / "model.safetensors")
    sd["decoder_transformer.layers.0.self_attn.v_proj.weight"] = torch.zeros(7, 5)
    save_file(sd, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"decoder_transformer\.layers\.0\.self_attn\.v_proj\.weight "
                                              r"has shape \(7, 5\), the config's hidden_size asks for"):
        load_mimi(str(folder))


def test_no_such_file(tmp_path):
    with pytest.raises(CheckpointError, match="no such file.*mimi"):
        load_mimi(str(tmp_path / "absent.safetensors"))
