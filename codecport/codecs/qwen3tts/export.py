"""Qwen3-TTS tokenizer -> static-shape ONNX graphs, validated against torch before anything is
written. The quantizers are in the graphs (codes in, codes out: ArgMin keeps the first index on
ties, as `torch.argmin`).

- `encoder.onnx`: audio `[1, 1, samples]` and `mask` `[1, 1, samples]` (1 over the clip) -> codes
  `[1, 16, frames]`. The mask makes each strided conv see zeros past the clip at its own rate
  (and the downsample the clip's last frame again), as the official model pads inside each conv:
  a clip of any length up to `samples` gives the official codes, its last frame included.
- `decoder.onnx`: codes `[1, 16, frames]` -> audio `[1, 1, frames * 1920]` (causal: fewer frames
  go in padded with code 0 at the end, which no earlier sample sees).
- `decoder_step.onnx` (`--step-frames N`): codes `[1, 16, N]`, `offset_in`, `<state>_in`... ->
  audio `[1, 1, N * 1920]`, `offset_out`, `<state>_out`...: each causal conv's last inputs, each
  transposed conv's last input frame, each attention layer's last `window` keys and values.
  Chained from the zero state, the steps give the whole clip's audio exactly.
- `decoder_slots.onnx` (`--slots B`) and its ladder: the step for B streams a call, the attention
  caches as rings the runtime writes in place (as Mimi's).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...errors import ExportError
from ...export.builds import Build, finish_export
from ...export.deviation import Probe
from ...export.graph import GraphSpec, Tensor, export_id, export_validated
from ...export.slots import run_streams
from ...export.validate import AUDIO_ATOL, check_close, check_codes, run, session
from ...models.streaming import StreamState
from ...runtime.folder import slot_ladder, slots_name
from .model import Qwen3Model

log = logging.getLogger(__name__)

# Why `codec-export qwen3tts` needs --len (the CLI asks before loading any weights).
LEN_NEEDED = ("the samples (at 24 kHz, a multiple of 1920) of the fixed graphs: the longest clip the "
              "encoder takes (its attention sees the whole clip) and the codes one decoder call takes "
              "(longer ones stream through the step graph, exactly)")


class EncoderGraph(nn.Module):
    def __init__(self, model: Qwen3Model):
        super().__init__()
        self.model = model

    def forward(self, audio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model.encoder(audio, self.model.cfg.n_codebooks, mask)


class DecoderGraph(nn.Module):
    def __init__(self, model: Qwen3Model):
        super().__init__()
        self.model = model

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.model.decoder(codes)


class StepGraph(nn.Module):
    """One decoder step: (codes, offset, [ring_at], *states) -> (audio, offset + frames, *states)."""

    def __init__(self, model: Qwen3Model, ring: bool = False):
        super().__init__()
        self.model, self.ring = model, ring
        self.names = list(model.decoder.state_shapes())

    def forward(self, codes: torch.Tensor, offset: torch.Tensor, *states: torch.Tensor):
        ring_at, states = (states[0], states[1:]) if self.ring else (None, states)
        st = StreamState(dict(zip(self.names, states)), offset, ring_at)
        with self.model.decoder.streaming(st):
            y = self.model.decoder(codes)
        return (y, offset + codes.shape[-1], *[st.outputs[n] for n in self.names])


def graph_specs(model: Qwen3Model, samples: int, step_frames: int, slots: int | None,
                meta: dict[str, str]) -> list[GraphSpec]:
    cfg = model.cfg
    k, hop, frames = cfg.n_codebooks, cfg.frame_size, samples // cfg.frame_size
    fixed = {**meta, "mode": "fixed", "samples": str(samples), "frames": str(frames)}
    audio = Tensor("audio", (1, 1, samples), "float32")
    codes = Tensor("codes", (1, k, frames), "int64")
    specs = [GraphSpec("encoder", EncoderGraph(model), [audio, Tensor("mask", (1, 1, samples), "float32")],
                       [codes], {**fixed, "role": "encoder"}),
             GraphSpec("decoder", DecoderGraph(model), [codes], [audio], {**fixed, "role": "decoder"})]
    f, n = step_frames, step_frames * hop
    shapes = model.decoder.state_shapes()
    for b, mode in ((1, "step"), *((b, "slots") for b in ([1, *slot_ladder(slots)] if slots else []))):
        rings = set(model.decoder.attention_states()) if mode == "slots" else set()
        batch = {name: (b, *s[1:]) for name, s in shapes.items()}
        states_in = [Tensor(f"{name}_in", s, "float32") for name, s in batch.items()]
        states_out = [Tensor(f"{name}_new", (*s[:-2], f, s[-1]), "float32") if name in rings
                      else Tensor(f"{name}_out", s, "float32") for name, s in batch.items()]
        at = [Tensor("ring_at", (b, f), "int64")] if rings else []
        specs.append(GraphSpec(
            "decoder_step" if mode == "step" else slots_name("decoder_slots", b, slots),
            StepGraph(model, ring=bool(rings)),
            [Tensor("codes", (b, k, f), "int64"), Tensor("offset_in", (b,), "int64"), *at, *states_in],
            [Tensor("audio", (b, 1, n), "float32"), Tensor("offset_out", (b,), "int64"), *states_out],
            {**meta, "role": "decoder", "mode": mode, "frames": str(f), "samples": str(n),
             "positions_per_step": str(f), "states": ",".join(batch), "slots": str(b),
             "initial_state": "every <state>_in all zeros and offset_in = 0; then feed each <state>_out "
                              "and offset_out back as <state>_in and offset_in" +
                              ("; feed ring_at [B, t] = (offset_in + i) mod the rings' length, i < t, and "
                               "write each <state>_new [..., t, D] into those rows of <state>_in's axis -2"
                               if rings else "") + "; each batch row is a stream of its own"}))
    return specs


def _encode(model: Qwen3Model, audio: np.ndarray, n: int) -> np.ndarray:
    """torch's codes of the first `n` samples of `audio` `[1, 1, samples]`, the official way:
    the clip alone, its padding inside each conv (`Encoder.forward` without a mask)."""
    with torch.no_grad():
        return model.encode(torch.from_numpy(audio[..., :n])).numpy()


def validate(spec: GraphSpec, onnx_model, model: Qwen3Model, seed: int = 1, steps: int = 3) -> dict:
    """The encoder on a clip shorter than the graph by less than a frame and on one of whole
    frames (codes identical to torch's on each clip alone); the decoder on random codes (audio
    within AUDIO_ATOL of torch's whole clip); the step graph chained `steps` times from the zero
    state, and slot graphs on a stream more than their slots joining at different steps, against
    torch's whole clip."""
    cfg, meta = model.cfg, spec.metadata
    rng = np.random.default_rng(seed)
    if meta["role"] == "encoder":
        s = int(meta["samples"])
        x = (0.3 * rng.standard_normal((1, 1, s))).astype(np.float32)
        for n in (s - cfg.frame_size // 2 - 1, s):
            mask = (np.arange(s) < n).astype(np.float32)[None, None]
            got = run(onnx_model, {"audio": x * mask, "mask": mask})[0][..., :math.ceil(n / cfg.frame_size)]
            check_codes(spec.name, got, _encode(model, x, n))
        return {"codes_identical": 1.0}
    frames = int(meta["frames"])
    total = frames * (1 if meta["mode"] == "fixed" else steps)

    def clip():
        codes = rng.integers(0, cfg.codebook_size, (1, cfg.n_codebooks, total))
        with torch.no_grad():
            return codes, model.decode(torch.from_numpy(codes)).numpy()

    if meta["mode"] == "fixed":
        codes, want = clip()
        got = run(onnx_model, {"codes": codes})[0]
        return {"audio_max_abs_err": check_close(spec.name, got, want, AUDIO_ATOL)}
    if meta["mode"] == "slots":
        b = int(meta["slots"])
        streams = [clip() for _ in range(b + 1)]
        feeds = [[(p, {}) for p in np.split(c, steps, axis=-1)] for c, _ in streams]
        outs = run_streams(onnx_model, spec.name, b, feeds)
        return {"audio_max_abs_err": max(check_close(spec.name, np.concatenate(o, axis=-1), w, AUDIO_ATOL)
                                         for o, (_, w) in zip(outs, streams))}
    codes, want = clip()
    sess, names = session(onnx_model), [t.name for t in spec.inputs]
    state = [np.zeros(s, np.float32) for s in model.decoder.state_shapes().values()]
    offset, out = np.zeros(1, np.int64), []
    for piece in np.split(codes, steps, axis=-1):
        y, offset, *state = sess.run(None, dict(zip(names, [piece, offset, *state])))
        out.append(y)
    if int(offset[0]) != total:
        raise ExportError(f"{spec.name}: offset_out is {int(offset[0])} after {steps} steps, "
                          f"expected {total}")
    return {"audio_max_abs_err": check_close(spec.name, np.concatenate(out, axis=-1), want, AUDIO_ATOL)}


def export_qwen3(model: Qwen3Model, out_dir: Path, samples: int, step_frames: int = 1, *, preset: str,
                 weights: str, weights_sha256: str, in_graph_codebooks: int | None = None,
                 build: Build | None = None, batch: int | None = None, slots: int | None = None) -> dict:
    """Export, check and validate every graph, then write them all; returns the report. Nothing
    is written unless every graph passes; each file is written atomically."""
    cfg = model.cfg
    build = build or Build()
    build.check()
    if batch is not None:
        raise ExportError("Qwen3-TTS's tokenizer has no batched encoder (--batch): its attention sees "
                          "the whole clip; leave out --batch")
    if in_graph_codebooks not in (None, cfg.n_codebooks):
        raise ExportError(f"the quantizers are always in Qwen3-TTS's graphs, all {cfg.n_codebooks} "
                          "codebooks: leave out --codebooks")
    if samples < 1:
        raise ExportError(f"--len must be positive, got {samples}")
    if step_frames < 1:
        raise ExportError(f"--step-frames must be at least 1, got {step_frames}")
    if slots is not None and not 1 < slots <= 4096:
        raise ExportError(f"--slots must be 2 to 4096 (streams one step graph call holds), got {slots}")
    whole = math.ceil(samples / cfg.frame_size) * cfg.frame_size
    if whole != samples:
        log.warning("--len %d is not a multiple of the %d-sample frame: the graphs hold %d samples",
                    samples, cfg.frame_size, whole)
    meta = {"codec": "qwen3tts", "preset": preset, "sample_rate": str(cfg.sample_rate),
            "frame_size": str(cfg.frame_size), "frame_rate": str(cfg.frame_rate),
            "n_codebooks": str(cfg.n_codebooks), "codebook_size": str(cfg.codebook_size),
            "quantizer": "graph", "window": str(cfg.window),
            "weights": weights, "weights_sha256": weights_sha256}
    geo = {"samples": whole, "frames": whole // cfg.frame_size, "len": samples, "step_frames": step_frames,
           "step_samples": step_frames * cfg.frame_size, "frame_size": cfg.frame_size, "slots": slots}
    meta["export_id"] = export_id(meta, geo)
    models, report = {}, {"validation": {}, "geometry": geo}
    specs = graph_specs(model.eval(), whole, step_frames, slots, meta)
    export_validated(specs, models, report["validation"], lambda s, m: validate(s, m, model))
    manifest = {**meta, "n_codebooks": cfg.n_codebooks, **report}
    report.update(finish_export(out_dir, models, None, manifest, build, probe(manifest, specs)))
    return report


def probe(manifest: dict, specs: list[GraphSpec] = ()) -> Probe:
    """How a build runs each graph: the fixed pair on a clip cut to its length, the step graph
    decoding the fixed encoder's codes a step at a time."""
    from .runtime import Qwen3Codec

    geo, sr = manifest["geometry"], int(manifest["sample_rate"])

    def encode(codec, name: str, clip: np.ndarray) -> np.ndarray:
        return codec.encode(clip[:, :geo["samples"]], sr, mode="fixed").data

    def decode(codec, name: str, codes: np.ndarray) -> np.ndarray:
        return codec.decode(codes, mode="step" if name == "decoder_step" else "fixed")[0]

    return Probe(open=Qwen3Codec, encode=encode, decode=decode,
                 pairs={"encoder": ("decoder", "decoder_step")}, sample_rate=sr,
                 clip_samples=geo["samples"], specs={s.name: s for s in specs})


def export(model: Qwen3Model, out_dir: Path, length: int | None, *, options: dict, **common) -> dict:
    """`codec-export qwen3tts`: the fixed pair for `--len`, the step graph, and `--slots` copies."""
    if length is None:
        raise ExportError(f"pass --len N: {LEN_NEEDED}")
    return export_qwen3(model, out_dir, length, options.get("step_frames") or 1, slots=options.get("slots"),
                        **common)


def describe(report: dict) -> list[str]:
    geo = report["geometry"]
    lines = [f"  fixed graphs : a clip of up to {geo['samples']} samples at 24 kHz "
             f"({geo['samples'] / 24000:g} s) <-> {geo['frames']} frames in one call (the encoder's "
             "attention sees all of it)",
             f"  step graph   : {geo['step_frames']} frame(s), {geo['step_samples']} samples a call, state "
             "in/out: any number of frames, exactly the whole clip's audio"]
    if geo.get("slots"):
        lines.append(f"  slot graphs  : the step for {', '.join(map(str, slot_ladder(geo['slots'])))} "
                     "independent streams a call (codec-serve)")
    return lines
