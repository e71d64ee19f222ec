"""Build the official Qwen3-TTS-Tokenizer-12Hz with seeded random weights and write parity references.

Run it with a scratch venv's python, never the project's: `qwen-tts` pins transformers 4.57.3 and
pulls gradio, librosa, torchaudio and more, so it is never a codecport dependency.

    python3 -m venv /work/scratch/qwen
    /work/scratch/qwen/bin/pip install torch==2.13.0 qwen-tts==0.1.1
    /work/scratch/qwen/bin/python scripts/official_qwen3tts.py --config tiny --seed 0 --out DIR \
        [--reference CLIP.wav [--long]] [--threads 2]

No network is needed: the model is built from the config below (the released values for `12hz`,
see shared/reference/qwen3tts.md) and torchaudio, which only the 25 Hz tokenizer imports and whose
wheel does not load next to torch 2.13, is stubbed before `import qwen_tts`. The SoX and flash-attn
banners printed by that import are harmless.

DIR gets what `save_pretrained` writes (config.json, model.safetensors), plus pytorch_model.bin
(the same state dict, for `torch.load(weights_only=True)`) and preprocessor_config.json, so that
`Qwen3TTSTokenizer.from_pretrained(DIR)` works offline. With `--reference` (24 kHz mono), the
official model is reloaded from DIR and DIR/reference.npz holds:
  audio          [T] float32   the clip as encoded (with --long: tiled past 300 frames)
  codes          [F, K] int64  `model.encode` (asserted equal to the wrapper's `tok.encode`)
  latent         [1, C, F]     the encoder's pre-quantizer latent (after `downsample`)
  decoded        [F*hop]       `model.decoder(codes)` on the whole clip in one pass
  official_decode [F*hop]      `tok.decode`, i.e. `chunked_decode(chunk 300, left context 25)`
  chunked_25_72  [F*hop]       `chunked_decode(chunk 25, left context 72)`
"""

from __future__ import annotations

import argparse
import importlib.machinery
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

for _name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
    _mod = types.ModuleType(_name)
    _mod.__spec__ = importlib.machinery.ModuleSpec(_name, None)
    _mod.__path__ = []
    sys.modules[_name] = _mod

from qwen_tts import Qwen3TTSTokenizer  # noqa: E402
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config  # noqa: E402
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model  # noqa: E402
from transformers import EncodecFeatureExtractor  # noqa: E402

SR = 24000

# The released Qwen/Qwen3-TTS-Tokenizer-12Hz config (encoder = transformers' MimiConfig defaults).
CONFIGS = {
    "12hz": dict(
        hop=1920, valid=16,
        encoder=dict(
            _frame_rate=12.5, sampling_rate=SR, audio_channels=1, num_filters=64,
            upsampling_ratios=[8, 6, 5, 4], kernel_size=7, residual_kernel_size=3, last_kernel_size=3,
            dilation_growth_rate=2, compress=2,
            num_residual_layers=1, use_causal_conv=True, pad_mode="constant", use_conv_shortcut=False,
            trim_right_ratio=1.0, hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
            num_key_value_heads=8, head_dim=64, intermediate_size=2048, hidden_act="gelu", norm_eps=1e-5,
            layer_scale_initial_scale=0.01, rope_theta=10000, max_position_embeddings=8000,
            sliding_window=250,  # unused: the encoder's attention is full causal in transformers 4.57.3
            num_quantizers=32, num_semantic_quantizers=1, codebook_size=2048, codebook_dim=256,
            vector_quantization_hidden_dimension=256, upsample_groups=512),
        decoder=dict(
            codebook_size=2048, codebook_dim=512, num_quantizers=16, num_semantic_quantizers=1,
            semantic_codebook_size=4096, vector_quantization_hidden_dimension=512, latent_dim=1024,
            hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=16,
            num_key_value_heads=16, head_dim=64, hidden_act="silu", rms_norm_eps=1e-5, rope_theta=10000,
            max_position_embeddings=8000, sliding_window=72, layer_scale_initial_scale=0.01,
            attention_bias=False, attention_dropout=0.0, decoder_dim=1536, upsample_rates=[8, 5, 4, 3],
            upsampling_ratios=[2, 2]),
    ),
}
# Small shapes that keep every module kind and key name of the release: hop 480 (50 Hz), 8 RVQ levels
# of which 4 are kept, head_dim != hidden/heads, 4 decoder blocks. Decoder window 16, not 8: with 8
# the decoder's reach stays within chunked_decode's 25 frames of context, so `tok.decode` would equal
# one pass to float noise (8e-7); with 16 they differ by about 3e-4 past 300 frames. The encoder's
# sliding_window is unused in 4.57.3 (full causal); at 16 (8 frames) any port that windows it shows.
CONFIGS["tiny"] = dict(
    hop=480, valid=4,
    encoder={**CONFIGS["12hz"]["encoder"], **dict(
        _frame_rate=50.0, num_filters=8, upsampling_ratios=[5, 4, 4, 3], hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=16, intermediate_size=128,
        sliding_window=16, num_quantizers=8, codebook_size=64, codebook_dim=32,
        vector_quantization_hidden_dimension=32, upsample_groups=64)},
    decoder={**CONFIGS["12hz"]["decoder"], **dict(
        codebook_size=64, codebook_dim=64, num_quantizers=4, semantic_codebook_size=64,
        vector_quantization_hidden_dimension=64, latent_dim=48, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=16, sliding_window=16,
        decoder_dim=64, upsample_rates=[5, 4, 3, 2])},
)


