"""Command line: `codec-export` (needs the [export] extra) and `codec-run` (runtime only)."""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from pathlib import Path

import click
import numpy as np

from .atomic import atomic_path
from .errors import CodecportError, CodesError, ModelFileError

DAC_VARIANTS = ["44khz", "24khz", "16khz", "44khz-16kbps", "tiny"]


def _one_line_errors(fn):
    """Print a `CodecportError` as one line on stderr and exit 1, instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CodecportError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)

    return wrapper


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


# ---- codec-export ------------------------------------------------------------------------
@click.group(context_settings={"show_default": True})
def export_cli() -> None:
    """Export a codec to fixed-length ONNX graphs, validated against torch."""


@export_cli.command("dac")
@click.option("--variant", type=click.Choice(DAC_VARIANTS), default=None,
              help="Model preset [default: 44khz, or what the checkpoint's config matches]; a "
                   "checkpoint's own config wins when it carries one.")
@click.option("--len", "length", type=click.IntRange(min=1), required=True,
              help="Samples per call of the fixed-length encoder (not a hop multiple: zero-padded "
                   "inside the graph to the next one, as the official model does).")
@click.option("--chunk-len", type=click.IntRange(min=1), default=None,
              help="Window in samples of the chunked graphs for long audio [default: --len].")
@click.option("--weights", default=None,
              help="Released name (44khz, 24khz, 16khz, 44khz-16kbps), a .pth / transformers "
                   "folder path, or a URL [default: the variant's released weights].")
@click.option("--random-init", is_flag=True, help="Seeded random weights instead of a checkpoint "
              "(for trying the pipeline; the audio is noise).")
@click.option("--seed", type=int, default=0, help="Seed for --random-init.")
@click.option("--in-graph-quantizer", is_flag=True,
              help="Put the RVQ inside the graphs: the encoder outputs codes, the decoder takes them.")
@click.option("--codebooks", type=click.IntRange(min=1), default=None,
              help="With --in-graph-quantizer: codebooks in the graphs [default: all].")
@click.option("-o", "--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Output folder [default: dac-VARIANT-LEN].")
@click.option("-v", "--verbose", is_flag=True)
@_one_line_errors
def export_dac_cmd(variant, length, chunk_len, weights, random_init, seed, in_graph_quantizer,
                   codebooks, out_dir, verbose) -> None:
    """Write encoder/decoder graphs (exact length and chunked), RVQ arrays and a manifest."""
    _logging(verbose)
    try:
        from .export.dac import export_dac
        from .models.dac import DAC, PRESETS, init_random
        from .models.dac_weights import RELEASES, load_dac
    except ImportError as e:
        raise CodecportError(f"exporting needs torch and onnx ({e}); "
                             "pip install 'codecport[export]'") from e
    if codebooks is not None and not in_graph_quantizer:
        raise click.UsageError("--codebooks only applies with --in-graph-quantizer; the numpy "
                               "quantizer takes --codebooks at codec-run time")
    t0 = time.perf_counter()
    if random_init:
        variant = variant or "44khz"
        model, source, sha = init_random(DAC(PRESETS[variant]), seed).eval(), \
            f"random-init seed {seed} (NOT trained weights)", "none"
        click.echo(f"using RANDOM weights (seed {seed}): the graphs are real, the audio is not")
    else:
        source = weights or variant or "44khz"
        if source not in RELEASES and weights is None:
            raise click.UsageError(f"--variant {variant} has no released weights; pass --weights "
                                   "or --random-init")
        model, sha = load_dac(source, variant=variant)
        # Label the graphs by what the weights are, not by a default the user never chose.
        variant = next((name for name, cfg in PRESETS.items() if cfg == model.cfg), "custom")
    out_dir = out_dir or Path(f"dac-{variant}-{length}")
    in_graph = (codebooks or model.cfg.n_codebooks) if in_graph_quantizer else None
    report = export_dac(model, out_dir, length, chunk_len, variant=variant, weights=source,
                        weights_sha256=sha, in_graph_codebooks=in_graph)
    click.echo(f"exported dac {variant} ({source}) in {time.perf_counter() - t0:.1f} s to {out_dir}/")
    geo = report["geometry"]
    click.echo(f"  exact graphs  : {geo['samples']} samples <-> {geo['frames']} frames "
               f"(decoder gives {geo['samples_out']} samples)")
    click.echo(f"  chunked graphs: window {geo['window']} samples -> {geo['chunk_frames']} frames, "
               f"step {geo['chunk_step']} samples, delay {geo['delay']}")
    for name, errs in report["validation"].items():
        what = ", ".join(f"{k}={v:.3g}" if "err" in k else "codes identical" for k, v in errs.items())
        click.echo(f"  {report['files'][name]:<22} validated vs torch: {what}")
    for name in ("rvq", "manifest"):
        if name in report["files"]:
            click.echo(f"  {report['files'][name]}")


# ---- codec-run ---------------------------------------------------------------------------
provider_option = click.option("--provider", type=click.Choice(["cpu", "cuda", "dml", "coreml", "auto"]),
                               default="cpu", help="ONNX Runtime execution provider.")
model_option = click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path),
                            required=True, help="Folder written by codec-export.")
fallback_option = click.option("--fallback", type=click.Choice(["cpu"]), default=None,
                               help="Use this provider when the requested one is not installed.")


@click.group(context_settings={"show_default": True})
def run_cli() -> None:
    """Encode and decode audio with exported ONNX graphs (no torch needed)."""


def _codec(model_dir: Path, provider: str, fallback: str | None):
    from .runtime.dac import DacCodec

    return DacCodec(model_dir, provider, fallback)


@run_cli.command("encode")
@click.argument("audio_in", type=click.Path(path_type=Path))
@model_option
@click.option("-o", "--out", "out", type=click.Path(path_type=Path), required=True,
              help="codes.npy (codes [channels, codebooks, frames]) or codes.dac (official format).")
@click.option("--codebooks", type=click.IntRange(min=1), default=None,
              help="Use the first K codebooks (lower bitrate) [default: all].")
@provider_option
@fallback_option
@click.option("-v", "--verbose", is_flag=True)
@_one_line_errors
def encode_cmd(audio_in, model_dir, out, codebooks, provider, fallback, verbose) -> None:
    """Encode a WAV/FLAC file of any length and sample rate to codes."""
    from .runtime.audio import read_audio

    _logging(verbose)
    if out.suffix not in (".npy", ".dac"):
        raise CodesError(f"{out}: the output must end in .npy or .dac")
    codec = _codec(model_dir, provider, fallback)
    audio, sr = read_audio(audio_in)
    if sr != codec.sample_rate:
        click.echo(f"resampling {sr} Hz -> {codec.sample_rate} Hz (soxr)")
    t0 = time.perf_counter()
    f = codec.compress(audio, sr, codebooks, progress=True)
    took = time.perf_counter() - t0
    if out.suffix == ".dac":
        f.save(out)
    else:
        with atomic_path(out) as tmp, open(tmp, "wb") as fh:
            np.save(fh, f.codes)
    mode = "exact (official encode)" if f.padding else f"chunked ({f.chunk_length} frames/chunk)"
    click.echo(f"{audio_in}: {audio.shape[0]} ch x {audio.shape[1]} samples @ {sr} Hz -> codes "
               f"{list(f.codes.shape)} [{mode}] in {took:.2f} s on {codec.provider}")
    click.echo(f"wrote {out}")


@run_cli.command("decode")
@click.argument("codes_in", type=click.Path(path_type=Path))
@model_option
@click.option("-o", "--out", "out", type=click.Path(path_type=Path), required=True,
              help="Output audio (.wav or .flac).")
@provider_option
@fallback_option
@click.option("-v", "--verbose", is_flag=True)
@_one_line_errors
def decode_cmd(codes_in, model_dir, out, provider, fallback, verbose) -> None:
    """Decode codes.npy or codes.dac to audio."""
    from .runtime.audio import write_audio
    from .runtime.dacfile import DacFile

    _logging(verbose)
    codec = _codec(model_dir, provider, fallback)
    t0 = time.perf_counter()
    if codes_in.suffix == ".dac":
        audio, sr = codec.decompress(DacFile.load(codes_in), progress=True)
    else:
        audio, sr = codec.decode(_load_npy(codes_in), progress=True), codec.sample_rate
    took = time.perf_counter() - t0
    write_audio(out, audio, sr)
    click.echo(f"{codes_in} -> {audio.shape[0]} ch x {audio.shape[1]} samples @ {sr} Hz in "
               f"{took:.2f} s on {codec.provider}")
    click.echo(f"wrote {out}")


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise CodesError(f"{path}: not a readable .npy array of codes ({e})") from e


@run_cli.command("info")
@click.argument("target", type=click.Path(path_type=Path))
@_one_line_errors
def info_cmd(target) -> None:
    """Show what an exported folder or .onnx file holds (from its metadata)."""
    from .runtime.session import read_metadata

    files = sorted(target.glob("*.onnx")) if target.is_dir() else [target]
    if not files:
        raise ModelFileError(f"{target}: no .onnx files here; run codec-export first")
    for f in files:
        meta = read_metadata(f)
        click.echo(f"{f}:")
        click.echo(json.dumps(meta, indent=2, sort_keys=True))
