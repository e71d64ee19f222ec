"""Build Fish Audio's modded DAC (OpenAudio S1 codec) with seeded random weights and write parity references.

The model is the OFFICIAL one: `fish_speech.models.dac.modded_dac.DAC` from PyPI fish-speech 0.1.0
(Apache-2.0), built by hydra from its packaged `configs/modded_dac_vq.yaml`. Run this with a scratch
venv's python, never the project's (shared/reference/fish.md, "Offline recipe"):

    python3 -m venv /work/scratch/fish
    /work/scratch/fish/bin/pip install torch==2.13.0
    /work/scratch/fish/bin/pip install --no-deps fish-speech==0.1.0 descript-audio-codec==1.0.0 \
        descript-audiotools==0.7.2
    /work/scratch/fish/bin/pip install numpy einops soundfile scipy julius ffmpy importlib-resources \
        flatten-dict rich tqdm argbind randomname hydra-core==1.3.8
    /work/scratch/fish/bin/python scripts/official_fish.py --config tiny --seed 0 \
        --out tests/data/fish-official
    /work/scratch/fish/bin/python scripts/official_fish.py --config s1 --seed 0 --out DIR --no-references

On 1 CPU thread the tiny run takes about 4 s in all; s1 builds (391.4 M parameters) and saves in about
25 s, a codec.pth of 1,871,052,671 bytes and 541 tensors like the released one (not committed).

`--no-deps` because fish-speech pins numpy<=1.26.4, pyaudio, gradio, lightning and wandb, and the
descript packages want torchaudio, whose wheels do not load next to torch 2.13. torchaudio, librosa and
torch.utils.tensorboard are imported by that code but never called here, so they are stubbed below.

Licences: fish-speech 0.1.0 is Apache-2.0 (only its architecture is used, through its own classes);
descript-audio-codec 1.0.0 / descript-audiotools 0.7.2 are MIT. The released S1-mini / S2 Pro weights
are non-commercial (CC-BY-NC-SA-4.0 / Fish Audio Research License): none are downloaded or used here,
every weight below is drawn from a seeded generator.

DIR gets
  config.yaml  the resolved hydra config (yaml + the TINY overrides), instantiable as it is
  codec.pth    `torch.save(model.state_dict())`: the released file's layout, a flat state dict with
               weight norm unfolded (`parametrizations.weight.original0/1`, VQ `weight_g/weight_v`),
               the bf16 `freqs_cis` and bool `causal_mask` buffers; fp32 weights.
and, unless --no-references, the model is reloaded from DIR the way the official
`fish_speech.models.dac.inference.load_model` does (its body; it needs lightning and pyrootutils
itself): `instantiate(config)`, `torch.load(mmap=True, weights_only=True)`,
`load_state_dict(strict=False, assign=True)`, `eval()`. Everything is fp32 on CPU. Audio is PCM16
valued (k / 32768) so that the compressed .npz stay small. Code frame = 2048 samples at 44.1 kHz.

  encode_exact.npz    a clip of 12 frames (24576 samples):
      audio [T] f32, codes [10, F] i64 (`model.encode`), lens [1] (its second output), vq_margin [10, F]
      (top-1 minus top-2 of -dist in each VQ, see `Margins`; near 0 = a near-tie a port may flip),
      latent [64, 4F] (`model.encoder` of the zero-padded audio), z_pre [64, F]
      (`quantizer.pre_module(quantizer.downsample(latent))`, the VQ input), z_q [64, 4F]
      (`quantizer.decode(codes)`: after post_module + upsample, the decoder's input),
      decoded [F*2048] (`model.decode(codes, lens)`, untrimmed).
  encode_partial.npz  the same keys for a clip of 11 frames + 1000 samples, which ends inside its last
      frame: `encode` zero-pads it to F = 12 frames and `decode` returns all F*2048 samples.
  causal_prefix.npz   a 136-frame clip (278528 samples, 6.3 s; past the encoder transformer's 512-hop
      window, which is 128 code frames, and past the pre/post window of 8): audio, codes [10, 136],
      vq_margin, z_pre [64, 136] (the VQ input, as above), and codes_prefix_40 / codes_prefix_132 =
      `encode(audio[:N*2048])`, asserted equal to codes[:, :N] (the codec is causal). The encoder
      transformer's window shows in z_pre only: without it z_pre moves by ~4e-4 from frame 128 on, but no
      code changes (printed as a diagnostic, as is the pre_module window, which does change codes).
  decode_window.npz   codes [10, 24] uniform random (3x the pre/post window), decoded [24*2048]
      (one pass), decoded_prefix [12*2048] = decode of codes[:, :12] alone, asserted equal to
      decoded[:12*2048] within 1e-5.
  decode_clamp.npz    codes [10, 8] with entries above the codebook sizes (row 0 > 1023, rows 1-9 > 255,
      up to 10**6), codes_clamped (upper clamp only, as `DownsampleResidualVectorQuantize.decode` does),
      decoded [8*2048] = decode(codes), asserted bit-equal to decode(codes_clamped); the caller's codes are
      asserted unchanged (0.1.0 clamps a copy; GitHub HEAD clamps in place).

TINY overrides (`TINY` below) keep the architecture of `modded_dac_vq.yaml` (causal, 44.1 kHz, hop 512,
encoder_rates [2,4,8,8], decoder_rates [8,8,4,2], quantizer downsample_factor [2,2] so one code frame is
2048 samples, 1 semantic + 9 residual codebooks of dim 8, window-limited causal transformers after the
encoder and in pre/post_module, every module kind and key name of the release) with small sizes:
  encoder_dim 4                  (64) encoder channels 8/16/32/64; latent_dim stays derived
                                  (encoder_dim * 2**4 = 64, as 1024 in the release)
  encoder_transformer_layers [0, 0, 0, 2]  (4) two layers, to test stacking. EncoderBlock hardcodes
                                  n_head = dim // 64 (= 1 head of head_dim 64 here), FFN = 3 * dim = 192
                                  and window_size = 512 (hops), so those are not overridable
  transformer_general_config.block_size 576  (16384) RoPE rows and causal_mask of the encoder transformer:
                                  576 hops = 144 code frames (6.7 s) covers the 136-frame clip; the
                                  mask is 576**2 bools = 332 KB
  decoder_dim 64                 (1536) decoder channels 64/32/16/8/4
  quantizer.input_dim 64         (1024) = latent_dim
  quantizer.semantic_codebook_size 1024, quantizer.codebook_size 256  (4096, 1024) smaller tables, still
                                  different sizes (so the clamp differs per row) and still 4:1
  quantizer.{pre,post}_module: input_dim 64 = config.dim 64 (equal, as in the release, so no
                                  input/output projection), window_size 8 (128) so that streams past
                                  the window are cheap to test, config n_layer 2 (8), n_head 4 (16),
                                  head_dim 16 (64; n_head * head_dim = dim as in the release),
                                  intermediate_size 192 (3072; 3 * dim as in the release),
                                  block_size 144 (4096; 144 code frames, the mask is 144**2 bools)
Unchanged: sample_rate 44100, encoder_rates, decoder_rates, decoder_transformer_layers [4, 0, 0, 0]
(DecoderBlock builds that transformer but never registers it: no weights either way), rope_base 10000,
norm_eps 1e-5, n_codebooks 9, codebook_dim 8, downsample_factor [2, 2], causal (the DAC default, True).

Randomisation (`randomise`, deterministic in --seed; fish.md "Offline recipe"): the official init starts
near identity (LayerScale 1e-2, ConvNeXt gamma 1e-6, Snake alpha 1, g = ||v||), which hides mistakes.
Every conv/linear weight is N(0, 1/fan_in) (a ConvTranspose's fan-in is C_in * k / stride); weight norm
g = ||v|| * exp(N(0, 0.2)) per row of dim 0 (a ConvTranspose's C_in), so g != ||v||;
Snake alpha = exp(N(0, 0.3)); LayerScale and ConvNeXt gamma = 0.1 + N(0, 0.01); RMSNorm / LayerNorm
weights 1 + N(0, 0.05); biases N(0, 0.02); codebooks N(0, 1). Through g, the decoder's ResidualUnit 1x1
convs are scaled by DECODER_1X1_SCALE = 0.3 and its last conv by LAST_CONV_SCALE = 0.1 so that the
output stays off the tanh rails: tiny's pre-tanh std is then about 0.25 and the decoded rms about 0.24
(printed: rms, peak, share above 0.99; with 0.3 for the last conv a decode had rms 0.55, peaks 0.997).
"""

