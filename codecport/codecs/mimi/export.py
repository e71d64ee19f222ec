"""Mimi -> static-shape ONNX graphs, validated against torch before anything is written.

Fixed-length pair (`--len`):
- `encoder.onnx`: audio `[1, 1, samples]` -> latent `[1, 512, frames]`; a length that is not a
  multiple of the frame (1920) is zero-padded inside the graph, as moshi pads before encoding.
- `decoder.onnx`: latent `[1, 512, frames]` -> audio `[1, 1, frames * 1920]`.

Step pair (`--step-frames N`): one step of N frames with explicit state.
- `encoder_step.onnx`: audio `[1, 1, N*1920]`, `offset_in`, `<state>_in`... -> latent
  `[1, 512, N]`, `offset_out`, `<state>_out`...
- `decoder_step.onnx`: latent `[1, 512, N]`, `offset_in`, `<state>_in`... -> audio, ...
  State: each causal conv's last input samples, each polyphase transposed conv's last input
  frame, each attention layer's last `context` rotated keys and values `[2, 1, H, context, D]`,
  and the position offset (int64, SEANet frames). The initial state is all zeros, offset 0.
  By default the steps equal the whole clip; `attention="moshi-stream"` reproduces moshi's own
  streaming mode instead, which differs from its whole clip past 250 positions, and
  `attention="rustymimi"` Kyutai's Rust Mimi, whose attention sees one position more (fixed and
  step graphs alike).

With `in_graph_codebooks`, encoders output codes `[1, K, frames]` and decoders take them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...errors import ExportError
from ...export.batch import export_batched
from ...export.builds import Build, finish_export
from ...export.deviation import Probe
from ...export.graph import GraphSpec, Tensor, export_id, export_validated
from ...export.slots import run_streams
from ...export.validate import AUDIO_ATOL, check_close, check_codes, run, session
from ...models.streaming import StreamState
from ...runtime.folder import slot_ladder, slots_name
from ...runtime.rvq import SplitRvq
from .model import MimiModel

log = logging.getLogger(__name__)

ATTENTION = ("whole-clip", "moshi-stream", "rustymimi")  # attention past the context, see export_mimi


def attention_context(context: int, attention: str) -> int:
    """Positions a query attends to under `attention`: candle's mask (rustymimi) keeps one more."""
    return context + 1 if attention == "rustymimi" else context


class EncoderGraph(nn.Module):
    def __init__(self, model: MimiModel, k: int | None):
        super().__init__()
        self.model, self.k = model, k

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        z = self.model.encode_latent(self.model.pad(audio))
        return z if self.k is None else self.model.quantizer.encode(z, self.k)


class DecoderGraph(nn.Module):
    def __init__(self, model: MimiModel, k: int | None):
        super().__init__()
        self.model, self.k = model, k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.decode_latent(x if self.k is None else self.model.quantizer.decode(x))


class StepGraph(nn.Module):
    """One streaming step of `side`: (x, offset, *states) -> (y, offset + positions, *states);
    with `ring`, (x, offset, ring_at, *states) -> the same, each attention cache's output its
    step's new rows, to be written at rows `ring_at` (see `Attention`)."""

    def __init__(self, model: MimiModel, side: str, k: int | None, ring: bool = False):
        super().__init__()
        self.model, self.side, self.k, self.ring = model, side, k, ring
        self.names = list(model.state_shapes(side))
        self.inner = EncoderGraph(model, k) if side == "encoder" else DecoderGraph(model, k)

    def forward(self, x: torch.Tensor, offset: torch.Tensor, *states: torch.Tensor):
        ring_at, states = (states[0], states[1:]) if self.ring else (None, states)
        st = StreamState(dict(zip(self.names, states)), offset, ring_at)
        with self.model.streaming(st, self.side):
            y = self.inner(x)
        frames = x.shape[-1] // self.model.cfg.frame_size if self.side == "encoder" else x.shape[-1]
        return (y, offset + frames * self.model.cfg.downsample_stride, *[st.outputs[n] for n in self.names])


@dataclass
class Geometry:
    samples: int | None  # fixed encoder input (the user's --len), None without --len
    frames: int | None  # fixed graphs' code frames = ceil(samples / frame_size)
    step_frames: int | None  # code frames per streaming step, None without --streaming
    frame_size: int

    @property
    def step_samples(self) -> int | None:
        return None if self.step_frames is None else self.step_frames * self.frame_size


