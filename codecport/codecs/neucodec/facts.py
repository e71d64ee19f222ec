"""NeuCodec's part of codec-bench: its torch reference (fbank features in numpy, as the runtime
computes them) and the official package (`neucodec`, installed without its pins:
scripts/official-neucodec.txt) on the bench's weights; the time our graphs spend in the ISTFT and
the semantic path."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ...bench.facts import BenchFacts, Official
from ...bench.measure import clip, flat_codes, summary, timed, timings

RELEASED = ("neucodec", "distill")  # the official package builds these configs only (its sizes are fixed)


def torch_codes(model, x, k) -> list[np.ndarray]:
    """Codes `[B, 1, frames]` of the torch reference for 16 kHz audio `x` `[B, 1, T]`: padded as the
    official `_prepare_audio`, fbank features in numpy (of the padded clip, itself padded by
    `fbank_pad` for XCodec2; the distilled variant's DistilHuBERT samples), the FSQ in numpy."""
    import torch

    from .fbank import Fbank, raw_values
    from .fsq import Fsq

    hop, pad = int(np.prod(model.cfg.enc_strides)), model.cfg.fbank_pad
    x = torch.nn.functional.pad(x, (0, hop - x.shape[-1] % hop))
    if model.cfg.distill:  # DistilHuBERT's samples
        normalize = model.cfg.distill.hubert.normalize
        feats = torch.from_numpy(np.concatenate([raw_values(row[0].numpy(), pad, normalize) for row in x]))
    else:
        feats = torch.from_numpy(np.stack([Fbank().features(np.pad(row[0].numpy(), pad)) for row in x]))
    with torch.no_grad():
        latent = model.encode_latent(x, feats).numpy()
    return [Fsq(model.cfg.levels).indices(latent)[:, None]]


def torch_encode(model, x, k):
    import torch

    return torch.from_numpy(torch_codes(model, x, k)[0])


def import_stubbed(*modules: str) -> list:
    """`modules` of an official package (neucodec, xcodec2), imported offline: torchaudio, which
    they import but whose wheels stop at torch 2.11, is stubbed (their tensor paths never call it)."""
    import importlib
    import importlib.machinery
    import sys
    import types
    import warnings

    for name in ("torchaudio", "torchaudio.transforms", "torchaudio.functional"):
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None)  # transformers checks it
            sys.modules[name] = stub
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao: no C++ extensions for this torch
        return [importlib.import_module(m) for m in modules]


def import_official():
    """The official `neucodec` package, imported offline."""
    nc, _ = import_stubbed("neucodec", "neucodec.codec_decoder_vocos")
    return nc


def offline(module, build, semantic_layers: int = 24, intermediate: int | None = None):
    """`build()` of an official model (NeuCodec's, XCodec2's) without the network: the
    `from_pretrained` calls `module` makes for w2v-BERT 2.0 and its feature extractor get the
    released config (24 layers, as the official encode runs them all to read the 16th;
    `intermediate` narrows the feed-forward for tests) and transformers' extractor."""
    from unittest import mock

    from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertConfig, Wav2Vec2BertModel

    w2v = Wav2Vec2BertConfig(num_hidden_layers=semantic_layers, output_hidden_states=True,
                             **({"intermediate_size": intermediate} if intermediate else {}))
    with mock.patch.object(module.Wav2Vec2BertModel, "from_pretrained",
                           lambda *a, **k: Wav2Vec2BertModel(w2v)), \
            mock.patch.object(module.AutoFeatureExtractor, "from_pretrained",
                              lambda *a, **k: SeamlessM4TFeatureExtractor()):
        return build().eval()


def build_official(nc, semantic_layers: int = 24):
    """The official `NeuCodec(24000, 480)`, built offline."""
    return offline(nc.model, lambda: nc.NeuCodec(24000, 480), semantic_layers)


def build_distill(nc, cfg):
    """The official `DistillNeuCodec(24000, 480)`, built offline: DistilHuBERT from a transformers
    config of `cfg`'s sizes and its feature extractor's normalisation."""
    from unittest import mock

    from transformers import HubertConfig, HubertModel, Wav2Vec2FeatureExtractor

    h = cfg["distill"]["hubert"]
    hubert = HubertConfig(num_hidden_layers=h["layers"], hidden_size=h["hidden"],
                          num_attention_heads=h["heads"], intermediate_size=h["intermediate"],
                          conv_bias=False, feat_extract_norm="group",
                          do_stable_layer_norm=False, layer_norm_eps=h["eps"])
    with mock.patch.object(nc.model.HubertModel, "from_pretrained", lambda *a, **k: HubertModel(hubert)), \
            mock.patch.object(nc.model.AutoFeatureExtractor, "from_pretrained",
                              lambda *a, **k: Wav2Vec2FeatureExtractor(do_normalize=h["normalize"])):
        return nc.model.DistillNeuCodec(24000, 480).eval()