def build(name: str) -> Qwen3TTSTokenizerV2Model:
    c = CONFIGS[name]
    cfg = Qwen3TTSTokenizerV2Config(
        encoder_config=c["encoder"], decoder_config=c["decoder"], encoder_valid_num_quantizers=c["valid"],
        input_sample_rate=SR, output_sample_rate=SR,
        encode_downsample_rate=c["hop"], decode_upsample_rate=c["hop"])
    return Qwen3TTSTokenizerV2Model(cfg).eval()


def calibration_clip(seed: int, seconds: float = 2.0) -> torch.Tensor:
    """A chirp plus noise, `[1, T]`."""
    t = np.arange(int(SR * seconds)) / SR
    rng = np.random.default_rng(seed)
    x = 0.3 * np.sin(2 * np.pi * (110 * t + 400 * t ** 2)) + 0.05 * rng.standard_normal(t.size)
    return torch.from_numpy(x.astype(np.float32))[None]


def encoder_latent(enc, wav: torch.Tensor) -> torch.Tensor:
    """Mimi's `_encode_frame` up to the quantizer: `[B, T]` -> `[B, C, F]`."""
    x = enc.encoder(wav[:, None])
    x = enc.encoder_transformer(x.transpose(1, 2), return_dict=True)[0]
    return enc.downsample(x.transpose(1, 2))