def graph_specs(model: MimiModel, geo: Geometry, meta: dict[str, str],
                k: int | None = None, attention: str = "whole-clip",
                slots: int | None = None) -> list[GraphSpec]:
    """The fixed-length pair and/or the step pair; `k` puts the quantizer (k levels) inside;
    `slots` adds the step pair again for that many independent streams a call."""
    cfg = model.cfg
    quant = {"quantizer": "numpy" if k is None else "graph",
             "n_codebooks": str(cfg.n_codebooks if k is None else k)}

    def frames_io(frames: int, b: int = 1) -> Tensor:
        return Tensor("latent", (b, cfg.dimension, frames), "float32") if k is None else \
            Tensor("codes", (b, k, frames), "int64")

    specs = []
    facts = {"attention": attention, "context": str(attention_context(cfg.context, attention))}
    if geo.samples is not None:
        n, f = geo.samples, geo.frames
        fixed = {**meta, **quant, **facts, "mode": "fixed", "samples": str(n), "frames": str(f)}
        specs += [
            GraphSpec("encoder", EncoderGraph(model, k), [Tensor("audio", (1, 1, n), "float32")],
                      [frames_io(f)], {**fixed, "role": "encoder"}),
            GraphSpec("decoder", DecoderGraph(model, k), [frames_io(f)],
                      [Tensor("audio", (1, 1, f * cfg.frame_size), "float32")],
                      {**fixed, "role": "decoder", "samples": str(f * cfg.frame_size)}),
        ]
    if geo.step_frames is not None:
        f, n = geo.step_frames, geo.step_samples
        t = f * cfg.downsample_stride  # transformer positions a step
        # The slot graphs (a server's, run by the runtime's StepBank) keep attention caches as
        # rings, written in place by the runtime, down to one slot; the step pair keeps the
        # shifted window that any ONNX runner (the browser's, io_binding on a GPU) carries as is.
        for b, mode in ((1, "step"), *((b, "slots") for b in ([1, *slot_ladder(slots)] if slots else []))):
            offset = [Tensor("offset_in", (b,), "int64")]
            for side, x, y in (("encoder", Tensor("audio", (b, 1, n), "float32"), frames_io(f, b)),
                               ("decoder", frames_io(f, b), Tensor("audio", (b, 1, n), "float32"))):
                shapes = {name: (b, *s[1:]) for name, s in model.state_shapes(side).items()}
                rings = set(model.attention_states(side)) if mode == "slots" else set()
                states_in = [Tensor(f"{name}_in", s, "float32") for name, s in shapes.items()]
                states_out = [Tensor(f"{name}_new", (*s[:-2], t, s[-1]), "float32") if name in rings
                              else Tensor(f"{name}_out", s, "float32") for name, s in shapes.items()]
                at = [Tensor("ring_at", (b, t), "int64")] if rings else []
                specs.append(GraphSpec(
                    f"{side}_step" if mode == "step" else slots_name(f"{side}_slots", b, slots),
                    StepGraph(model, side, k, ring=bool(rings)), [x, *offset, *at, *states_in],
                    [y, Tensor("offset_out", (b,), "int64"), *states_out],
                    {**meta, **quant, **facts, "role": side, "mode": mode, "frames": str(f),
                     "samples": str(n), "positions_per_step": str(t),
                     "states": ",".join(shapes), "slots": str(b),
                     "initial_state": "every <state>_in all zeros and offset_in = 0; then feed each "
                                      "<state>_out and offset_out back as <state>_in and offset_in" +
                                      ("; feed ring_at [B, t] = (offset_in + i) mod the rings' length, "
                                       "i < t, and write each <state>_new [..., t, D] into those rows of "
                                       "<state>_in's axis -2 (a ring: position p in row p mod its length)"
                                       if rings else "") +
                                      "; each batch row is a stream of its own"}))
    return specs