def run_official(job: dict) -> dict:
    """The official package on the bench's weights, as its users run it: `encode_code` on 16 kHz
    audio `[B, 1, T]`, `decode_code`."""
    try:
        nc = import_official()
    except ImportError as e:
        return {"skipped": f"neucodec does not import ({e})"}
    cfg = json.loads((Path(job["dir"]) / "config.json").read_text())
    if cfg.get("distill"):  # its weight-normed layers are torch parametrisations
        from ...models.checkpoint import unfold_parametrized, weight_norm_dims

        official = build_distill(nc, cfg)
        kept = weight_norm_dims(official)
        return run_package(job, official, "neucodec", lambda x: x, lambda sd: unfold_parametrized(sd, kept))
    return run_package(job, build_official(nc), "neucodec", lambda x: x)


def run_package(job: dict, official, package: str, shape, to_official=lambda sd: sd) -> dict:
    """An official model (NeuCodec's or XCodec2's) on the bench's weights (the layers past
    w2v-BERT's 16th keep their random init: the official encode computes them and reads the
    16th): `encode_code` on 16 kHz audio (`shape` turns `[B, 1, T]` into what it takes),
    `decode_code`, under `torch.inference_mode`. `to_official` spells our keys as its."""
    from importlib.metadata import version

    import torch
    from safetensors.torch import load_file

    from ...models.checkpoint import unfold_weight_norm

    folder = Path(job["dir"])
    sd = load_file(folder / "weights.safetensors")
    sd = to_official({**sd, **unfold_weight_norm({k: v for k, v in sd.items() if k.startswith("CodecEnc.")})})
    missing, _ = official.load_state_dict(sd, strict=False)
    # What may stay random: w2v-BERT past the layers NeuCodec reads (and DistilHuBERT's
    # masked-prediction embedding), and the ISTFT window (a constant the official model holds as a buffer).
    # The distilled encoder's cache tokens are empty.
    lacking = [k for k in missing
               if not k.startswith("semantic_model.") and not k.endswith(("istft.window", "cache_token"))]
    if lacking:
        return {"skipped": f"the official model has parameters the bench's weights lack ({lacking[0]})"}
    geo = json.loads((folder / "model" / "manifest.json").read_text())["geometry"]
    x = shape(torch.from_numpy(clip(int(geo["input_samples"])))[:, None])
    with torch.inference_mode():
        codes, enc = timed(lambda: official.encode_code(x), job["runs"])
        dec = timings(lambda: official.decode_code(codes), job["runs"])
    return {"encode": summary(enc, job["seconds"]), "decode": summary(dec, job["seconds"]),
            "threads": torch.get_num_threads(), "version": version(package),
            "codes": flat_codes([codes.numpy()]).tolist()}


def clip_samples(cfg, seconds: float) -> int:
    """Samples at the output rate of `seconds` of whole frames."""
    return max(2, round(seconds * cfg.sample_rate / cfg.hop)) * cfg.hop


def family_facts(package: str, released: tuple[str, ...], run) -> BenchFacts:
    """The bench facts of a codec on NeuCodec's model, its official `package` run by `run` on
    the `released` config only (the official sizes are fixed)."""
    return BenchFacts(
        # The released models are about 630 M parameters; the demo's export stays small.
        demo_preset="tiny", demo_seconds=1.0, clip_samples=clip_samples, web_preset=released[0],
        torch_encode=torch_encode, torch_codes=torch_codes,
        official=Official(package, package, "pip install --no-deps -r scripts/official-neucodec.txt (its own "
                                            "pins would replace codecport's torch)"),
        contenders={"official": run},
        skip=lambda contender, preset: "the released configs only (the official sizes are fixed)"
        if contender == "official" and preset not in released else None,
        # Where the time of our graphs goes: torch module paths, which the ONNX nodes keep in their names.
        parts={"the ISTFT": ("decoder", "head.istft"), "the semantic model": ("encoder", "semantic_model"),
               "the semantic encoder": ("encoder", "SemanticEncoder_module"),
               "the acoustic encoder": ("encoder", "CodecEnc"),
               "the distilled acoustic encoder": ("encoder", "codec_encoder")},
    )


FACTS = family_facts("neucodec", RELEASED, run_official)
