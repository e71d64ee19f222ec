"""Build the official Higgs Audio v2 tokenizer with seeded random weights and write parity references.

Run it with a scratch venv's python, never the project's: the official implementation is transformers'
`HiggsAudioV2TokenizerModel` (5.25.0), which imports torchaudio at top level; PyPI's torchaudio 2.11.1 is a
CUDA build whose `.so` files do not load here, and with them removed it imports as pure Python and its
`functional.resample` (all the model uses) runs unchanged. See shared/reference/higgs.md, "Offline recipe".

    python3 -m venv /work/scratch/higgs
    /work/scratch/higgs/bin/pip install torch==2.13.0 soundfile
    /work/scratch/higgs/bin/pip install transformers==5.25.0
    /work/scratch/higgs/bin/pip install --no-deps torchaudio==2.11.1
    rm /work/scratch/higgs/lib/python3*/site-packages/torchaudio/lib/*.so
    HF_HUB_OFFLINE=1 /work/scratch/higgs/bin/python scripts/official_higgs.py \
        --config tiny --seed 0 --out tests/data/higgs-official --references
    # the released shapes (805,665,628-byte model.safetensors, 527 tensors; not committed):
    HF_HUB_OFFLINE=1 /work/scratch/higgs/bin/python scripts/official_higgs.py \
        --config v2 --seed 0 --out /work/scratch/higgs-v2

No network is needed. DIR gets what `save_pretrained` writes (config.json, model.safetensors) plus
preprocessor_config.json (the `DacFeatureExtractor` of the release), so that
`HiggsAudioV2TokenizerModel.from_pretrained(DIR)` and `AutoFeatureExtractor.from_pretrained(DIR)` work
offline; the reload is checked to be bit-identical (every tensor, buffers included). With the default
`--threads 1` a rerun rewrites every file byte for byte; `--threads 2` changes the calibrated scales in the
last bits (outputs move by ~4e-6, codes do not change).

Configs. `v2` is the released `bosonai/higgs-audio-v2-tokenizer` (higgs.md "Released config": class
defaults except `target_bandwidths [0.5, 1, 1.5, 2]` and the DAC widths/ratios; HuBERT-base). `tiny` keeps
the architecture and every key name, and shrinks widths:
  - 24 kHz, DAC ratios [8, 5, 4, 2, 3] (hop 960, 25 Hz), semantic rate 16 kHz, `downsample_factor` 320:
    HuBERT's conv stack keeps its kernels [10,3,3,3,3,2,2] and strides [5,2,2,2,2,2,2] (total 320), so
    `semantic_downsample_factor` stays int(960 / 1.5 / 320) = 2, the 160-sample pad and `[:, ::2]` stay,
    and the frame-count bands of the raw (unpadded) path are those of the release.
  - HuBERT: conv_dim 32 x 7 (GroupNorm 32 groups), hidden 64, 2 layers, 4 heads (head 16), FFN 128,
    pos-conv k128 with 16 groups (4 channels a group; k128 kept so the dropped last frame stays),
    everything else HubertConfig defaults as in the release (group norm, no conv bias, post-LN, GELU).
  - DAC: encoder_hidden_size 4 (widths 4 -> 128), hidden_size 32 (the acoustic latent), decoder_hidden_size
    64 (widths 64 -> 2); DacConfig's unused quantizer fields stay at their defaults, as in the release.
  - Quantizer: codebook_size 64, codebook_dim 16, target_bandwidths [0.3, 0.6, 0.9, 1.2]: 6 bits x 25 Hz
    = 0.15 kbps a level, so 2/4/6/8 levels like the release's [0.5, 1, 1.5, 2] with 10 bits, and 8 by
    default. Both formulas that read the bandwidth (`num_quantizers` = 1000*bw // (25*6) and, in encode,
    floor(bw / 0.15)) give 2/4/6/8 for these literals; this is asserted below. (With 8 bits, 1.2 / 0.2
    floors to 5, so [0.4, 0.8, 1.2, 1.6] would not do.) The fc width is 32 + 64 = 96.
  SemanticEncoder/Decoder keep kernel 3, strides [1, 1], channel_ratios [1, 1], dilations [1, 1].

Weights (higgs.md's recipe, for any config; default init gives all-zero codebooks, so all-zero codes):
Conv/Linear weights ~ N(0, 1/fan_in) (ConvTranspose fan_in = in*k/stride), residual units' conv2 x0.25;
HuBERT's weight-normed pos-conv gets v ~ N(0, 1) and g ~ sqrt(out/k) with a little spread; biases
~ N(0, 0.02); norm weights ~ 1 + N(0, 0.05); Snake alpha = exp(N(0, 0.3)). `acoustic_encoder.conv2` is
divided by its output std on a 3 s calibration clip; the codebooks are set level by level from that clip's
latent (embed = mean + std * N(0, 1) per dimension, then quantize and subtract); `fc2` is divided so its
output std is 1 on random codes and `acoustic_decoder.conv2` scaled so the decoded rms is 0.15. The unused
buffers `embed_avg` and `cluster_size` are filled with values unrelated to `embed` (`inited` stays 1), so
a port that reads them instead of `embed` fails.

With `--references` the model and the extractor are reloaded from DIR and DIR gets (chirp + noise clips,
none of them the calibration clip; every array batch-free):
  encode-aligned.npz  T = 30*960;  encode-r118.npz  T = 27*960 + 118 (T mod 960 in [1, 118]);
  encode-r119.npz  T = 28*960 + 119 ([119, 631]);  encode-r632.npz  T = 29*960 + 632 ([632, 959]):
    audio        [T] float32          the raw clip
    input_values [ceil(T/960)*960]    `fe(raw_audio=audio, sampling_rate=24000)`: zero-padded on the right
    codes        [8, F] int64         `model.encode(input_values)` (the documented path), F = ceil(T/960)
    hubert       [64, F] float32      mean of HuBERT's hidden states, [::2] (the SemanticEncoder's input)
    semantic     [64, F]              SemanticEncoder output
    acoustic     [32, F]              DAC encoder output
    latent       [96, F]              `fc(cat(acoustic, semantic))`, the RVQ input (asserted to give codes)
    decoded      [F*960] float32      `model.decode(codes)`, untrimmed
  and, in the three unaligned files, the RAW `model.encode(audio)` without the extractor:
    codes_raw    [8, F_raw] int64     F_raw = floor(T/960) for r <= 118, else ceil(T/960)
    latent_raw   [96, F_raw]          its RVQ input
    raw_padded   bool                 whether encode took the `F.pad(x, (480, 480))` acoustic branch (r119)
  decode.npz: codes [8, 60] int64 (uniform random), decoded [57600] = `model.decode(codes)`, and
    decoded_30 [28800] = `model.decode(codes[:, :30])` alone (the decoder is non-causal, ±10 frames, so
    the two differ on frames 20-29 and agree to float noise on frames 0-19).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from transformers import (  # noqa: E402
    AutoFeatureExtractor,
    DacFeatureExtractor,
    HiggsAudioV2TokenizerConfig,
    HiggsAudioV2TokenizerModel,
)

SR = 24000
HOP = 960
RATIOS = [8, 5, 4, 2, 3]

CONFIGS = {
    "v2": dict(
        target_bandwidths=[0.5, 1, 1.5, 2],
        acoustic=dict(encoder_hidden_size=64, decoder_hidden_size=1024, hidden_size=256),
        semantic=dict(),
        codebook_size=1024, codebook_dim=64,
    ),
    "tiny": dict(
        target_bandwidths=[0.3, 0.6, 0.9, 1.2],
        acoustic=dict(encoder_hidden_size=4, decoder_hidden_size=64, hidden_size=32),
        semantic=dict(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            conv_dim=[32] * 7, conv_kernel=[10, 3, 3, 3, 3, 2, 2], conv_stride=[5, 2, 2, 2, 2, 2, 2],
            num_conv_pos_embeddings=128, num_conv_pos_embedding_groups=16),
        codebook_size=64, codebook_dim=16,
    ),
}

# (name, whole frames, T mod 960)
ENCODE_CASES = [("aligned", 30, 0), ("r118", 27, 118), ("r119", 28, 119), ("r632", 29, 632)]
DECODE_FRAMES, DECODE_CUT = 60, 30


def build(name: str) -> HiggsAudioV2TokenizerModel:
    c = CONFIGS[name]
    cfg = HiggsAudioV2TokenizerConfig(
        target_bandwidths=c["target_bandwidths"], sample_rate=SR, semantic_sample_rate=16000,
        downsample_factor=320, codebook_size=c["codebook_size"], codebook_dim=c["codebook_dim"],
        acoustic_model_config=dict(model_type="dac", downsampling_ratios=RATIOS, upsampling_ratios=RATIOS,
                                   **c["acoustic"]),
        semantic_model_config=dict(model_type="hubert", mask_time_prob=0.0, **c["semantic"]))
    assert cfg.hop_length == HOP and cfg.frame_rate == 25 and cfg.semantic_downsample_factor == 2, cfg
    assert cfg.num_quantizers == 8, cfg.num_quantizers
    model = HiggsAudioV2TokenizerModel(cfg).eval()
    levels = [model.quantizer.get_num_quantizers_for_bandwidth(bw) for bw in cfg.target_bandwidths]
    assert levels == [2, 4, 6, 8], levels
    return model


def clip(seed: int, n: int) -> np.ndarray:
    """A chirp with a slow envelope plus noise, `[n]` float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / SR
    f0 = 90 + 200 * rng.random()
    env = 0.6 + 0.4 * np.sin(2 * np.pi * (0.7 + rng.random()) * t)
    x = 0.3 * env * np.sin(2 * np.pi * (f0 * t + 350 * t ** 2)) + 0.05 * rng.standard_normal(n)
    return x.astype(np.float32)