def rvq_of(model: MimiModel) -> SplitRvq:
    q = model.quantizer
    w = lambda conv: conv.weight[..., 0].detach().numpy().astype(np.float32)
    rows = [vq._codebook.rows() for rvq in (q.rvq_first, q.rvq_rest) for vq in rvq.vq.layers]
    return SplitRvq({
        "semantic_in_proj": w(q.rvq_first.input_proj), "semantic_out_proj": w(q.rvq_first.output_proj),
        "acoustic_in_proj": w(q.rvq_rest.input_proj), "acoustic_out_proj": w(q.rvq_rest.output_proj),
        "codebook": torch.stack(rows).detach().numpy().astype(np.float32),
        "n_semantic": np.array(q.n_semantic, dtype=np.int64),
    })


def _codes_of(spec: GraphSpec, y: np.ndarray, rvq: SplitRvq) -> np.ndarray:
    """Codes `[1, K, T]` from an encoder output (latent through the numpy RVQ, or codes)."""
    k = int(spec.metadata["n_codebooks"])
    return y if spec.metadata["quantizer"] == "graph" else rvq.encode(y[0], k)[None]


def _decoder_input(spec: GraphSpec, codes: np.ndarray, rvq: SplitRvq) -> np.ndarray:
    return codes if spec.metadata["quantizer"] == "graph" else rvq.decode(codes[0])[None]


def _run_steps(call, model: MimiModel, spec: GraphSpec, pieces: list[np.ndarray], rvq: SplitRvq):
    """Chain `call([x, offset, *states]) -> [y, offset, *states]` from the zero state (one stream)."""
    state = [np.zeros(s, np.float32) for s in model.state_shapes(spec.metadata["role"]).values()]
    offset, out = np.zeros(1, np.int64), []
    for x in pieces:
        x = x if spec.metadata["role"] == "encoder" else _decoder_input(spec, x, rvq)
        y, offset, *state = call([x, offset, *state])
        out.append(y)
    return np.concatenate(out, axis=-1), int(offset[0])


def _stream(spec: GraphSpec, model: MimiModel, rvq: SplitRvq, rng, steps: int):
    """A random input of `steps` steps (one call's worth for a fixed graph) and what torch makes
    of it: the whole clip, or its own chained steps where the graph follows moshi's ring."""
    cfg, meta = model.cfg, spec.metadata
    k, encoder = int(meta["n_codebooks"]), meta["role"] == "encoder"
    if encoder:
        x = (0.3 * rng.standard_normal((1, 1, int(meta["samples"]) * steps))).astype(np.float32)
        with torch.no_grad():
            want = model.encode(model.pad(torch.from_numpy(x)), k).numpy()
    else:
        x = rng.integers(0, cfg.codebook_size, (1, k, int(meta["frames"]) * steps))
        with torch.no_grad():
            want = model.decode(torch.from_numpy(x)).numpy()
    if meta["mode"] != "fixed" and meta["attention"] == "moshi-stream":
        step = StepGraph(model, meta["role"], spec.module.k)  # the state carried whole, as _run_steps does
        with torch.no_grad():
            want, _ = _run_steps(lambda xs: [t.numpy() for t in step(*map(torch.from_numpy, xs))],
                                 model, spec, np.split(x, steps, axis=-1), rvq)
            if encoder and meta["quantizer"] == "numpy":
                want = model.quantizer.encode(torch.from_numpy(want), k).numpy()
    return x, want


def _compare(spec: GraphSpec, got: np.ndarray, want: np.ndarray, rvq: SplitRvq) -> dict[str, float]:
    """Encoders must give identical codes, decoders audio within `AUDIO_ATOL`."""
    if spec.metadata["role"] == "decoder":
        return {"audio_max_abs_err": check_close(spec.name, got, want, AUDIO_ATOL)}
    check_codes(spec.name, _codes_of(spec, got, rvq), want)
    return {"codes_identical": 1.0}