from __future__ import annotations

import argparse
import copy
import importlib.machinery
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def _stub(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    mod.__path__ = []
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


# Imported at the top of 0.1.0's modded_dac.py (torchaudio, librosa) and by audiotools.ml (tensorboard),
# never called on the paths used here.
_stub("torchaudio", functional=_stub("torchaudio.functional"), transforms=_stub("torchaudio.transforms"))
_stub("librosa")
_stub("torch.utils.tensorboard", SummaryWriter=object)

import fish_speech.models.dac.modded_dac as md  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

SR = 44100
FRAME = 2048  # samples per code frame: hop 512 * downsample 2 * 2
YAML = os.path.join(os.path.dirname(md.__file__), "..", "..", "configs", "modded_dac_vq.yaml")

_WINDOWED = dict(
    input_dim=64, window_size=8,
    config=dict(block_size=144, n_layer=2, n_head=4, dim=64, intermediate_size=192, head_dim=16))
# Overrides of the packaged modded_dac_vq.yaml; see the module docstring for why each value.
TINY = dict(
    encoder_dim=4,
    encoder_transformer_layers=[0, 0, 0, 2],
    transformer_general_config=dict(block_size=576),
    decoder_dim=64,
    quantizer=dict(
        input_dim=64, semantic_codebook_size=1024, codebook_size=256,
        pre_module=copy.deepcopy(_WINDOWED), post_module=copy.deepcopy(_WINDOWED)),
)
CONFIGS = {"s1": {}, "tiny": TINY}
DECODER_1X1_SCALE = 0.3
LAST_CONV_SCALE = 0.1


def config(name: str):
    return OmegaConf.merge(OmegaConf.load(YAML), OmegaConf.create(CONFIGS[name]))


def _fan_in(module: nn.Module, weight: torch.Tensor) -> float:
    if isinstance(module, nn.ConvTranspose1d):  # weight [C_in, C_out / groups, k]
        return weight.shape[0] * weight.shape[2] / module.stride[0]
    return weight[0].numel()  # Conv1d [C_out, C_in / groups, k], Linear [out, in]


@torch.no_grad()
def randomise(model: nn.Module, seed: int) -> None:
    """Redraw every parameter (module docstring); buffers (freqs_cis, causal_mask) are left as built."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    n_dec = len(model.decoder.model)
    scaled = {f"decoder.model.{n_dec - 2}.conv": LAST_CONV_SCALE}  # the conv before tanh
    for i in range(1, n_dec - 3):
        for j in (2, 3, 4):
            scaled[f"decoder.model.{i}.block.{j}.block.3.conv"] = DECODER_1X1_SCALE

    def weight_norm(owner: str, conv: nn.Module, gain: torch.Tensor, direction: torch.Tensor) -> None:
        direction.copy_(randn(*direction.shape) / _fan_in(conv, direction) ** 0.5)
        norm = direction.flatten(1).norm(dim=1).view(-1, *[1] * (direction.ndim - 1))
        gain.copy_(norm * torch.exp(0.2 * randn(*gain.shape)) * scaled.get(owner, 1.0))

    done = set()
    for name, p in model.named_parameters():
        if name in done:
            continue
        owner_name, leaf = name.rsplit(".", 1)
        if name.endswith(".parametrizations.weight.original0"):  # torch parametrized weight norm
            conv_name = name[: -len(".parametrizations.weight.original0")]
            conv = model.get_submodule(conv_name)
            v = conv.parametrizations.weight.original1
            weight_norm(conv_name, conv, p, v)
            done.add(conv_name + ".parametrizations.weight.original1")
        elif leaf == "weight_g":  # legacy weight norm (descript VQ projections)
            conv = model.get_submodule(owner_name)
            weight_norm(owner_name, conv, p, conv.weight_v)
            done.add(owner_name + ".weight_v")
        elif name.endswith(".parametrizations.weight.original1") or leaf == "weight_v":
            raise KeyError(f"{name} before its gain")
        elif leaf == "alpha":  # Snake
            p.copy_(torch.exp(0.3 * randn(*p.shape)))
        elif leaf == "gamma":  # LayerScale, ConvNeXt
            p.copy_(0.1 + 0.01 * randn(*p.shape))
        elif name.endswith("codebook.weight"):
            p.copy_(randn(*p.shape))
        elif leaf == "bias":
            p.copy_(0.02 * randn(*p.shape))
        elif leaf == "weight":
            owner = model.get_submodule(owner_name)
            if isinstance(owner, (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)):
                p.copy_(randn(*p.shape) / _fan_in(owner, p) ** 0.5)
            elif isinstance(owner, (nn.LayerNorm, md.RMSNorm)):
                p.copy_(1 + 0.05 * randn(*p.shape))
            else:
                raise KeyError(f"no rule for {name} ({type(owner).__name__})")
        else:
            raise KeyError(f"no rule for {name}")


def load_official(out: Path) -> nn.Module:
    """The body of fish_speech.models.dac.inference.load_model (0.1.0), on CPU."""
    model = instantiate(OmegaConf.load(out / "config.yaml"))
    state_dict = torch.load(out / "codec.pth", map_location="cpu", mmap=True, weights_only=True)
    if "state_dict" in state_dict:
        state_dict = state_dict["state_dict"]
    if any("generator" in k for k in state_dict):
        state_dict = {k.replace("generator.", ""): v for k, v in state_dict.items() if "generator." in k}
    result = model.load_state_dict(state_dict, strict=False, assign=True)
    assert not result.missing_keys and not result.unexpected_keys, result
    return model.eval()


def clip(seed: int, frames: int, extra: int = 0) -> np.ndarray:
    """A chirp with a tremolo plus noise, PCM16 valued, `frames * 2048 + extra` samples."""
    n = frames * FRAME + extra
    t = np.arange(n) / SR
    rng = np.random.default_rng(seed)
    x = (0.3 * np.sin(2 * np.pi * (110 * t + 300 * t ** 2)) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
         + 0.05 * rng.standard_normal(n))
    return (np.round(np.clip(x, -1, 1) * 32767) / 32768).astype(np.float32)


class Margins:
    """Forward hooks on the 10 VectorQuantize modules: top-1 minus top-2 of `-dist` per frame, computed
    like descript's `decode_latents` from the `z_e` it returns, and checked against its indices."""

    def __init__(self, model: nn.Module):
        q = model.quantizer
        self.vqs = [q.semantic_quantizer.quantizers[0], *q.quantizer.quantizers]
        self.rows: list[np.ndarray] = []
        self.handles = [vq.register_forward_hook(self.hook) for vq in self.vqs]

    def hook(self, vq, _inputs, outputs) -> None:
        indices, z_e = outputs[3], outputs[4]
        enc = F.normalize(z_e.transpose(1, 2).reshape(-1, z_e.shape[1]))
        cb = F.normalize(vq.codebook.weight)
        dist = enc.pow(2).sum(1, keepdim=True) - 2 * enc @ cb.t() + cb.pow(2).sum(1, keepdim=True).t()
        top = (-dist).topk(2, dim=1)
        assert torch.equal(top.indices[:, 0], indices.flatten()), "margin hook disagrees with the VQ"
        self.rows.append((top.values[:, 0] - top.values[:, 1]).numpy().astype(np.float32))

    def take(self) -> np.ndarray:
        rows, self.rows = self.rows, []
        assert len(rows) == len(self.vqs), len(rows)
        return np.stack(rows)


def encode(model: nn.Module, audio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = torch.from_numpy(audio)[None, None]
    codes, lens = model.encode(x, torch.tensor([audio.size]))
    return codes[0].numpy(), lens.numpy()


def decode(model: nn.Module, codes: np.ndarray) -> np.ndarray:
    c = torch.from_numpy(codes)[None]
    y, n = model.decode(c, torch.tensor([codes.shape[1]]))
    assert y.shape == (1, 1, codes.shape[1] * FRAME) and int(n[0]) == y.shape[-1], (y.shape, n)
    return y.flatten().numpy()


def vq_input(model: nn.Module, audio: np.ndarray) -> np.ndarray:
    """`quantizer.pre_module(quantizer.downsample(encoder(audio zero-padded to whole frames)))`: [C, F]."""
    frames = -(-audio.size // FRAME)
    x = torch.from_numpy(np.pad(audio, (0, frames * FRAME - audio.size)))[None, None]
    q = model.quantizer
    return q.pre_module(q.downsample(model.encoder(x)))[0].numpy()


def unwindowed(transformer: nn.Module, run):
    """`run()` with `transformer`'s attention window lifted (a diagnostic: what a port that ignores the
    window would get); the window is restored afterwards."""
    window, transformer.window_size = transformer.window_size, None
    try:
        return run()
    finally:
        transformer.window_size = window


def stats(label: str, codes: np.ndarray, margin: np.ndarray | None = None) -> None:
    distinct = [len(np.unique(r)) for r in codes]
    line = f"  {label}: codes {codes.shape}, distinct per row {distinct}"
    if margin is not None:
        line += f", min VQ margin {margin.min():.3g} (row {int(margin.min(1).argmin())})"
    print(line)


def audio_stats(label: str, y: np.ndarray) -> None:
    print(f"  {label}: rms {np.sqrt(np.mean(y ** 2)):.3f}, peak {np.abs(y).max():.3f}, "
          f"|y| > 0.99: {np.mean(np.abs(y) > 0.99):.2%}")


def encode_case(model: nn.Module, margins: Margins, audio: np.ndarray, label: str) -> dict:
    t0 = time.perf_counter()
    codes, lens = encode(model, audio)
    margin = margins.take()
    frames = -(-audio.size // FRAME)
    assert codes.shape == (10, frames) and codes.dtype == np.int64 and lens.tolist() == [frames]
    padded = torch.from_numpy(np.pad(audio, (0, frames * FRAME - audio.size)))[None, None]
    latent = model.encoder(padded)
    z_q = model.quantizer.decode(torch.from_numpy(codes)[None])
    decoded = decode(model, codes)
    took = time.perf_counter() - t0
    print(f"{label}: {audio.size} samples -> {frames} frames, encode + decode {took:.2f} s")
    stats(label, codes, margin)
    audio_stats(label + " decoded", decoded)
    return dict(audio=audio, codes=codes, lens=lens, vq_margin=margin, latent=latent[0].numpy(),
                z_pre=vq_input(model, audio), z_q=z_q[0].numpy(), decoded=decoded)


def references(out: Path, seed: int) -> None:
    t0 = time.perf_counter()
    model = load_official(out)
    print(f"official reload: {time.perf_counter() - t0:.2f} s")
    sd = torch.load(out / "codec.pth", weights_only=True)
    assert sd["quantizer.pre_module.freqs_cis"].dtype == torch.bfloat16
    assert sd["quantizer.pre_module.causal_mask"].dtype == torch.bool
    sem = model.quantizer.semantic_quantizer.codebook_size
    res = model.quantizer.quantizer.codebook_size
    window = model.quantizer.post_module.window_size
    margins = Margins(model)
    files = {}
    with torch.inference_mode():
        # (a) a whole number of frames, and a clip ending inside its last frame
        files["encode_exact"] = encode_case(model, margins, clip(seed + 1, 12), "encode_exact")
        files["encode_partial"] = encode_case(model, margins, clip(seed + 2, 11, 1000), "encode_partial")

        # (b) causality: prefixes encoded alone give the whole clip's first codes
        t0 = time.perf_counter()
        audio = clip(seed + 3, 136)
        codes, _ = encode(model, audio)
        case = dict(audio=audio, codes=codes, vq_margin=margins.take(), z_pre=vq_input(model, audio))
        print(f"causal_prefix: 136 frames encoded in {time.perf_counter() - t0:.2f} s")
        stats("causal_prefix", codes, case["vq_margin"])
        enc_tf = model.encoder.block[4].block[5]
        for label, module in (("encoder transformer", enc_tf), ("pre_module", model.quantizer.pre_module)):
            z = unwindowed(module, lambda: vq_input(model, audio))
            c = unwindowed(module, lambda: encode(model, audio)[0])
            margins.take()
            moved = np.flatnonzero(np.abs(z - case["z_pre"]).max(0) > 1e-5)
            print(f"  {label} without its window ({module.window_size}): z_pre moves by up to "
                  f"{np.abs(z - case['z_pre']).max():.2g} from frame {moved[0] if moved.size else None}, "
                  f"{int((c != codes).any(0).sum())} frames of codes change")
        for n in (40, 132):
            prefix, _ = encode(model, audio[: n * FRAME])
            margins.take()
            assert np.array_equal(prefix, codes[:, :n]), f"prefix {n}: encode is not causal"
            case[f"codes_prefix_{n}"] = prefix
        files["causal_prefix"] = case

        # (c) decode past the pre/post window, and its first half alone
        t0 = time.perf_counter()
        rng = np.random.default_rng(seed + 4)
        n = 3 * window
        codes = np.concatenate([rng.integers(0, sem, (1, n)), rng.integers(0, res, (9, n))]).astype(np.int64)
        decoded = decode(model, codes)
        half = decode(model, codes[:, : n // 2])
        diff = np.abs(half - decoded[: half.size]).max()
        print(f"decode_window: {n} frames + first {n // 2} alone in {time.perf_counter() - t0:.2f} s, "
              f"prefix max |diff| {diff:.3g}")
        assert diff <= 1e-5, diff
        y = unwindowed(model.quantizer.post_module, lambda: decode(model, codes))
        moved = np.flatnonzero(np.abs(y - decoded).reshape(-1, FRAME).max(1) > 1e-5)
        print(f"  post_module without its window ({window}): the decode moves by up to "
              f"{np.abs(y - decoded).max():.2g} from frame {moved[0] if moved.size else None}")
        stats("decode_window", codes)
        audio_stats("decode_window decoded", decoded)
        files["decode_window"] = dict(codes=codes, decoded=decoded, decoded_prefix=half)

        # (d) indices above the codebook sizes: the official decode clamps them from above only
        codes = np.concatenate([rng.integers(0, sem, (1, 8)), rng.integers(0, res, (9, 8))]).astype(np.int64)
        codes[0, [1, 3, 5, 7]] = [sem, sem + 1, 4 * sem, 10 ** 6]
        codes[1:, 2] = res
        codes[1:, 4] = np.arange(9) + res + 1
        codes[[1, 5, 9], 6] = [4 * res, 10 ** 5, 10 ** 6]
        clamped = np.minimum(codes, np.array([[sem - 1]] + [[res - 1]] * 9))
        given = codes.copy()
        decoded = decode(model, codes)
        assert np.array_equal(codes, given), "decode changed the caller's codes"
        assert np.array_equal(decoded, decode(model, clamped)), "decode does not clamp as expected"
        stats("decode_clamp", codes)
        files["decode_clamp"] = dict(codes=codes, codes_clamped=clamped, decoded=decoded)

    for name, arrays in files.items():
        np.savez_compressed(out / f"{name}.npz", **arrays)
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {', '.join(files)} to {out}; the folder holds {total / 1e6:.2f} MB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--no-references", action="store_true", help="only build, randomise and save")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    cfg = config(args.config)
    torch.manual_seed(args.seed)
    model = instantiate(cfg).eval()
    n = sum(p.numel() for p in model.parameters())
    print(f"build {args.config}: {n / 1e6:.3f} M parameters, {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    randomise(model, args.seed)
    print(f"randomise: {time.perf_counter() - t0:.2f} s")
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, args.out / "config.yaml")
    torch.save(model.state_dict(), args.out / "codec.pth")
    size = (args.out / "codec.pth").stat().st_size
    print(f"save: {len(model.state_dict())} tensors, {size / 1e6:.2f} MB, {time.perf_counter() - t0:.2f} s")
    del model

    if not args.no_references:
        references(args.out, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
