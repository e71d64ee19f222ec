"""SNAC -> fixed-shape ONNX graphs, validated against torch before anything is written.

Three graphs, all static, no ConvTranspose, no Conv pads:
- `encoder.onnx`: audio `[1, 1, frames * hop]` and `mask` `[1, 1, frames]` -> latent
  `[1, latent, frames]` (the RVQ runs in numpy, `rvq.npz`);
- `decoder.onnx`: latent, `mask` and the noise of each decoder block (`noise_i`
  `[1, 1, frames * prod(rates[:i+1])]`) -> audio `[1, 1, frames * hop]`;
- `decoder_step.onnx`: one streaming step of the decoder with explicit state (codecs/snac/stepmodel.py):
  latent `[1, latent, n]`, `offset_in`, `end`, the step's noise and `<state>_in`... -> audio
  `[1, 1, n * hop]` of the positions `delay` samples before the step's, `offset_out`,
  `<state>_out`...; each layer computes each position once, for codes a language model emits a
  frame at a time. `--slots B` writes it again as `decoder_slots.onnx`, B streams a call.

`mask` marks the window's frames that belong to the clip: the graph then computes exactly what
the official model computes on that clip alone (layers.FrameMask), so one window serves a short
clip, and windows that overlap by the receptive field (`margin`, in the metadata, from the
config) give the official whole-clip codes and audio for any length.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...errors import ExportError
from ...export.batch import check_batch, export_batched, masked_rows
from ...export.builds import Build, finish_export
from ...export.deviation import Probe
from ...export.graph import GraphSpec, Tensor, export_id, export_validated, factorised_rvq_arrays
from ...export.slots import run_streams
from ...export.validate import AUDIO_ATOL, check_close, check_codes, run
from ...runtime.folder import slot_ladder, slots_name
from .model import SNAC
from .runtime import SnacCodec
from .rvq import SnacRvq
from .stepmodel import SnacStepDecoder
from .stream import END_UNKNOWN

log = logging.getLogger(__name__)


class EncoderGraph(nn.Module):
    def __init__(self, snac: SNAC):
        super().__init__()
        self.snac = snac

    def forward(self, audio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.snac.encode_latent(audio, mask)


class DecoderGraph(nn.Module):
    def __init__(self, snac: SNAC):
        super().__init__()
        self.snac = snac

    def forward(self, latent: torch.Tensor, mask: torch.Tensor, *noise: torch.Tensor) -> torch.Tensor:
        return self.snac.decode_latent(latent, list(noise), mask)


@dataclass
class Geometry:
    frames: int  # latent frames of the encoder/decoder window
    samples: int  # its audio samples
    unit_frames: int  # latent frames of a coarse frame (windows start and end on these)
    encoder_margin: int  # latent frames kept clear of a window's edges (receptive field)
    decoder_margin: int
    step_frames: int  # latent frames the step decoder takes per call
    step_delay: int  # samples its audio runs behind its input (the decoder's right context)
    sample_rate: int
    slots: int | None = None  # streams a call of decoder_slots.onnx

    @classmethod
    def of(cls, snac: SNAC, samples: int, step_coarse: int, slots: int | None = None) -> Geometry:
        cfg = snac.cfg
        hop, unit = cfg.hop_length, cfg.unit_frames
        enc, dec = cfg.margins()
        frames = unit * -(-samples // (hop * unit))
        least = 2 * max(enc, dec) + unit
        if frames < least:
            raise ExportError(f"--len {samples} is too short for windows that keep their receptive "
                              f"field: pass at least {least * hop} samples "
                              f"({least * hop / cfg.sample_rate:.2f} s)")
        step = step_coarse * unit
        return cls(frames, frames * hop, unit, enc, dec, step, SnacStepDecoder(snac, step).plan.delay,
                   cfg.sample_rate, slots)


def rvq_of(snac: SNAC) -> SnacRvq:
    return SnacRvq({**factorised_rvq_arrays(snac.quantizer.quantizers),
                    "strides": np.array(snac.cfg.vq_strides, np.int64)})


def graph_specs(snac: SNAC, geo: Geometry, meta: dict[str, str]) -> list[GraphSpec]:
    cfg = snac.cfg
    hop = cfg.hop_length

    def step(name: str, b: int) -> GraphSpec:
        n = geo.step_frames
        module = SnacStepDecoder(snac, n, b)
        plan = module.plan
        noise = [Tensor(f"noise_{i}", (b, 1, n * u), "float32") for i, u in enumerate(module.noise_rates())]
        states = [(f"{k}_in", f"{k}_out", (b, *shape)) for k, shape in plan.states.items()]
        return GraphSpec(name, module,
                         [Tensor("latent", (b, cfg.latent, n), "float32"), Tensor("offset_in", (b,), "int64"),
                          Tensor("end", (b,), "int64"), *noise,
                          *(Tensor(i, shape, "float32") for i, _, shape in states)],
                         [Tensor("audio", (b, 1, n * hop), "float32"), Tensor("offset_out", (b,), "int64"),
                          *(Tensor(o, shape, "float32") for _, o, shape in states)],
                         {**meta, "role": "decoder", "mode": "step" if b == 1 else "slots", "frames": str(n),
                          "samples": str(n * hop), "step_frames": str(n), "slots": str(b),
                          "delay": str(plan.delay), "noise_delays": ",".join(map(str, plan.noise_delays)),
                          "states": ",".join(plan.states),
                          "initial_state": "every <state>_in all zeros and offset_in = 0 (latent frames "
                                           "stepped); then feed each <state>_out and offset_out back; `end` "
                                           "is the clip's latent frames once known, else 2**62; each batch "
                                           "row is a stream of its own"})

    def dec(name: str, frames: int, mode: str, extra: dict) -> GraphSpec:
        noise = [Tensor(f"noise_{i}", s, "float32") for i, s in enumerate(snac.noise_shapes(frames))]
        return GraphSpec(name, DecoderGraph(snac),
                         [Tensor("latent", (1, cfg.latent, frames), "float32"),
                          Tensor("mask", (1, 1, frames), "float32"), *noise],
                         [Tensor("audio", (1, 1, frames * hop), "float32")],
                         {**meta, "role": "decoder", "mode": mode, "frames": str(frames),
                          "samples": str(frames * hop), "margin": str(geo.decoder_margin), **extra})

    return [
        GraphSpec("encoder", EncoderGraph(snac),
                  [Tensor("audio", (1, 1, geo.samples), "float32"),
                   Tensor("mask", (1, 1, geo.frames), "float32")],
                  [Tensor("latent", (1, cfg.latent, geo.frames), "float32")],
                  {**meta, "role": "encoder", "mode": "whole", "frames": str(geo.frames),
                   "samples": str(geo.samples), "margin": str(geo.encoder_margin)}),
        dec("decoder", geo.frames, "whole", {}),
        step("decoder_step", 1),
        *(step(slots_name("decoder_slots", b, geo.slots), b)
          for b in (slot_ladder(geo.slots) if geo.slots else [])),
    ]


def _mask(frames: int, unit: int) -> np.ndarray:
    """A window whose clip starts a coarse frame in and stops a coarse frame short (when the
    window has room): both edges of the mask are exercised."""
    m = np.zeros((1, 1, frames), np.float32)
    lo, hi = (unit, frames - unit) if frames > 2 * unit else (0, frames)
    m[..., lo:hi] = 1.0
    return m


def _shifted(a: np.ndarray, lo: int, n: int) -> np.ndarray:
    """`a[lo:lo + n]`, zeros where that runs outside `a`."""
    out = np.zeros(n, np.float32)
    i, j = max(lo, 0), min(lo + n, len(a))
    if j > i:
        out[i - lo:j - lo] = a[i:j]
    return out


def step_feeds(module: SnacStepDecoder, latent: np.ndarray, noise: list[np.ndarray]) -> list:
    """The steps that decode `latent` `[L, N]` (noise: one `[N * rate]` array per block) through
    the step graph, as the runtime's stream feeds them: the end unknown (2**62) while whole steps
    of input come, then known; zeros after the input until the delay has drained."""
    n, hop, delay = module.step, module.snac.cfg.hop_length, module.plan.delay
    total = latent.shape[-1]
    out = []
    for k in range(-(-(total * hop + delay) // (n * hop))):
        x = np.zeros((1, latent.shape[0], n), np.float32)
        part = latent[:, k * n:(k + 1) * n]
        x[0, :, :part.shape[1]] = part
        extra = {"end": np.array([END_UNKNOWN if (k + 1) * n <= total else total], np.int64)}
        for i, (u, d) in enumerate(zip(module.noise_rates(), module.plan.noise_delays)):
            extra[f"noise_{i}"] = _shifted(noise[i], k * n * u - d, n * u)[None, None]
        out.append((x, extra))
    return out


def validate_steps(spec: GraphSpec, model, snac: SNAC, rvq: SnacRvq, rng) -> dict[str, float]:
    """Step graphs chained from the zero state against the torch whole-clip decode with the same
    noise; a graph of B slots runs B + 1 streams of different lengths that join and leave at
    different steps (export/slots.py), each against its own whole clip."""
    module: SnacStepDecoder = spec.module
    b, n = int(spec.metadata["slots"]), module.step
    errs = []
    streams, wants = [], []
    for i in range(b + 1 if b > 1 else 1):
        frames = n * (3 + i % 2)
        codes = [rng.integers(0, snac.cfg.codebook_size, frames // s) for s in rvq.strides]
        latent = rvq.decode_levels(codes)
        noise = [rng.standard_normal(frames * u).astype(np.float32) for u in module.noise_rates()]
        with torch.no_grad():
            wants.append(snac.decode_latent(torch.from_numpy(latent[None]),
                                            [torch.from_numpy(a[None, None]) for a in noise]).numpy()[0, 0])
        streams.append(step_feeds(module, latent, noise))
    outs = run_streams(model, spec.name, b, streams)
    for out, want in zip(outs, wants):
        got = np.concatenate([y[0, 0] for y in out])[module.plan.delay:module.plan.delay + len(want)]
        errs.append(check_close(spec.name, got, want, AUDIO_ATOL))
    return {"audio_max_abs_err": max(errs)}


def validate(spec: GraphSpec, model, snac: SNAC, rvq: SnacRvq, seed: int = 1) -> dict[str, float]:
    """ONNX Runtime against torch on inputs other than the export dummy, a masked window: the
    encoder's codes through the numpy RVQ identical, the decoder's audio within `AUDIO_ATOL`."""
    rng = np.random.default_rng(seed)
    if spec.metadata["mode"] in ("step", "slots"):
        return validate_steps(spec, model, snac, rvq, rng)
    frames = spec.inputs[1].shape[-1]
    mask = _mask(frames, snac.cfg.unit_frames)
    if spec.metadata["role"] == "encoder":
        x = (rng.standard_normal(spec.inputs[0].shape) * 0.3).astype(np.float32)
        feeds = {"audio": x, "mask": mask}
    else:
        codes = [rng.integers(0, snac.cfg.codebook_size, frames // s) for s in rvq.strides]
        feeds = {"latent": rvq.decode_levels(codes)[None], "mask": mask}
        for t in spec.inputs[2:]:
            feeds[t.name] = rng.standard_normal(t.shape).astype(np.float32)
    with torch.no_grad():
        want = spec.module(*(torch.from_numpy(feeds[t.name]) for t in spec.inputs)).numpy()
    got = run(model, feeds)[0]
    if spec.metadata["role"] == "decoder":
        return {"audio_max_abs_err": check_close(spec.name, got, want, AUDIO_ATOL)}
    valid = slice(*np.flatnonzero(mask[0, 0])[[0, -1]] + [0, 1])
    for level, (g, w) in enumerate(zip(rvq.encode_levels(got[0][:, valid]),
                                       rvq.encode_levels(want[0][:, valid]))):
        check_codes(f"{spec.name} level {level}", g[None, None], w[None, None])
    return {"codes_identical": 1.0}


def _row_codes(y: np.ndarray, row: dict[str, np.ndarray], rvq: SnacRvq) -> np.ndarray:
    """Every time scale's codes `[1, 1, n]` of an encoder's output `y` (one row) on the frames
    `row`'s mask keeps."""
    valid = int(row["mask"].sum())
    return np.concatenate(rvq.encode_levels(y[0][:, :valid]))[None, None]


