"""The distilled NeuCodec (`neuphonic/distill-neucodec`, preset `distill`): its encoder in torch
(codecs/neucodec/distill.py) against the official `DistillNeuCodec` built offline at the released
encoder size on shared random weights (codes identical, on a clip alone and masked inside a longer
window), the runtime's DistilHuBERT input against transformers' feature extractor, and the tiny
preset through `codec-export` and the runtime (the clip alone's codes for every length, the
graphs in one partition on the promised targets, batched rows)."""

from __future__ import annotations

import dataclasses
import functools
import json
from unittest import mock

import numpy as np
import onnx
import pytest
import torch
from shared_exports import cli_export, shared, skipped_init
from support import noise, official_neucodec
from test_neucodec_download import env  # noqa: F401 (a fixture: a clean huggingface_hub environment)
from web_support import distilled_web_folder

import codecport
from codecport.codecs.neucodec.fbank import raw_values
from codecport.codecs.neucodec.fsq import Fsq
from codecport.codecs.neucodec.model import PRESETS, NeuCodec, init_random
from codecport.models.checkpoint import fold_weight_norm, unfold_parametrized, weight_norm_dims

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _spread(ours: NeuCodec, clip: torch.Tensor) -> None:
    """Random weights give a latent whose per-channel offsets swamp its changes over time (one
    code for every frame): perturb the encoders, then centre the latent on `clip` and scale it to
    unit spread over the FSQ levels, so that the codes vary and every path matters."""
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.startswith("codec_encoder.") and name.endswith("bias"):
                p.zero_()
            elif name.startswith(("semantic_model.", "codec_encoder.")):
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        padded = torch.nn.functional.pad(clip, (0, 320 - clip.shape[-1] % 320))
        values = torch.from_numpy(raw_values(padded[0, 0].numpy(), 160, ours.cfg.distill.hubert.normalize))
        sem = ours.SemanticEncoder_module(ours.semantic_model(values).transpose(1, 2))
        z = torch.cat([sem, ours.fc_sq_prior(ours.codec_encoder(padded)).transpose(1, 2)], 1).transpose(1, 2)
        ours.fc_prior.bias.copy_(-(z.mean(1) @ ours.fc_prior.weight.T)[0])
        q = ours.generator.quantizer.project_in
        lat = q(ours.fc_prior(z)) - q.bias
        q.bias.copy_(-lat.mean((0, 1)))
        q.weight.div_(lat.std((0, 1))[:, None])


@pytest.fixture(scope="module")
def pair():
    """(ours, the official DistillNeuCodec) on the same weights: the released encoder (DistilHuBERT
    built from transformers' HubertConfig as distilhubert's, DistillCodecEncoder's defaults), one
    decoder block of 12 (encode reads the decoder for its quantizer only)."""
    from transformers import HubertConfig, HubertModel, Wav2Vec2FeatureExtractor

    nc = official_neucodec()
    torch.manual_seed(0)
    hubert = HubertConfig(num_hidden_layers=2, hidden_size=768, num_attention_heads=12,
                          intermediate_size=3072, conv_bias=False, feat_extract_norm="group",
                          do_stable_layer_norm=False)
    one_block = functools.partial(nc.codec_decoder_vocos.CodecDecoderVocos, depth=1)
    with mock.patch.object(nc.model, "CodecDecoderVocos", one_block), \
            mock.patch.object(nc.model.HubertModel, "from_pretrained", lambda *a, **k: HubertModel(hubert)), \
            mock.patch.object(nc.model.AutoFeatureExtractor, "from_pretrained",
                              lambda *a, **k: Wav2Vec2FeatureExtractor(do_normalize=True)):
        official = nc.model.DistillNeuCodec(24000, 480).eval()
    with skipped_init():
        ours = NeuCodec(dataclasses.replace(PRESETS["distill"], depth=1)).eval()
    sd = fold_weight_norm({k: v for k, v in official.state_dict().items() if not ours.unused(k)})
    ours.load_state_dict(sd, strict=True)  # the official keys, every one
    _spread(ours, torch.from_numpy(noise(16000, seed=9))[None])
    # Back into the official model: its weight-normed layers get (g, v) = (||w||, w).
    back = ours.state_dict()
    kept = weight_norm_dims(official)
    assert len(kept) > 25  # the distilled encoder's convs and linears, DistilHuBERT's position conv
    with torch.no_grad():
        official.load_state_dict(unfold_parametrized(back, kept), strict=False)
        for name, m in official.named_modules():
            if name in kept:
                torch.testing.assert_close(m.weight, back[name + ".weight"])
    return ours, official