def validate(spec: GraphSpec, onnx_model, model: MimiModel, rvq: SplitRvq, seed: int = 1,
             steps: int = 3) -> dict[str, float]:
    """Compare ONNX Runtime with torch on inputs other than the export dummy.

    Fixed graphs: one call against the torch whole clip. Step graphs: `steps` calls chained from
    the zero state, against the torch whole clip (which checks the state handling as well as
    the numbers), or against torch's own chained steps when the graph follows moshi's streaming
    ring (which does not equal the whole clip past the window). Graphs of several slots: a
    stream more than the slots, joining and leaving at different steps (export/slots.py), each
    against its own reference. Encoders must give identical codes, decoders audio within
    `AUDIO_ATOL`.
    """
    cfg, meta = model.cfg, spec.metadata
    rng = np.random.default_rng(seed)
    encoder = meta["role"] == "encoder"
    per = cfg.downsample_stride
    if meta["mode"] == "slots":
        b = int(meta["slots"])
        streams = [_stream(spec, model, rvq, rng, steps) for _ in range(b + 1)]
        feeds = [[(p if encoder else _decoder_input(spec, p, rvq), {}) for p in np.split(x, steps, axis=-1)]
                 for x, _ in streams]
        outs = run_streams(onnx_model, spec.name, b, feeds)
        errs = [_compare(spec, np.concatenate(o, axis=-1), want, rvq) for o, (_, want) in zip(outs, streams)]
        return {k: max(e[k] for e in errs) for k in errs[0]}
    x, want = _stream(spec, model, rvq, rng, steps if meta["mode"] == "step" else 1)
    names = [t.name for t in spec.inputs]
    if meta["mode"] == "step":
        sess = session(onnx_model)  # one session for every step: a session costs more than a step
        got, offset = _run_steps(lambda xs: sess.run(None, dict(zip(names, xs))), model, spec,
                                 np.split(x, steps, axis=-1), rvq)
        expected = x.shape[-1] // (cfg.frame_size if encoder else 1) * per
        if offset != expected:
            raise ExportError(f"{spec.name}: offset_out is {offset} after {steps} steps, expected {expected}")
    else:
        got = run(onnx_model, {names[0]: x if encoder else _decoder_input(spec, x, rvq)})[0]
    return _compare(spec, got, want, rvq)