def export_snac(snac: SNAC, out_dir: Path, samples: int, step_coarse: int = 1, *, preset: str,
                weights: str, weights_sha256: str, in_graph_codebooks: int | None = None,
                build: Build | None = None, batch: int | None = None, slots: int | None = None) -> dict:
    """Export, check and validate every graph, then write them all; returns the report. `slots`
    adds the step decoder again for that many streams a call (decoder_slots.onnx), and for each
    power of two below it (decoder_slots_s<B>.onnx, runtime/folder.slot_ladder)."""
    build = build or Build()
    build.check()
    if in_graph_codebooks is not None:
        raise ExportError("SNAC's quantizer runs in numpy beside the graphs (rvq.npz); leave out "
                          "--in-graph-quantizer")
    check_batch(batch, build)
    if slots is not None and not 1 < slots <= 4096:
        raise ExportError(f"--slots must be 2 to 4096 (streams one step graph call holds), got {slots}")
    cfg = snac.cfg
    geo = Geometry.of(snac.eval(), samples, step_coarse, slots)
    meta = {"codec": "snac", "preset": preset, "sample_rate": str(cfg.sample_rate),
            "frame_size": str(cfg.hop_length), "latent_dim": str(cfg.latent),
            "codebook_size": str(cfg.codebook_size), "codebook_dim": str(cfg.codebook_dim),
            "n_codebooks": str(cfg.n_codebooks), "quantizer": "numpy",
            "vq_strides": ",".join(map(str, cfg.vq_strides)), "unit_frames": str(cfg.unit_frames),
            "decoder_rates": ",".join(map(str, cfg.decoder_rates)), "noise": "1" if cfg.noise else "0",
            "weights": weights, "weights_sha256": weights_sha256}
    meta["export_id"] = export_id(meta, asdict(geo))
    rvq = rvq_of(snac)
    models, report = {}, {"files": {}, "validation": {}, "geometry": asdict(geo)}
    specs = graph_specs(snac, geo, meta)
    export_validated(specs, models, report["validation"], lambda s, m: validate(s, m, snac, rvq))
    export_batched(specs, models, batch, SnacCodec.batchable, lambda s, y, row: _row_codes(y, row, rvq),
                   report, build,
                   lambda s: masked_rows(s, lambda i, n: max(cfg.unit_frames, n - i * cfg.unit_frames)))
    manifest = {**meta, "n_codebooks": cfg.n_codebooks, **report}
    report.update(finish_export(out_dir, models, rvq.arrays(), manifest, build, probe(manifest, specs)))
    return report