def encode_parts(model: HiggsAudioV2TokenizerModel, x: torch.Tensor) -> tuple[dict, bool]:
    """`model.encode`'s steps up to the RVQ, for `x` `[1, 1, T]` (same calls, same branch)."""
    hubert = model._extract_semantic_features(x)
    semantic = model.encoder_semantic(hubert.transpose(1, 2))
    padded = model._get_conv1d_output_lengths(x.shape[2], model.acoustic_encoder) != semantic.shape[2]
    acoustic = model.acoustic_encoder(F.pad(x, (model.pad, model.pad)) if padded else x)
    latent = model.fc(torch.cat([acoustic, semantic], dim=1).transpose(1, 2)).transpose(1, 2)
    return dict(hubert=hubert.transpose(1, 2)[0], semantic=semantic[0], acoustic=acoustic[0],
                latent=latent[0]), padded


@torch.no_grad()
def randomise(model: HiggsAudioV2TokenizerModel, seed: int) -> None:
    """higgs.md's recipe, deterministic in `seed`; raises on any parameter it has no rule for."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    for name, p in model.named_parameters():
        owner_name, leaf = name.rsplit(".", 1)
        owner = model.get_submodule(owner_name)
        if leaf == "original1":  # weight-norm v of HuBERT's pos-conv, [out, in/groups, k]
            p.copy_(randn(*p.shape))
        elif leaf == "original0":  # weight-norm g, [1, 1, k]: g*v/|v| ~ N(0, 1/(in/groups*k))
            v = model.get_parameter(f"{owner_name}.original1")
            p.copy_(math.sqrt(v.shape[0] / v.shape[2]) * torch.exp(0.1 * randn(*p.shape)))
        elif isinstance(owner, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear)) and leaf == "weight":
            fan_in = p[0].numel()
            if isinstance(owner, nn.ConvTranspose1d):  # [in, out, k]
                fan_in = p.shape[0] * p.shape[2] / owner.stride[0]
            p.copy_(randn(*p.shape) / fan_in ** 0.5)
            if ".res_unit" in name and owner_name.endswith("conv2"):
                p.mul_(0.25)
        elif leaf == "bias":
            p.copy_(0.02 * randn(*p.shape))
        elif leaf == "weight" and isinstance(owner, (nn.LayerNorm, nn.GroupNorm)):
            p.copy_(1 + 0.05 * randn(*p.shape))
        elif leaf == "alpha":
            p.copy_(torch.exp(0.3 * randn(*p.shape)))
        else:
            raise KeyError(f"no rule for {name} {tuple(p.shape)} in {type(owner).__name__}")

    calib = torch.from_numpy(clip(10_000 + seed, 3 * SR))[None, None]
    conv2 = model.acoustic_encoder.conv2
    std = model.acoustic_encoder(calib).std()
    conv2.weight.div_(std)
    conv2.bias.div_(std)

    residual = encode_parts(model, calib)[0]["latent"][None]
    for q in model.quantizer.quantizers:
        z = q.project_in(residual.transpose(1, 2))[0]  # [frames, dim]
        cb = q.codebook
        cb.embed.copy_(z.mean(0) + z.std(0) * randn(*cb.embed.shape))
        cb.embed_avg.copy_(randn(*cb.embed_avg.shape))
        cb.cluster_size.copy_(1 + randn(*cb.cluster_size.shape).abs())
        residual = residual - q.decode(q.encode(residual))

    codes = torch.randint(0, model.config.codebook_size, (1, model.config.num_quantizers, 100), generator=g)
    q = model.quantizer.decode(codes.transpose(0, 1))
    std = model.fc2(q.transpose(1, 2)).std()
    model.fc2.weight.div_(std)
    model.fc2.bias.div_(std)
    conv2 = model.acoustic_decoder.conv2
    scale = 0.15 / model.decode(codes).audio_values.pow(2).mean().sqrt()
    conv2.weight.mul_(scale)
    conv2.bias.mul_(scale)


def save(model: HiggsAudioV2TokenizerModel, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    DacFeatureExtractor(feature_size=1, hop_length=HOP, padding_side="right", padding_value=0.0,
                        return_attention_mask=True, sampling_rate=SR).save_pretrained(out)
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as f:
        n = len(list(f.keys()))
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print(f"  {n} tensors; " + ", ".join(f"{k} {v:,} B" for k, v in sizes.items()))


def stats(codes: np.ndarray) -> str:
    per = [len(np.unique(c)) for c in codes]
    return f"{len(np.unique(codes))} distinct values over all levels, per level {per}"


@torch.no_grad()
def references(out: Path, built: HiggsAudioV2TokenizerModel, seed: int) -> None:
    t0 = time.perf_counter()
    model = HiggsAudioV2TokenizerModel.from_pretrained(out).eval()
    fe = AutoFeatureExtractor.from_pretrained(out)
    print(f"reload {time.perf_counter() - t0:.2f} s ({type(fe).__name__}, "
          f"HuBERT {model.semantic_model.config._attn_implementation} attention)")
    ours, theirs = built.state_dict(), model.state_dict()
    assert ours.keys() == theirs.keys(), set(ours) ^ set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), "reload is not bit-identical"

    for i, (name, frames, r) in enumerate(ENCODE_CASES):
        audio = clip(seed + 1 + i, frames * HOP + r)
        x = fe(raw_audio=audio, sampling_rate=SR, return_tensors="pt")["input_values"]
        assert x.shape == (1, 1, math.ceil(audio.size / HOP) * HOP), x.shape
        assert torch.equal(x[0, 0, :audio.size], torch.from_numpy(audio)) and not x[0, 0, audio.size:].any()
        t0 = time.perf_counter()
        codes = model.encode(x).audio_codes
        took = time.perf_counter() - t0
        parts, padded = encode_parts(model, x)
        assert not padded
        assert torch.equal(model.quantizer.encode(parts["latent"][None]).transpose(0, 1), codes)
        low = model.encode(x, bandwidth=model.config.target_bandwidths[0]).audio_codes
        assert torch.equal(low, codes[:, :2]), "RVQ levels are not a prefix"
        t1 = time.perf_counter()
        decoded = model.decode(codes).audio_values
        took_dec = time.perf_counter() - t1
        assert decoded.shape == (1, 1, codes.shape[2] * HOP), decoded.shape
        ref = dict(audio=audio, input_values=x[0, 0].numpy(), codes=codes[0].numpy(),
                   decoded=decoded[0, 0].numpy(), **{k: v.numpy() for k, v in parts.items()})
        print(f"{name}: T={audio.size} (mod 960 = {r}) -> codes {tuple(ref['codes'].shape)};"
              f" encode {took:.2f} s, decode {took_dec:.2f} s; decoded rms {decoded.pow(2).mean().sqrt():.3f}"
              f" peak {decoded.abs().max():.3f}; latent std {parts['latent'].std():.3f}")
        print(f"  codes: {stats(ref['codes'])}")
        if r:
            wav = torch.from_numpy(audio)[None, None]
            raw = model.encode(wav).audio_codes
            raw_parts, raw_padded = encode_parts(model, wav)
            assert torch.equal(model.quantizer.encode(raw_parts["latent"][None]).transpose(0, 1), raw)
            ref.update(codes_raw=raw[0].numpy(), latent_raw=raw_parts["latent"].numpy(),
                       raw_padded=np.array(raw_padded))
            n = min(raw.shape[2], codes.shape[2])
            same = (raw[0, :, :n] == codes[0, :, :n]).float().mean().item()
            print(f"  raw encode: codes {tuple(raw.shape[1:])}, 480-pad branch {raw_padded}; equal to the "
                  f"extractor path on {same:.1%} of the {n} common frames' codes, frame 0 level 0 "
                  f"{'same' if raw[0, 0, 0] == codes[0, 0, 0] else 'differs'}")
        np.savez_compressed(out / f"encode-{name}.npz", **ref)

    g = torch.Generator().manual_seed(seed + 100)
    codes = torch.randint(0, model.config.codebook_size, (1, model.config.num_quantizers, DECODE_FRAMES),
                          generator=g)
    t0 = time.perf_counter()
    whole = model.decode(codes).audio_values[0, 0]
    took = time.perf_counter() - t0
    cut = model.decode(codes[:, :, :DECODE_CUT]).audio_values[0, 0]
    diff = (whole[:cut.numel()] - cut).abs().reshape(DECODE_CUT, HOP).amax(1)
    print(f"decode: {DECODE_FRAMES} random frames in {took:.2f} s, rms {whole.pow(2).mean().sqrt():.3f}; "
          f"first {DECODE_CUT} alone vs whole, max |diff| frames 0-{DECODE_CUT - 11}: "
          f"{diff[:DECODE_CUT - 10].max():.2g}, frames {DECODE_CUT - 10}-{DECODE_CUT - 1}: "
          + " ".join(f"{d:.2g}" for d in diff[DECODE_CUT - 10:]))
    np.savez_compressed(out / "decode.npz", codes=codes[0].numpy(), decoded=whole.numpy(),
                        decoded_30=cut.numpy())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--references", action="store_true", help="write the reference .npz files into OUT")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    model = build(args.config)
    n = sum(p.numel() for p in model.parameters())
    print(f"build {args.config}: {n / 1e6:.3f} M parameters, {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    randomise(model, args.seed)
    print(f"randomise: {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    save(model, args.out)
    print(f"save: {time.perf_counter() - t0:.2f} s -> {args.out}")
    print("config:", json.dumps({k: v for k, v in model.config.to_diff_dict().items()
                                 if k not in ("acoustic_model_config", "semantic_model_config")}))
    if args.references:
        references(args.out, model, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
