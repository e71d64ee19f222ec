"""DAC -> fixed-length ONNX graphs, validated against torch before anything is written.

Four graphs are written:
- `encoder.onnx` / `decoder.onnx`: official padding, exactly `length` samples in (right-padded
  inside the graph to a hop multiple, as the official `preprocess` does) and the matching frames.
- `encoder_chunked.onnx` / `decoder_chunked.onnx`: padding off, one window of the official
  chunked `compress` mode; the runtime slides it over audio of any length.
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
from ...export.graph import GraphSpec, Tensor, export_id, export_validated, factorised_rvq_arrays
from ...export.validate import AUDIO_ATOL, check_close, check_codes, run
from ...runtime.rvq import FactorisedRvq
from .config import DacConfig
from .model import DAC

log = logging.getLogger(__name__)


class EncoderGraph(nn.Module):
    """audio `[1, channels, samples]` -> latent `[1, L, frames]`, or codes `[1, K, frames]`
    in-graph (one channel but for TSAC's stereo model)."""

    def __init__(self, dac: DAC, samples: int, padding: bool, n_codebooks: int | None):
        super().__init__()
        self.dac, self.samples, self.padding, self.n_codebooks = dac, samples, padding, n_codebooks

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        self.dac.set_padding(self.padding)
        z = self.dac.encoder(self.dac.preprocess(audio))
        return z if self.n_codebooks is None else self.dac.quantizer.encode(z, self.n_codebooks)


class DecoderGraph(nn.Module):
    """latent `[1, L, frames]` (or codes `[1, K, frames]` in-graph) -> audio `[1, channels, samples]`."""

    def __init__(self, dac: DAC, padding: bool, codes_in: bool):
        super().__init__()
        self.dac, self.padding, self.codes_in = dac, padding, codes_in

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.dac.set_padding(self.padding)
        return self.dac.decoder(self.dac.quantizer.decode(x) if self.codes_in else x)


@dataclass
class Geometry:
    """Lengths of the four graphs, all derived from the model and the requested lengths."""

    samples: int  # padded encoder input (the user's --len)
    frames: int  # padded graphs' frames
    samples_out: int  # padded decoder output
    window: int  # chunked encoder input, a hop multiple
    chunk_frames: int  # chunked graphs' frames (official `chunk_length`)
    chunk_step: int  # chunked decoder output = samples the window advances (official `hop`)
    delay: int  # zeros padded on both sides of the signal in chunked mode
    hop: int  # samples a frame: the fixed graphs take clips of `(frames - 1) * hop + 1` to `samples`

    @classmethod
    def of(cls, cfg: DacConfig, samples: int, window: int) -> Geometry:
        """From the config alone: the CLI checks `--chunk-len` before any weights are read."""
        hop = cfg.hop_length
        frames = math.ceil(samples / hop)
        window = math.ceil(window / hop) * hop
        step = cfg.output_length(window)
        chunk_frames = cfg.chunk_frames(window)
        if step <= 0 or chunk_frames <= 0:
            raise ExportError(f"chunk window of {window} samples is shorter than the model's "
                              "receptive field; pass a longer --chunk-len (a few seconds)")
        return cls(samples, frames, _padded_out(cfg, frames), window, chunk_frames, step, cfg.delay(), hop)


def _padded_out(cfg: DacConfig, frames: int) -> int:
    """Decoder output length with padding: each transposed conv gives `s*T + s - 2*ceil(s/2)`."""
    n = frames
    for s in cfg.decoder_rates:
        n = n * s + s - 2 * math.ceil(s / 2)
    return n


def graph_specs(dac: DAC, geo: Geometry, meta: dict[str, str],
                in_graph_codebooks: int | None = None) -> list[GraphSpec]:
    """The four graphs. `in_graph_codebooks` puts the quantizer (that many levels) inside."""
    cfg = dac.cfg
    k = in_graph_codebooks
    quant = {"quantizer": "numpy" if k is None else "graph",
             "n_codebooks": str(cfg.n_codebooks if k is None else k)}

    def enc(name: str, samples: int, frames: int, padding: bool, extra: dict) -> GraphSpec:
        out = Tensor("latent", (1, cfg.latent_dim, frames), "float32") if k is None else \
            Tensor("codes", (1, k, frames), "int64")
        return GraphSpec(name, EncoderGraph(dac, samples, padding, k),
                         [Tensor("audio", (1, cfg.channels, samples), "float32")], [out],
                         {**meta, **quant, "role": "encoder", "mode": _mode(padding),
                          "samples": str(samples), "frames": str(frames), **extra})

    def dec(name: str, frames: int, samples: int, padding: bool, extra: dict) -> GraphSpec:
        inp = Tensor("latent", (1, cfg.latent_dim, frames), "float32") if k is None else \
            Tensor("codes", (1, k, frames), "int64")
        return GraphSpec(name, DecoderGraph(dac, padding, k is not None), [inp],
                         [Tensor("audio", (1, cfg.channels, samples), "float32")],
                         {**meta, **quant, "role": "decoder", "mode": _mode(padding),
                          "samples": str(samples), "frames": str(frames), **extra})

    chunk = {"chunk_step": str(geo.chunk_step), "delay": str(geo.delay),
             "window": str(geo.window), "chunk_frames": str(geo.chunk_frames)}
    # The receptive fields, for the whole-clip mode (runtime/plan.py) over the fixed pair.
    enc_margin, dec_margin = cfg.margins()
    return [
        enc("encoder", geo.samples, geo.frames, True, {"margin": str(enc_margin)}),
        dec("decoder", geo.frames, geo.samples_out, True, {"margin": str(dec_margin)}),
        enc("encoder_chunked", geo.window, geo.chunk_frames, False, chunk),
        dec("decoder_chunked", geo.chunk_frames, geo.chunk_step, False, chunk),
    ]


def _mode(padding: bool) -> str:
    """The runtime's name for a graph's way through the audio: official padding is one fixed
    call, padding off is a window of the chunked mode."""
    return "fixed" if padding else "chunked"


def rvq_of(dac: DAC) -> FactorisedRvq:
    """The quantizer's arrays for the numpy layer (no torch needed to read them back)."""
    return FactorisedRvq(factorised_rvq_arrays(dac.quantizer.quantizers))


def validate(spec: GraphSpec, model, dac: DAC, rvq: FactorisedRvq, seed: int = 1) -> dict[str, float]:
    """Compare ONNX Runtime with torch on inputs other than the export dummy.

    Encoders must give identical codes (through the numpy RVQ when the quantizer is outside the
    graph); decoders must match the audio to `AUDIO_ATOL`. Returns the measured errors.
    """
    cfg = dac.cfg
    x = spec.random_inputs(seed, high=cfg.codebook_size)[0]
    if spec.metadata["role"] == "decoder" and spec.inputs[0].dtype == "float32":
        # A decoder sees quantized latents in use: feed the latent of random codes.
        codes = np.random.default_rng(seed).integers(0, cfg.codebook_size,
                                                     (cfg.n_codebooks, x.shape[-1]))
        x = rvq.decode(codes)[None]
    with torch.no_grad():
        want = spec.module(torch.from_numpy(x)).numpy()
    got = run(model, {spec.inputs[0].name: x})[0]
    if spec.metadata["role"] == "decoder":
        return {"audio_max_abs_err": check_close(spec.name, got, want, AUDIO_ATOL)}
    if spec.outputs[0].dtype == "float32":
        k = int(spec.metadata["n_codebooks"])
        with torch.no_grad():
            want = dac.quantizer.encode(torch.from_numpy(want), k).numpy()
        got = rvq.encode(got[0], k)[None]
    check_codes(spec.name, got, want)
    return {"codes_identical": 1.0}


def export_dac(dac: DAC, out_dir: Path, samples: int, window: int | None = None, *,
               preset: str, weights: str, weights_sha256: str,
               in_graph_codebooks: int | None = None, build: Build | None = None,
               batch: int | None = None) -> dict:
    """Export, check and validate every graph, then write them all; returns the report.

    `batch` adds batched copies of both encoders (see batch.py).
    `build` asks for a target/precision build (see builds.py), measured against the
    validated fp32 graphs. Nothing is written unless every graph passes; each file is written
    atomically.
    """
    build = build or Build()
    build.check()
    cfg = dac.cfg
    if samples < cfg.hop_length:
        raise ExportError(f"--len {samples} is shorter than one frame ({cfg.hop_length} samples)")
    if in_graph_codebooks is not None and not 1 <= in_graph_codebooks <= cfg.n_codebooks:
        raise ExportError(f"--codebooks must be between 1 and {cfg.n_codebooks}")
    geo = Geometry.of(dac.cfg, samples, window or samples)
    meta = {"codec": "dac", "preset": preset, "sample_rate": str(cfg.sample_rate),
            "frame_size": str(cfg.hop_length), "latent_dim": str(cfg.latent_dim),
            "codebook_size": str(cfg.codebook_size), "codebook_dim": str(cfg.codebook_dim),
            "weights": weights, "weights_sha256": weights_sha256}
    if (cfg.channels, cfg.snake) != (1, "dac"):  # TSAC: older readers refuse what they cannot run
        if build.target == "web":
            raise ExportError(f"codecport.mjs runs one channel a call; this model takes {cfg.channels} "
                              "(TSAC): export it for another target")
        meta.update(channels=str(cfg.channels), snake=cfg.snake)
    meta["export_id"] = export_id(meta, vars(geo), in_graph_codebooks)
    rvq = rvq_of(dac)
    models, report = {}, {"files": {}, "validation": {}, "geometry": vars(geo)}
    specs = graph_specs(dac.eval(), geo, meta, in_graph_codebooks)
    try:
        export_validated(specs, models, report["validation"], lambda s, m: validate(s, m, dac, rvq))
        from .runtime import DacCodec

        export_batched(specs, models, batch, DacCodec.batchable, lambda s, y, _row: _codes_of(s, y, rvq),
                       report, build)
        manifest = {**meta, "quantizer": "numpy" if in_graph_codebooks is None else "graph",
                    "n_codebooks": in_graph_codebooks or cfg.n_codebooks, **report}
        report.update(finish_export(out_dir, models, rvq.arrays() if in_graph_codebooks is None
                                    else None, manifest, build, probe(manifest, specs)))
    finally:
        dac.set_padding(True)  # the graph wrappers switch it; hand the model back as it came
    return report


def _codes_of(spec: GraphSpec, y: np.ndarray, rvq: FactorisedRvq) -> np.ndarray:
    """Codes `[1, K, T]` of an encoder output: the latent through the numpy RVQ, or the codes."""
    if spec.metadata["quantizer"] == "graph":
        return y
    return rvq.encode(y[0], int(spec.metadata["n_codebooks"]))[None]


def probe(manifest: dict, specs: list[GraphSpec] = ()) -> Probe:
    """How a build runs each graph of the export `manifest` describes: the fixed pair
    on a clip cut to its length, the chunked pair on the whole clip (a few windows)."""
    from .runtime import DacCodec

    geo, sr = manifest["geometry"], int(manifest["sample_rate"])

    def encode(codec, name: str, clip: np.ndarray) -> np.ndarray:
        if codec.channels_per_row > 1:  # TSAC: the clip again, shifted, for each other channel
            clip = np.concatenate([np.roll(clip, 97 * c, axis=1) for c in range(codec.channels_per_row)])
        if name == "encoder":
            return codec.encode(clip[:, :geo["samples"]], sr, mode="fixed").data
        return codec.encode(clip, sr, mode="chunked").data

    def decode(codec, name: str, codes: np.ndarray) -> np.ndarray:
        return codec.decode(codes, mode="fixed" if name == "decoder" else "chunked")[0]

    return Probe(open=DacCodec, encode=encode, decode=decode,
                      pairs={"encoder": "decoder", "encoder_chunked": "decoder_chunked"},
                      sample_rate=sr, clip_samples=max(geo["samples"], 2 * geo["window"]),
                      specs={s.name: s for s in specs})


# Why `codec-export dac` needs --len (the CLI asks before loading any weights).
LEN_NEEDED = ("the samples per call of the fixed-length graphs (the chunked graphs for longer audio "
              "take --chunk-len, default --len)")


def check_options(length: int | None, options: dict, cfg: DacConfig | None) -> None:
    """`--chunk-len` against the receptive field before any weights are fetched, where the config
    is known first (a preset); a checkpoint's own config is checked once it is read."""
    if cfg is not None and length is not None:
        Geometry.of(cfg, length, options.get("chunk_len") or length)


def export(model: DAC, out_dir: Path, length: int | None, *, options: dict, **common) -> dict:
    """`codec-export dac`: the four graphs for `--len` and `--chunk-len` (`options`)."""
    if length is None:
        raise ExportError(f"pass --len N: {LEN_NEEDED}")
    return export_dac(model, out_dir, length, options.get("chunk_len"), **common)


def describe(report: dict) -> list[str]:
    """What `codec-export dac` prints about the geometry."""
    geo = report["geometry"]
    shortest = (geo["frames"] - 1) * geo["hop"] + 1  # fewer samples pad to fewer frames
    return [(f"  fixed graphs  : {geo['samples']} samples <-> {geo['frames']} frames "
             f"(decoder gives {geo['samples_out']} samples): a clip of {shortest} to {geo['samples']} "
             "samples in one call, any other through the chunked graphs"),
            (f"  chunked graphs: window {geo['window']} samples -> {geo['chunk_frames']} frames, "
             f"step {geo['chunk_step']} samples, delay {geo['delay']}")]