def probe(manifest: dict, specs: list[GraphSpec] = ()) -> Probe:
    """How a build runs the graphs: a clip of a few windows encoded whole, its codes
    decoded whole and streamed, without noise (so fp32 and the build are compared on the same
    decode). Codes travel as `[1, levels, frames]`, each level repeated up to the finest rate."""
    from .runtime import SnacCodec

    geo, sr = manifest["geometry"], int(manifest["sample_rate"])
    strides = [int(s) for s in manifest["vq_strides"].split(",")]

    def encode(codec, name: str, clip: np.ndarray) -> np.ndarray:
        codes = codec.encode(clip, sr)
        return np.concatenate([np.repeat(a, s, axis=-1) for a, s in zip(codes.arrays, strides)], axis=1)

    def decode(codec, name: str, codes: np.ndarray) -> np.ndarray:
        levels = tuple(codes[:, i:i + 1, ::s] for i, s in enumerate(strides))
        mode = "step" if name == "decoder_step" else "whole"
        return codec.decode(levels, mode=mode, noise=0)[0]

    return Probe(open=SnacCodec, encode=encode, decode=decode,
                      pairs={"encoder": ("decoder", "decoder_step")}, sample_rate=sr,
                      clip_samples=2 * geo["samples"], specs={s.name: s for s in specs})