@torch.no_grad()
def randomise(model: Qwen3TTSTokenizerV2Model, seed: int) -> None:
    """The reference doc's recipe, deterministic in `seed` (scales get a little per-channel spread)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    last_conv = f"decoder.decoder.{len(model.decoder.decoder) - 1}.conv.weight"
    for name, p in model.named_parameters():
        owner = model.get_submodule(name.rsplit(".", 1)[0])
        leaf = name.rsplit(".", 1)[1]
        if isinstance(owner, (nn.Conv1d, nn.ConvTranspose1d, nn.Linear)) and leaf == "weight":
            fan_in = p[0].numel()
            if isinstance(owner, nn.ConvTranspose1d):
                fan_in = p.shape[0] * p.shape[2] / owner.stride[0]
            p.copy_(randn(*p.shape) / fan_in ** 0.5)
            if ".conv2.conv." in name:
                p.mul_(0.25)
            if name == last_conv:
                p.mul_(0.05)
        elif leaf == "bias":
            p.copy_(0.02 * randn(*p.shape))
        elif leaf == "weight":  # LayerNorm / RMSNorm
            p.copy_(1 + 0.05 * randn(*p.shape))
        elif leaf in ("alpha", "beta"):
            p.copy_(0.2 * randn(*p.shape))
        elif leaf in ("scale", "gamma"):
            p.copy_(0.1 + 0.01 * randn(*p.shape))
        elif leaf == "embedding_sum":
            p.copy_(randn(*p.shape))
        elif leaf == "cluster_usage":
            p.copy_(1 + 0.1 * randn(*p.shape).abs())
        else:
            raise KeyError(f"no rule for {name}")

    # Encoder codebooks (buffers), level by level on a calibration clip so that codes vary.
    latent = encoder_latent(model.encoder, calibration_clip(seed))
    q = model.encoder.quantizer
    for rvq in (q.semantic_residual_vector_quantizer, q.acoustic_residual_vector_quantizer):
        residual = rvq.input_proj(latent)
        for layer in rvq.layers:
            cb = layer.codebook
            usage = 1 + 0.1 * randn(cb.cluster_usage.shape[0]).abs()
            cb.cluster_usage.copy_(usage)
            cb.embed_sum.copy_(randn(*cb.embed_sum.shape) * residual.std() * usage[:, None])
            cb._embed = None
            residual = residual - layer.decode(layer.encode(residual))


def references(out: Path, clip: np.ndarray, hop: int, long: bool) -> dict:
    if long:  # tile past 300 frames, ending mid-frame
        clip = np.resize(clip, 310 * hop - hop // 3)
    t0 = time.perf_counter()
    tok = Qwen3TTSTokenizer.from_pretrained(str(out))
    model = tok.model
    print(f"wrapper load {time.perf_counter() - t0:.2f} s ({model.config._attn_implementation} attention)")
    wav = torch.from_numpy(clip)[None]
    with torch.inference_mode():
        t0 = time.perf_counter()
        codes = model.encode(wav, torch.ones_like(wav, dtype=torch.long)).audio_codes[0]
        took = time.perf_counter() - t0
        print(f"model.encode {clip.size / SR:.2f} s audio -> {tuple(codes.shape)}: {took:.2f} s")
        t0 = time.perf_counter()
        wrapped = tok.encode(clip, sr=SR).audio_codes[0]
        print(f"tok.encode: {time.perf_counter() - t0:.2f} s")
        assert torch.equal(codes, wrapped), "model.encode and tok.encode disagree"
        latent = encoder_latent(model.encoder, wav)
        frames = codes.shape[0]
        t0 = time.perf_counter()
        decoded = model.decoder(codes[None].transpose(1, 2)).flatten()
        print(f"model.decoder {frames} frames: {time.perf_counter() - t0:.2f} s")
        t0 = time.perf_counter()
        official = tok.decode({"audio_codes": [codes]})[0][0]
        print(f"tok.decode: {time.perf_counter() - t0:.2f} s")
        t0 = time.perf_counter()
        chunked = model.decoder.chunked_decode(codes[None].transpose(1, 2), 25, 72).flatten()
        print(f"chunked_decode(25, 72): {time.perf_counter() - t0:.2f} s")
    if frames <= 300:
        assert np.array_equal(official, decoded.numpy()), "tok.decode differs from one decoder pass"
    for name, y in (("official_decode", official), ("chunked_25_72", chunked.numpy())):
        print(f"  {name} vs decoded: max |diff| {np.abs(y - decoded.numpy()).max():.3g}")
    print(f"  codes: {len(np.unique(codes))} distinct of {codes.numel()}, decoded rms "
          f"{decoded.pow(2).mean().sqrt():.3f} peak {decoded.abs().max():.3f}")
    return dict(audio=clip, codes=codes.numpy(), latent=latent.numpy(), decoded=decoded.numpy(),
                official_decode=official, chunked_25_72=chunked.numpy())



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reference", type=Path, help="24 kHz mono clip to encode and decode")
    ap.add_argument("--long", action="store_true", help="tile the clip past 300 frames")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    model = build(args.config)
    n = sum(p.numel() for p in model.parameters())
    print(f"build {args.config}: {n / 1e6:.2f} M parameters, {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    randomise(model, args.seed)
    print(f"randomise: {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    torch.save(model.state_dict(), args.out / "pytorch_model.bin")
    EncodecFeatureExtractor(feature_size=1, sampling_rate=SR, padding_value=0.0,
                            return_attention_mask=True).save_pretrained(args.out)
    print(f"save: {time.perf_counter() - t0:.2f} s -> {args.out}")
    del model

    if args.reference:
        import soundfile as sf

        clip, sr = sf.read(args.reference, dtype="float32")
        assert sr == SR and clip.ndim == 1, f"need 24 kHz mono, got {sr} Hz shape {clip.shape}"
        refs = references(args.out, clip, CONFIGS[args.config]["hop"], args.long)
        np.savez(args.out / "reference.npz", **refs)
        print(f"wrote {args.out / 'reference.npz'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