def test_the_local_attention_over_several_windows_is_the_officials():
    """The released encoder's attention windows are 6 s, longer than the parity clips: the official
    acoustic encoder at the tiny preset's sizes (its windows of 4 frames, 20 before the
    compression) against ours on 25 frames, several windows and a partial one at both rates."""
    from codecport.codecs.neucodec.distill import DistillCodecEncoder

    ce = official_neucodec().codec_encoder_distill
    cfg = PRESETS["tiny-distill"]
    d = dataclasses.replace(cfg.distill, heads=6)  # the official builder's heads
    torch.manual_seed(1)
    official = torch.nn.Module()
    official.encoder = ce.Encoder(feature_dim=d.feature, strides=cfg.enc_strides[:-1], depths=d.depths,
                                  dims=d.dims)
    official.en_encoder = ce.CompressedLocalEncoderWithCache(
        feature_dim=d.feature, local_window_size=d.window, compress_rate=cfg.enc_strides[-1], cache_size=0,
        depth=d.depth, use_dynamic_pos_bias=True)
    ours = DistillCodecEncoder(d, cfg.enc_strides).eval()
    sd = {k: v + 0.1 * torch.randn(v.shape) if v.is_floating_point() else v
          for k, v in official.state_dict().items()}
    official.load_state_dict(sd)
    ours.load_state_dict(fold_weight_norm({k: v for k, v in official.state_dict().items()
                                           if not ours.unused(k)}))
    x = torch.from_numpy(noise(25 * 320, seed=11))[None]
    with torch.no_grad():
        want = ce.DistillCodecEncoder.forward(official.eval(), x)
        got = ours(x)
    assert want.shape == got.shape == (1, 25, d.feature)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def _prepared(audio: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(16 kHz audio padded as the official `_prepare_audio` pads it, DistilHuBERT's input from
    the runtime's numpy `raw_values`)."""
    x = torch.from_numpy(audio)[None]
    padded = torch.nn.functional.pad(x, (0, 320 - x.shape[-1] % 320))
    return padded, torch.from_numpy(raw_values(padded[0, 0].numpy(), 160, True))


def test_official_parity_encode_code(pair):
    ours, official = pair
    fsq = Fsq(PRESETS["distill"].levels)
    long, short = noise(24000 + 123, seed=3), noise(9000, seed=4)  # 1.5 s and a bit, 0.56 s at 16 kHz
    with torch.no_grad():
        padded, values = _prepared(long)
        torch.testing.assert_close(ours.codec_encoder(padded), official.codec_encoder(padded),
                                   atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(ours.semantic_model(values),
                                   official.semantic_model(values).last_hidden_state,
                                   atol=1e-4, rtol=1e-4)
        for audio in (long, short):
            want = official.encode_code(torch.from_numpy(audio)[None]).numpy()  # [1, 1, F]
            got = fsq.indices(ours.encode_latent(*_prepared(audio)).numpy())
            assert want.shape[-1] == audio.size // 320 + 1 and len(np.unique(want)) > 10  # codes that vary
            np.testing.assert_array_equal(got[:, None], want)
        # The short clip at the start of the long clip's window, the rest of the window the long
        # clip's: with the mask, the short clip's own codes (`want`, the last of the loop).
        audio, long_values = _prepared(long)
        short_audio, short_values = _prepared(short)
        frames = want.shape[-1]
        audio[..., :short_audio.shape[-1]] = short_audio
        long_values[:, :short_values.shape[-1]] = short_values
        mask = torch.zeros(1, 1, long_values.shape[-1] // 320 - 1)
        mask[..., :frames] = 1.0
        got = fsq.indices(ours.encode_latent(audio, long_values, mask).numpy())
    np.testing.assert_array_equal(got[:, None, :frames], want)


@pytest.mark.parametrize("normalize", [True, False])
def test_raw_values_are_transformers_feature_extractor(normalize):
    """DistilHuBERT's input as the official encode makes it: `Wav2Vec2FeatureExtractor` on the
    padded clip's tensor `[1, n]` with 160 zeros each side (normalised when its config says so)."""
    from transformers import Wav2Vec2FeatureExtractor

    clip = torch.from_numpy(noise(9000 + 320 - 9000 % 320, seed=6))
    fe = Wav2Vec2FeatureExtractor(do_normalize=normalize)
    want = fe(torch.nn.functional.pad(clip, (160, 160)), sampling_rate=16000,
              return_tensors="pt").input_values
    got = raw_values(clip[0].numpy(), 160, normalize)
    assert got.dtype == np.float32 and got.shape == (1, clip.shape[-1] + 320)
    np.testing.assert_array_equal(got, want.reshape(1, -1).numpy())


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return shared(tmp_path_factory, "neucodec-tiny-distill-b2", lambda f: cli_export(
        f, "neucodec", "--preset", "tiny-distill", "--len", "4000", "--batch", "2"))


def test_export_is_validated_and_portable(tiny_folder):
    from codecport.export.check import check_graph

    manifest = json.loads((tiny_folder / "manifest.json").read_text())
    assert manifest["preset"] == "tiny-distill" and manifest["semantic_model"] == "hubert"
    assert manifest["validation"]["encoder"] == {"codes_identical": 1.0}
    assert manifest["validation"]["encoder_b2"]["rows_codes_identical"] == 1.0
    eps = check_graph(tiny_folder / "encoder.onnx")["eps"]
    for ep in ("coreml-mlprogram", "directml", "wasm", "webgpu"):
        assert eps[ep]["full"], (ep, eps[ep])
    # The local attention's distance bias is built in the graph from its MLP, not stored: as a
    # constant it is heads x w x 2 w floats a layer stack (108 MB at the released window).
    from codecport.codecs.neucodec.distill import LocalAttention

    model = onnx.load(str(tiny_folder / "encoder.onnx"))
    shapes = {tuple(t.dims) for t in model.graph.initializer}
    windows = {(m.heads, m.window) for m in NeuCodec(PRESETS["tiny-distill"]).modules()
               if isinstance(m, LocalAttention)}
    assert len(windows) == 2 and not {(h, 1, w, 2 * w) for h, w in windows} & shapes, shapes
    # codec-bench's split of the encoder's time (BenchFacts.parts) finds the distilled encoder's parts.
    from codecport import registry
    from codecport.bench.facts import facts_of
    from codecport.bench.measure import node_times

    parts = {k: m for k, (g, m) in facts_of(registry.get("neucodec")).parts.items() if g == "encoder"}
    enc = node_times(tiny_folder / "encoder.onnx", parts, runs=3)
    assert enc.pop("the acoustic encoder")["ms"] == 0  # NeuCodec's, not in this model
    # Most of the time, not all: at this tiny size the joins and masks outside them weigh (10-20 %).
    assert all(p["ms"] > 0 for p in enc.values()) and 50 < sum(p["share_pct"] for p in enc.values()) <= 100.01


@pytest.mark.parametrize("samples", [320, 3333, 7679])  # one frame, a few, the graphs' 24 (16 kHz)
def test_a_clip_that_fits_is_the_reference_on_the_clip_alone(tiny_folder, samples):
    codec = codecport.load(tiny_folder)
    ref = init_random(NeuCodec(PRESETS["tiny-distill"]), seed=0).eval()  # what `--random-init` exports
    x = noise(samples, channels=2, seed=samples)
    codes = codec.encode(x, 16000)
    assert codes.mode == "fixed" and codes.data.shape == (2, 1, samples // 320 + 1)
    for c, row in enumerate(x):
        with torch.no_grad():
            latent = ref.encode_latent(*_prepared(row[None])).numpy()
        np.testing.assert_array_equal(codes.data[c, 0], Fsq(ref.cfg.levels).indices(latent)[0])
    audio, sr = codec.decode(codes)
    assert sr == 16000 and audio.shape == x.shape and np.isfinite(audio).all()


# ---- weights -------------------------------------------------------------------------------
LOAD = """
import json, sys, torch
from codecport.errors import CodecportError
from codecport.codecs.neucodec.weights import load
try:
    model, sha = load(sys.argv[1])
except CodecportError as e:
    print(json.dumps({"error": str(e)}))
else:
    torch.save(model.state_dict(), sys.argv[2])
    h = model.cfg.distill.hubert
    print(json.dumps({"sha": sha, "heads": h.heads, "normalize": h.normalize, "eps": h.eps}))
"""


def _normed(sd: dict[str, torch.Tensor], prefix: str, dim: int = 0) -> dict[str, torch.Tensor]:
    """`sd` with the weights of keys under `prefix` as torch's weight-norm parametrisation spells
    them (`g` keeping `dim`, the official layers' own spelling)."""
    return unfold_parametrized(sd, {k[:-len(".weight")]: dim for k, v in sd.items()
                                    if k.startswith(prefix) and k.endswith(".weight") and v.dim() > 1})


def official_files(model: NeuCodec, heads: int, normalize: bool) -> dict[str, bytes]:
    """The distilled release as the Hub holds it: `pytorch_model.bin` without the semantic model
    (weight-normed encoder, the empty cache tokens), and distilhubert's `model.safetensors` (its
    position conv normed over its kernel axis, as transformers does; the masked-prediction
    embedding) with its config files."""
    import io

    from safetensors.torch import save as save_safetensors

    from codecport.codecs.neucodec.config import DISTILL_REPO

    sd = model.state_dict()
    prefix = "semantic_model."
    bin_sd = _normed({k: v for k, v in sd.items() if not k.startswith(prefix)}, "codec_encoder.")
    bin_sd["codec_encoder.en_encoder.cache_token"] = torch.zeros(1, 0, model.cfg.distill.feature)
    hub = _normed({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)},
                  "encoder.pos_conv_embed.", 2)
    hub["masked_spec_embed"] = torch.rand(model.cfg.semantic_dim)
    buf = io.BytesIO()
    torch.save(bin_sd, buf)
    h = model.cfg.distill.hubert
    config = {"architectures": ["HubertModel"], "hidden_size": h.hidden, "num_hidden_layers": h.layers,
              "num_attention_heads": heads, "intermediate_size": h.intermediate, "feat_extract_norm": "group",
              "do_stable_layer_norm": False, "conv_bias": False, "num_conv_pos_embeddings": h.pos_kernel,
              "num_conv_pos_embedding_groups": h.pos_groups, "layer_norm_eps": 1e-5}
    return {"bin": buf.getvalue(), "hubert": save_safetensors(hub), "repo": DISTILL_REPO,
            "config.json": json.dumps(config).encode(),
            "preprocessor_config.json": json.dumps({"do_normalize": normalize,
                                                    "sampling_rate": 16000}).encode()}


def test_release_by_name_reads_distilhuberts_weights_and_configs(env, tmp_path):  # noqa: F811
    """`--weights distill`: the checkpoint from neuphonic/distill-neucodec, DistilHuBERT's weights,
    heads and normalisation from ntu-spml/distilhubert (served from 127.0.0.1 as the Hub does)."""
    import hashlib
    import subprocess
    import sys

    from test_neucodec_download import hubs

    from codecport.codecs.neucodec.config import RELEASES

    tiny = init_random(NeuCodec(PRESETS["tiny-distill"]), seed=0).eval()
    f = official_files(tiny, heads=1, normalize=False)
    repos = {RELEASES["distill"]: {"main": {"pytorch_model.bin": f["bin"]}},
             f["repo"]: {"main": {"model.safetensors": f["hubert"], "config.json": f["config.json"],
                                  "preprocessor_config.json": f["preprocessor_config.json"]}}}
    with hubs(repos) as (url, h):
        proc = subprocess.run([sys.executable, "-c", LOAD, "distill", str(tmp_path / "sd.pt")],
                              capture_output=True, text=True, env={**env, "HF_ENDPOINT": url},
                              timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (got["heads"], got["normalize"]) == (1, False)  # the configs', not the preset's (2, True)
    files = f["bin"] + f["hubert"] + f["config.json"] + f["preprocessor_config.json"]
    assert got["sha"] == hashlib.sha256(files).hexdigest()
    sd = torch.load(tmp_path / "sd.pt")
    for k, v in tiny.state_dict().items():
        torch.testing.assert_close(sd[k], v, rtol=1e-6, atol=1e-7)
    assert sorted(h[f["repo"]].gets) == sorted(f"/{f['repo']}/resolve/main/{n}" for n in
                                               ("model.safetensors", "config.json",
                                                "preprocessor_config.json"))


def test_a_folder_needs_distilhuberts_configs(tmp_path):
    from codecport.codecs.neucodec.weights import load
    from codecport.errors import CheckpointError

    tiny = init_random(NeuCodec(PRESETS["tiny-distill"]), seed=0).eval()
    f = official_files(tiny, heads=2, normalize=True)
    (tmp_path / "pytorch_model.bin").write_bytes(f["bin"])
    sub = tmp_path / "distilhubert"
    sub.mkdir()
    (sub / "model.safetensors").write_bytes(f["hubert"])
    with pytest.raises(CheckpointError, match="config.json: missing; the distilled NeuCodec needs"):
        load(str(tmp_path))
    (sub / "config.json").write_bytes(f["config.json"])
    (sub / "preprocessor_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="preprocessor_config.json: not a JSON config"):
        load(str(tmp_path))
    (sub / "preprocessor_config.json").write_bytes(f["preprocessor_config.json"])
    model, _ = load(str(tmp_path))
    assert model.cfg == PRESETS["tiny-distill"]
    (sub / "config.json").write_text(json.dumps({**json.loads(f["config.json"]),
                                                 "do_stable_layer_norm": True}))
    with pytest.raises(CheckpointError, match="do_stable_layer_norm is True; codecport computes"):
        load(str(tmp_path))
    # A DistilHuBERT without the projection's LayerNorm, as its config says.
    from safetensors.torch import load as load_safetensors
    from safetensors.torch import save as save_safetensors

    (sub / "config.json").write_text(json.dumps({**json.loads(f["config.json"]),
                                                 "feat_proj_layer_norm": False}))
    hub = {k: v for k, v in load_safetensors(f["hubert"]).items()
           if not k.startswith("feature_projection.layer_norm.")}
    (sub / "model.safetensors").write_bytes(save_safetensors(hub))
    model, _ = load(str(tmp_path))
    assert not model.cfg.distill.hubert.proj_norm
    assert isinstance(model.semantic_model.feature_projection.layer_norm, torch.nn.Identity)


def test_the_web_folder_gives_the_numpy_folders_codes_and_audio(tiny_folder, tmp_path_factory):
    """`--target web` (DistilHuBERT's normalised samples and the FSQ in the graphs, the browser's
    form: test_web_windows.py runs it there) against the numpy folder of the same weights."""
    web = codecport.load(distilled_web_folder(tmp_path_factory))
    numpy_folder = codecport.load(tiny_folder)
    assert web.rvq is None and web.raw_semantic and web.normalize
    for n in (3333, 20000):  # in one call, and through windows
        x = noise(n, channels=1, seed=n)
        got, want = web.encode(x, 16000), numpy_folder.encode(x, 16000)
        assert got.mode == want.mode and np.array_equal(got.data, want.data), n
        np.testing.assert_allclose(web.decode(got)[0], numpy_folder.decode(want)[0], atol=1e-5)