def export_mimi(model: MimiModel, out_dir: Path, samples: int | None = None, step_frames: int | None = 1,
                *, preset: str, weights: str, weights_sha256: str,
                in_graph_codebooks: int | None = None, attention: str = "whole-clip",
                build: Build | None = None, batch: int | None = None, slots: int | None = None) -> dict:
    """Export, check and validate the requested graphs, then write them all; returns the report.

    `samples` gives the fixed-length pair, `step_frames` the streaming pair (any length; None
    leaves it out, which only tests of older folders want).
    `attention` is what attention sees past the config's context: "whole-clip" (streaming equals the
    whole clip, as moshi's `encode`), "moshi-stream" (the step graphs follow moshi's streaming
    mode, ring cache and all) or "rustymimi" (both pairs let a query see `context + 1`
    positions, as candle's mask in Kyutai's Rust Mimi does; its streaming equals its whole clip).
    `build` asks for a target/precision build (see builds.py), measured against the
    validated fp32 graphs. `batch` adds a batched copy of the fixed-length encoder (batch.py).
    `slots` adds step graphs that step that many independent streams a call (`<side>_slots`).
    Nothing is written unless every graph passes; each file is written atomically.
    """
    cfg = model.cfg
    build = build or Build()
    build.check()
    if samples is None and step_frames is None:
        raise ExportError("nothing to export: pass --len (fixed-length graphs) or step frames")
    if batch is not None and samples is None:
        raise ExportError("--batch batches the fixed-length encoder: pass --len too (clips up to "
                          "that length are batched, longer ones stream)")
    if samples is not None and samples < 1:
        raise ExportError(f"--len must be positive, got {samples}")
    if step_frames is not None and step_frames < 1:
        raise ExportError(f"--step-frames must be at least 1, got {step_frames}")
    if slots is not None and (step_frames is None or not 1 < slots <= 4096):
        raise ExportError(f"--slots must be 2 to 4096 (streams one step graph call holds), got {slots}")
    if attention not in ATTENTION:
        raise ExportError(f"--attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
    k = in_graph_codebooks
    if k is not None and not 1 <= k <= cfg.n_codebooks:
        raise ExportError(f"--codebooks must be between 1 and {cfg.n_codebooks}")
    if samples is not None and samples % cfg.frame_size:
        log.info("--len %d is not a multiple of the %d-sample frame: the encoder zero-pads it to %d "
                 "inside the graph", samples, cfg.frame_size,
                 math.ceil(samples / cfg.frame_size) * cfg.frame_size)
    geo = Geometry(samples, None if samples is None else math.ceil(samples / cfg.frame_size),
                   step_frames, cfg.frame_size)
    meta = {"codec": "mimi", "preset": preset, "sample_rate": str(cfg.sample_rate),
            "frame_size": str(cfg.frame_size), "frame_rate": str(cfg.frame_rate),
            "latent_dim": str(cfg.dimension), "codebook_size": str(cfg.codebook_size),
            "codebook_dim": str(cfg.codebook_dim), "n_semantic": str(cfg.n_semantic),
            "weights": weights, "weights_sha256": weights_sha256}
    meta["export_id"] = export_id(meta, vars(geo), k, attention, slots)
    rvq = rvq_of(model)
    context = attention_context(cfg.context, attention)
    models, report = {}, {"validation": {}, "geometry": {**vars(geo), "step_samples": geo.step_samples,
                                                         "slots": slots},
                          "attention": attention, "context": context}
    model.set_moshi_ring(attention == "moshi-stream")
    model.set_context(context)
    specs = graph_specs(model.eval(), geo, meta, k, attention, slots)
    try:
        export_validated(specs, models, report["validation"], lambda s, m: validate(s, m, model, rvq))
        from .runtime import MimiCodec

        export_batched(specs, models, batch, MimiCodec.batchable, lambda s, y, _row: _codes_of(s, y, rvq),
                       report, build)
        manifest = {**meta, "quantizer": "numpy" if k is None else "graph",
                    "n_codebooks": k or cfg.n_codebooks, **report}
        report.update(finish_export(out_dir, models, rvq.arrays() if k is None else None, manifest,
                                    build, probe(manifest, specs)))
    finally:
        model.set_moshi_ring(False)  # hand the model back as it came
        model.set_context(cfg.context)
    return report


def probe(manifest: dict, specs: list[GraphSpec] = ()) -> Probe:
    """How a build runs each graph of the export `manifest` describes: the fixed pair
    on a clip cut to its length, the step pair streaming the whole clip (a dozen steps), with the
    runtime's default codebooks."""
    from .runtime import MimiCodec

    geo, sr = manifest["geometry"], int(manifest["sample_rate"])

    def encode(codec, name: str, clip: np.ndarray) -> np.ndarray:
        if name == "encoder":
            return codec.encode(clip[:, :geo["samples"]], sr, mode="fixed").data
        return codec.encode(clip, sr, mode="step").data

    def decode(codec, name: str, codes: np.ndarray) -> np.ndarray:
        return codec.decode(codes, mode="step" if name == "decoder_step" else "fixed")[0]

    clip = max(geo["samples"] or 0, 12 * (geo["step_samples"] or 0))
    return Probe(open=MimiCodec, encode=encode, decode=decode,
                      pairs={"encoder": "decoder", "encoder_step": "decoder_step"},
                      sample_rate=sr, clip_samples=clip, specs={s.name: s for s in specs})


def export(model: MimiModel, out_dir: Path, length: int | None, *, options: dict, **common) -> dict:
    """`codec-export mimi`: the step graphs (any length, streaming) and, with `--len`, the
    fixed-length pair for clips up to that length."""
    return export_mimi(model, out_dir, length, options.get("step_frames") or 1,
                       attention=options.get("attention") or "whole-clip", slots=options.get("slots"),
                       **common)


def describe(report: dict) -> list[str]:
    """What `codec-export mimi` prints about the geometry."""
    geo, lines = report["geometry"], []
    if geo["samples"] is not None:
        lines.append(f"  fixed graphs : {geo['samples']} samples (padded to "
                     f"{geo['frames'] * geo['frame_size']}) <-> {geo['frames']} frames: a clip of up to "
                     f"{geo['samples']} samples in one call, zeros after it (Mimi is causal)"
                     + (", longer ones stream" if geo["step_frames"] is not None else ""))
    if geo["step_frames"] is not None:
        lines.append(f"  step graphs  : {geo['step_samples']} samples <-> {geo['step_frames']} frames "
                     "per call, state in/out (zeros to start)")
        if geo.get("slots"):
            lines.append("  slot graphs  : the same step for "
                         f"{', '.join(map(str, slot_ladder(geo['slots'])))} "
                         "independent streams a call (codec-serve)")
    lines.append(f"  attention    : {report['attention']}, {report['context']} positions")
    return lines
