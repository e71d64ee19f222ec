"""NeuCodec -> fixed-shape ONNX graphs, validated against torch before anything is written.

Two graphs for `frames` code frames, those of a clip of `--len` samples at the output rate (24 kHz
and 480 a frame for NeuCodec, 16 kHz and 320 for XCodec2; `frames_of`), static, with no DFT, no
ConvTranspose, no Conv pads and no Gather:
- `decoder.onnx`: FSQ levels `[1, frames, len(levels)]` (the numpy FSQ of codecs/neucodec/fsq.py turns
  codes into them) and `mask` `[1, 1, frames]` -> audio `[1, 1, frames * hop]`: `project_out`,
  `fc_post_a`, the Vocos backbone and the ISTFT head, the inverse STFT as a MatMul
  (codecs/neucodec/istft.py);
- `encoder.onnx`: 16 kHz audio `[1, 1, (frames + acoustic_extra) * 320]` (padded as the
  official `_prepare_audio` pads it; NeuCodec's acoustic path has a frame more than its codes),
  w2v-BERT's fbank features `[1, frames, 160]` (codecs/neucodec/fbank.py) and `mask` -> the FSQ's
  input `[1, frames, len(levels)]`: w2v-BERT 2.0's first 16 layers (codecs/neucodec/w2vbert.py), the
  acoustic and semantic encoders, `fc_prior`, `project_in`.

With the quantizer in the graphs (`--in-graph-quantizer`, and `--target web`, whose browser has
no numpy), the graphs take and give what the user has: the encoder 16 kHz audio and `mask`, with
the fbank features computed inside, out int32 codes `[1, 1, frames]`; the decoder those codes and
`mask` (codecs/neucodec/ingraph.py).

`mask` marks the frames of a clip shorter than the graph: the graphs then give what the official
model gives on the clip alone (GroupNorm statistics, attention keys, conv edges, the ISTFT
envelope; codecs/neucodec/model.py). The backbone and w2v-BERT attend to the whole clip, so a clip
longer than the graph has no exact form through it: the runtime's fixed mode refuses it, its
windowed mode cross-fades windows of the graph's length (codecs/neucodec/runtime.py).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ...errors import ExportError
from ...export.batch import check_batch, export_batched, masked_rows
from ...export.builds import Build, finish_export
from ...export.deviation import Probe
from ...export.graph import GraphSpec, Tensor, export_id, export_validated
from ...export.validate import AUDIO_ATOL, check_close, check_codes, run
from ...runtime.audio import resampled_length
from ...runtime.folder import sized_name
from .fbank import Fbank, raw_values
from .fsq import Fsq
from .ingraph import FbankFeatures, FsqOps, RawValues
from .model import NeuCodec
from .runtime import NeuCodecCodec, clip_mask

FEATURES_ATOL = 1e-4  # in-graph fbank features against the runtime's (measured: 1e-5)


class DecoderGraph(nn.Module):
    def __init__(self, model: NeuCodec):
        super().__init__()
        self.model = model

    def forward(self, levels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model.decode_levels(levels, mask)


class EncoderGraph(nn.Module):
    def __init__(self, model: NeuCodec):
        super().__init__()
        self.model = model

    def forward(self, audio: torch.Tensor, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model.encode_latent(audio, features, mask)


class CodesDecoderGraph(nn.Module):
    """Codes in: the decoder with its FSQ inside."""

    def __init__(self, model: NeuCodec):
        super().__init__()
        self.model, self.fsq = model, FsqOps(model.cfg.levels)

    def forward(self, codes: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model.decode_levels(self.fsq.levels(codes.squeeze(1)), mask)


class AudioEncoderGraph(nn.Module):
    """Audio in, codes out: the encoder with its fbank features and FSQ inside."""

    def __init__(self, model: NeuCodec):
        super().__init__()
        self.model, self.fsq = model, FsqOps(model.cfg.levels)
        cfg = model.cfg
        hop = math.prod(cfg.enc_strides)
        self.fbank = RawValues(cfg.fbank_pad, hop, cfg.acoustic_extra, cfg.distill.hubert.normalize) \
            if cfg.distill else FbankFeatures(cfg.fbank_pad, hop, cfg.acoustic_extra)

    def forward(self, audio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        latent = self.model.encode_latent(audio, self.fbank(audio, mask), mask)
        return self.fsq.indices(latent)[:, None]


def frames_of(model: NeuCodec, samples: int, label: str = NeuCodecCodec.label) -> int:
    """Code frames of graphs that hold a clip of `--len` samples at the output rate in one call:
    the codes the runtime gives that clip once resampled to the encoder's rate (`clip_frames`:
    `n // 320`, or `n // 320 + 1` where both paths have every padded frame, XCodec2's), and
    never fewer than the clip's whole frames at the output rate."""
    cfg = model.cfg
    hop_in = math.prod(cfg.enc_strides)
    hop, add = NeuCodecCodec.clip_frames({"input_frame_size": str(hop_in),
                                          "acoustic_extra": str(cfg.acoustic_extra)})
    clip = (resampled_length(samples, cfg.sample_rate, cfg.input_rate) + add) // hop
    frames = max(-(-samples // cfg.hop), clip)
    if frames < 2:
        raise ExportError(f"{label} graphs need at least 2 frames ({2 * model.cfg.hop} samples at "
                          f"{model.cfg.sample_rate} Hz), got --len {samples}")
    return frames


def input_samples(cfg, frames: int) -> int:
    """The longest clip (at the input rate) whose padded length fits graphs of `frames` frames."""
    return (frames - 1 + cfg.acoustic_extra) * math.prod(cfg.enc_strides)


def features_shape(cfg, frames: int) -> tuple[int, ...]:
    """The semantic model's input for graphs of `frames`: w2v-BERT's fbank rows, or for the
    distilled variant DistilHuBERT's samples (the audio input and `fbank_pad` zeros each side)."""
    if cfg.distill:
        return (1, (frames + cfg.acoustic_extra) * math.prod(cfg.enc_strides) + 2 * cfg.fbank_pad)
    return (1, frames, cfg.semantic.features)


def graph_specs(model: NeuCodec, frames: int, meta: dict[str, str]) -> list[GraphSpec]:
    """The decoder and encoder graphs for `frames` code frames (50 a second); with the quantizer
    in the graphs (`meta["quantizer"]`), codes in and out and the features computed inside."""
    cfg = model.cfg
    hop_in = math.prod(cfg.enc_strides)
    mask = Tensor("mask", (1, 1, frames), "float32")
    audio_in = Tensor("audio", (1, 1, (frames + cfg.acoustic_extra) * hop_in), "float32")
    codes = Tensor("codes", (1, 1, frames), "int32")
    if meta["quantizer"] == "graph":
        decoder, decoder_in = CodesDecoderGraph(model), codes
        encoder, encoder_in, encoder_out = AudioEncoderGraph(model), [audio_in], codes
    else:
        decoder, decoder_in = DecoderGraph(model), Tensor("levels", (1, frames, len(cfg.levels)), "float32")
        encoder, encoder_in = (EncoderGraph(model),
                               [audio_in, Tensor("features", features_shape(cfg, frames), "float32")])
        encoder_out = Tensor("latent", (1, frames, len(cfg.levels)), "float32")
    return [
        GraphSpec("decoder", decoder, [decoder_in, mask],
                  [Tensor("audio", (1, 1, frames * cfg.hop), "float32")],
                  {**meta, "role": "decoder", "mode": "fixed", "samples": str(frames * cfg.hop)}),
        # `samples`: the longest clip the encoder takes (its input holds the official pad after it)
        GraphSpec("encoder", encoder, [*encoder_in, mask], [encoder_out],
                  {**meta, "role": "encoder", "mode": "fixed", "samples": str(input_samples(cfg, frames))}),
    ]


def validate(spec: GraphSpec, onnx_model, model: NeuCodec, seed: int = 1) -> dict[str, float]:
    """ONNX Runtime against torch on inputs other than the export dummy, a shorter clip in the
    window: a decoder on the levels of random codes, within `AUDIO_ATOL`; an encoder to identical
    FSQ codes on the clip's frames."""
    fsq = Fsq(model.cfg.levels)
    rng = np.random.default_rng(seed)
    frames = spec.inputs[-1].shape[-1]
    valid = max(2, frames - max(1, frames // 4))
    mask = clip_mask(frames, valid)
    in_graph = spec.metadata["quantizer"] == "graph"
    if spec.metadata["role"] == "decoder":
        codes = rng.integers(0, fsq.size, (1, frames))
        x = [codes[None].astype(np.int32) if in_graph else fsq.codes(codes), mask]
    else:
        x = [rng.standard_normal(t.shape).astype(np.float32) for t in spec.inputs[:-1]]
        x = [x[0] * np.float32(0.3), *x[1:], mask]
    with torch.no_grad():
        want = spec.module(*map(torch.from_numpy, x)).numpy()
    got = run(onnx_model, {t.name: a for t, a in zip(spec.inputs, x)})[0]
    if spec.metadata["role"] == "decoder":
        return {"audio_max_abs_err": check_close(spec.name, got, want, AUDIO_ATOL)}
    if not in_graph:
        check_codes(spec.name, fsq.indices(got[:, :valid]), fsq.indices(want[:, :valid]))
        return {"codes_identical": 1.0}
    check_codes(spec.name, got[..., :valid], want[..., :valid])
    # The features inside against the runtime's numpy ones, on the clip the mask marks.
    cfg, hop_in = model.cfg, int(spec.metadata["input_frame_size"])
    clip = x[0][0, 0, :(valid + cfg.acoustic_extra) * hop_in]
    with torch.no_grad():
        inside = spec.module.fbank(*map(torch.from_numpy, (x[0], mask))).numpy()[0]
    if cfg.distill:
        outside = raw_values(clip, cfg.fbank_pad, cfg.distill.hubert.normalize)[0]
        inside = inside[:outside.size]
    else:
        inside, outside = inside[:valid], Fbank().features(np.pad(clip, cfg.fbank_pad))
    err = check_close(f"{spec.name} features", inside, outside, FEATURES_ATOL)
    return {"codes_identical": 1.0, "features_max_abs_err": err}


def _row_codes(spec: GraphSpec, y: np.ndarray, row: dict[str, np.ndarray], fsq: Fsq) -> np.ndarray:
    """Codes `[1, 1, valid]` of an encoder's output `y` (one row) on the clip `row` masks in."""
    valid = int(row["mask"].sum())
    if spec.metadata["quantizer"] == "graph":
        return y[..., :valid].astype(np.int64)
    return fsq.indices(y[:, :valid])[:, None]


def export_neucodec(model: NeuCodec, out_dir: Path, samples: int, *, preset: str, weights: str,
                    weights_sha256: str, in_graph_codebooks: int | None = None, build: Build | None = None,
                    batch: int | None = None, runtime: type[NeuCodecCodec] = NeuCodecCodec,
                    buckets: tuple[int, ...] = ()) -> dict:
    """Export, check and validate both graphs, then write them; returns the report. `runtime`:
    the codec the folder is for (XCodec2's is NeuCodec's model with its own config); `buckets`:
    shorter lengths (samples at the output rate) whose graphs are written too."""
    build = build or Build()
    build.check()
    label = runtime.label
    if in_graph_codebooks not in (None, 1):
        raise ExportError(f"{label} has one codebook; leave out --codebooks")
    check_batch(batch, build)
    cfg = model.cfg
    frames = frames_of(model.eval(), samples, label)
    sizes = sorted({frames_of(model, b, label) for b in buckets})
    if sizes and sizes[-1] >= frames:
        raise ExportError(f"--buckets must each be shorter than --len ({frames} frames), got one of "
                          f"{sizes[-1]} frames")
    # `length`: `--len`, the clip (samples at `sample_rate`) the graphs hold in one call.
    geo = {"frames": frames, "samples": frames * cfg.hop, "input_samples": input_samples(cfg, frames),
           "sample_rate": cfg.sample_rate, "input_rate": cfg.input_rate, "buckets": sizes, "length": samples}
    meta = {"codec": runtime.name, "preset": preset, "sample_rate": str(cfg.sample_rate),
            "input_rate": str(cfg.input_rate), "frame_size": str(cfg.hop),
            "input_frame_size": str(math.prod(cfg.enc_strides)), "levels": ",".join(map(str, cfg.levels)),
            "n_codebooks": "1", "codebook_size": str(cfg.codebook_size),
            "quantizer": "numpy" if in_graph_codebooks is None else "graph",
            "frames": str(frames), "fbank_pad": str(cfg.fbank_pad), "acoustic_extra": str(cfg.acoustic_extra),
            "weights": weights, "weights_sha256": weights_sha256}
    if cfg.distill:  # DistilHuBERT's input: the padded clip's samples (fbank.raw_values)
        meta.update(semantic_model="hubert", semantic_normalize=str(int(cfg.distill.hubert.normalize)))
    meta["export_id"] = export_id(meta, geo)
    models, report = {}, {"files": {}, "validation": {}, "geometry": geo}
    specs = graph_specs(model, frames, meta)
    for f in sizes:
        specs += [dataclasses.replace(spec, name=sized_name(spec.name, f))
                  for spec in graph_specs(model, f, {**meta, "frames": str(f)})]
    export_validated(specs, models, report["validation"], lambda s, m: validate(s, m, model))
    fsq = Fsq(cfg.levels)
    export_batched(specs, models, batch, runtime.batchable, lambda s, y, row: _row_codes(s, y, row, fsq),
                   report, build, lambda s: masked_rows(s, lambda i, n: max(2, n - i * n // (2 * batch))))
    manifest = {**meta, "n_codebooks": 1, **report}
    report.update(finish_export(out_dir, models, None, manifest, build, probe(manifest, specs, runtime)))
    return report


def probe(manifest: dict, specs: list[GraphSpec] = (), runtime: type[NeuCodecCodec] = NeuCodecCodec) -> Probe:
    """How a build runs the graphs: a clip of the graphs' length (at the input rate) encoded,
    its codes decoded."""
    geo, sr = manifest["geometry"], int(manifest["input_rate"])
    limit, hop, extra = (geo["input_samples"], int(manifest["input_frame_size"]),
                         int(manifest["acoustic_extra"]))
    buckets = geo.get("buckets", [])
    # Each bucket's encoder on the longest clip it holds (the runtime picks it by length).
    limits = {"encoder": limit, **{sized_name("encoder", f): (f - 1 + extra) * hop for f in buckets}}

    def encode(codec, name: str, clip: np.ndarray) -> np.ndarray:
        return codec.encode(clip[:, :limits[name]], sr).data

    def decode(codec, name: str, codes: np.ndarray) -> np.ndarray:
        return codec.decode(codes)[0]

    pairs = {"encoder": "decoder", **{sized_name("encoder", f): sized_name("decoder", f) for f in buckets}}
    return Probe(open=runtime, encode=encode, decode=decode, pairs=pairs,
                 sample_rate=sr, clip_samples=limit, specs={s.name: s for s in specs})


# Why `codec-export neucodec` needs --len (the CLI asks before loading any weights).
LEN_NEEDED = ("the samples (at 24 kHz, the rate it decodes to; it encodes 16 kHz) of the longest clip "
              "the fixed graphs encode and decode exactly in one call (shorter ones are masked, longer "
              "ones go through cross-faded windows)")


def parse_buckets(text: str | None) -> tuple[int, ...]:
    """`--buckets 48000,96000` -> (48000, 96000)."""
    if not text:
        return ()
    try:
        sizes = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ExportError("--buckets takes lengths in samples separated by commas (48000,96000), "
                          f"got {text!r}") from None
    if min(sizes) < 1:
        raise ExportError(f"--buckets must be positive lengths, got {text!r}")
    return sizes


def check_options(length: int | None, options: dict, cfg=None) -> None:
    """What `--buckets` says on its own, checked before any weights are fetched (a released model is
    gigabytes); what needs the model's frames is checked at export."""
    sizes = parse_buckets(options.get("buckets"))
    if length is not None and sizes and max(sizes) >= length:
        raise ExportError(f"--buckets must each be shorter than --len ({length} samples), got {max(sizes)}")


def export(model: NeuCodec, out_dir: Path, length: int | None, *, options: dict, **common) -> dict:
    """`codec-export neucodec`: the encoder and decoder for `--len` (and `--buckets`)."""
    if length is None:
        raise ExportError(f"pass --len N: {LEN_NEEDED}")
    return export_neucodec(model, out_dir, length, buckets=parse_buckets(options.get("buckets")), **common)


def describe(report: dict) -> list[str]:
    """What `codec-export neucodec` and `xcodec2` print: the clip the graphs hold in one call, in
    `--len`'s samples (at the output rate) and in the encoder's."""
    geo = report["geometry"]
    seconds = geo["samples"] / geo["frames"] / geo["sample_rate"]  # a frame
    sr, rate = geo["sample_rate"], geo["input_rate"]
    lines = [(f"  fixed graphs  : {geo['frames']} frames ({geo['frames'] * seconds:.2f} s) a call: a clip "
              f"of up to {geo['length']} samples at {sr} Hz (--len; "
              f"{resampled_length(geo['length'], sr, rate)} at {rate} Hz in)"),
             (f"                  -> codes -> {geo['samples']} samples at {sr} Hz, cut to the clip's "
              "length; shorter clips masked, longer ones windowed")]
    if geo.get("buckets"):
        lines.append("  buckets       : " + ", ".join(f"{f} frames ({f * seconds:.2f} s)"
                                                      for f in geo["buckets"]) +
                     "; a clip runs through the shortest that holds it")
    return lines