# Why `codec-export snac` needs --len (the CLI asks before loading any weights).
LEN_NEEDED = "the samples of the window graphs (longer audio goes through overlapping windows of it)"


def export(model: SNAC, out_dir: Path, length: int | None, *, options: dict, **common) -> dict:
    """`codec-export snac`: the window graphs for `--len`, the step decoder for `--step-frames`."""
    if length is None:
        raise ExportError(f"pass --len N: {LEN_NEEDED}")
    return export_snac(model, out_dir, length, options.get("step_frames") or 1, slots=options.get("slots"),
                       **common)


def describe(report: dict) -> list[str]:
    geo = report["geometry"]
    hop = geo["samples"] // geo["frames"]
    sr = geo["sample_rate"]
    keep = geo["frames"] - 2 * geo["encoder_margin"]
    return [(f"  window graphs : {geo['samples']} samples <-> {geo['frames']} frames (--len up to whole "
             f"coarse frames): a clip of up to {geo['samples']} samples at {sr} Hz in one call; "
             f"receptive field {geo['encoder_margin']} frames (encoder) / {geo['decoder_margin']} (decoder) "
             f"either side, so long audio keeps {keep} of every {geo['frames']} frames a window"),
            (f"  step decoder  : {geo['step_frames']} frames in, {geo['step_frames'] * hop} samples out "
             f"per call, state in/out; its audio runs {geo['step_delay']} samples "
             f"({1000 * geo['step_delay'] / sr:.0f} ms) behind the codes (the decoder's right context)"),
            *([(f"  slot graphs   : the same step for {', '.join(map(str, slot_ladder(geo['slots'])))} "
                "independent streams a call (codec-serve)")]
              if geo.get("slots") else [])]
