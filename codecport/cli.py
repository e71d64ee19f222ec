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
MIMI_VARIANTS = ["mimi", "tiny"]
# export.variants.TARGETS, named here so that `--help` does not import onnx
TARGET_CHOICES = ("cpu", "cuda", "dml", "coreml", "nnapi", "mobile")


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


def _export_options(fn):
    """Options every codec's export takes."""
    for option in reversed([
        click.option("--random-init", is_flag=True, help="Seeded random weights instead of a "
                     "checkpoint (for trying the pipeline; the audio is noise)."),
        click.option("--seed", type=int, default=0, help="Seed for --random-init."),
        click.option("--in-graph-quantizer", is_flag=True, help="Put the RVQ inside the graphs: "
                     "the encoder outputs codes, the decoder takes them."),
        click.option("--codebooks", type=click.IntRange(min=1), default=None,
                     help="With --in-graph-quantizer: codebooks in the graphs [default: all]."),
        click.option("-o", "--out", "out_dir", type=click.Path(path_type=Path), default=None,
                     help="Output folder [default: CODEC-VARIANT-LEN]."),
        click.option("--target", type=click.Choice(list(TARGET_CHOICES)), default="cpu",
                     help="Where the graphs will run: nnapi/mobile carry the convs as 2-D and spell "
                          "the ops NNAPI lacks, mobile adds .ort files and a reduced-build operator "
                          "config, coreml adds .mlpackage files (coremltools)."),
        click.option("--precision", type=click.Choice(["fp32", "fp16", "int8"]), default="fp32",
                     help="fp16 (fp32 inputs/outputs) or int8 (static QDQ); the deviation from "
                          "fp32 is measured and written into each file and the manifest."),
        click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     multiple=True, help="Audio file(s) to calibrate int8 on (repeatable) "
                                         "[default: generated clips]."),
        click.option("-v", "--verbose", is_flag=True),
    ]):
        fn = option(fn)
    return fn


def _export_imports():
    try:
        from .export import graph  # noqa: F401 (torch, onnx, onnxsim)
    except ImportError as e:
        raise CodecportError(f"exporting needs torch and onnx ({e}); "
                             "pip install 'codecport[export]'") from e


def _check_codebooks_flag(in_graph_quantizer: bool, codebooks: int | None) -> None:
    if codebooks is not None and not in_graph_quantizer:
        raise click.UsageError("--codebooks only applies with --in-graph-quantizer; the numpy "
                               "quantizer takes --codebooks at codec-run time")


def _random_weights(init_random, model, seed: int):
    """(model, source label, sha256) for --random-init, saying loudly what it is."""
    click.echo(f"using RANDOM weights (seed {seed}): the graphs are real, the audio is not")
    return init_random(model, seed).eval(), f"random-init seed {seed} (NOT trained weights)", "none"


def _shaping(target: str, precision: str, calibration: tuple[Path, ...]):
    from .export.variants import Shaping

    shaping = Shaping(target, precision, list(calibration) or None)
    shaping.check()  # before the (long) export, not after
    return shaping


def _print_validation(report: dict) -> None:
    fp32 = " (fp32, before the variant)" if "deviation" in report else ""
    for name, errs in report["validation"].items():
        what = ", ".join(f"{k}={v:.3g}" if "err" in k else "codes identical" for k, v in errs.items())
        click.echo(f"  {name + '.onnx':<22} validated vs torch{fp32}: {what}")
    if "deviation" in report:
        click.echo(f"  target {report['target']}, precision {report['precision']}; deviation from fp32 "
                   f"on {report['clip_set']}:")
        for name, d in report["deviation"].items():
            parts = []
            if "code_agreement_pct" in d:
                parts.append(f"codes {d['code_agreement_pct']:.2f}% equal")
            if "snr_db" in d:
                parts.append(f"audio SNR {d['snr_db']:.1f} dB, max abs err {d['max_abs_err']:.2g}")
            parts.append(f"{d['size_bytes'] / 1e6:.1f} MB (fp32 {d['fp32_size_bytes'] / 1e6:.1f} MB)")
            click.echo(f"    {name + '.onnx':<22} {', '.join(parts)}")
    for name, file in report["files"].items():
        if not file.endswith(".onnx"):
            click.echo(f"  {file}")


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
@_export_options
@_one_line_errors
def export_dac_cmd(variant, length, chunk_len, weights, random_init, seed, in_graph_quantizer,
                   codebooks, out_dir, target, precision, calibration, verbose) -> None:
    """Write encoder/decoder graphs (exact length and chunked), RVQ arrays and a manifest."""
    _logging(verbose)
    _check_codebooks_flag(in_graph_quantizer, codebooks)
    _export_imports()
    shaping = _shaping(target, precision, calibration)
    from .export.dac import export_dac
    from .models.dac import DAC, PRESETS, init_random
    from .models.dac_weights import RELEASES, load_dac

    t0 = time.perf_counter()
    if random_init:
        variant = variant or "44khz"
        model, source, sha = _random_weights(init_random, DAC(PRESETS[variant]), seed)
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
                        weights_sha256=sha, in_graph_codebooks=in_graph, shaping=shaping)
    click.echo(f"exported dac {variant} ({source}) in {time.perf_counter() - t0:.1f} s to {out_dir}/")
    geo = report["geometry"]
    click.echo(f"  exact graphs  : {geo['samples']} samples <-> {geo['frames']} frames "
               f"(decoder gives {geo['samples_out']} samples)")
    click.echo(f"  chunked graphs: window {geo['window']} samples -> {geo['chunk_frames']} frames, "
               f"step {geo['chunk_step']} samples, delay {geo['delay']}")
    _print_validation(report)


@export_cli.command("mimi")
@click.option("--variant", type=click.Choice(MIMI_VARIANTS), default=None,
              help="Model preset [default: mimi, or what a transformers config says].")
@click.option("--len", "length", type=click.IntRange(min=1), default=None,
              help="Samples per call of the fixed-length encoder/decoder pair (24 kHz; not a "
                   "multiple of 1920: zero-padded inside the graph to whole frames, as moshi does).")
@click.option("--streaming", is_flag=True,
              help="Also write the static-shape step graphs (explicit state) for streaming and "
                   "for audio of any length.")
@click.option("--frames", type=click.IntRange(min=1), default=1,
              help="Code frames (80 ms each) per streaming step.")
@click.option("--window", type=click.Choice(["whole-clip", "moshi-stream", "rustymimi"]),
              default="whole-clip",
              help="Attention past 250 frames (10 s): equal to the whole clip (moshi's encode), "
                   "moshi's streaming mode (step graphs), whose ring cache drops a step's oldest "
                   "keys, or Kyutai's Rust Mimi (fixed and step graphs), which sees one key more.")
@click.option("--weights", default=None,
              help="Released name (mimi: moshi's checkpoint from Hugging Face), a moshi "
                   ".safetensors, a transformers MimiModel folder, or a URL [default: mimi].")
@_export_options
@_one_line_errors
def export_mimi_cmd(variant, length, streaming, frames, window, weights, random_init, seed,
                    in_graph_quantizer, codebooks, out_dir, target, precision, calibration,
                    verbose) -> None:
    """Write fixed-length (--len) and/or streaming step graphs (--streaming), RVQ arrays and a manifest."""
    _logging(verbose)
    if length is None and not streaming:
        raise click.UsageError("pass --len N (fixed-length graphs), --streaming (step graphs), or both")
    _check_codebooks_flag(in_graph_quantizer, codebooks)
    _export_imports()
    shaping = _shaping(target, precision, calibration)
    from .export.mimi import export_mimi
    from .models.mimi import PRESETS, MimiModel, init_random
    from .models.mimi_weights import load_mimi

    t0 = time.perf_counter()
    if random_init:
        variant = variant or "mimi"
        model, source, sha = _random_weights(init_random, MimiModel(PRESETS[variant]), seed)
    else:
        source = weights or "mimi"
        model, sha = load_mimi(source, variant=variant)
        variant = next((name for name, cfg in PRESETS.items() if cfg == model.cfg), "custom")
    out_dir = out_dir or Path(f"mimi-{variant}-{length or 'stream'}")
    in_graph = (codebooks or model.cfg.n_codebooks) if in_graph_quantizer else None
    report = export_mimi(model, out_dir, length, frames if streaming else None, variant=variant,
                         weights=source, weights_sha256=sha, in_graph_codebooks=in_graph,
                         window=window, shaping=shaping)
    click.echo(f"exported mimi {variant} ({source}) in {time.perf_counter() - t0:.1f} s to {out_dir}/")
    geo, fs = report["geometry"], model.cfg.frame_size
    if geo["samples"] is not None:
        click.echo(f"  fixed graphs : {geo['samples']} samples (padded to {geo['frames'] * fs}) <-> "
                   f"{geo['frames']} frames")
    if geo["step_frames"] is not None:
        click.echo(f"  step graphs  : {geo['step_samples']} samples <-> {geo['step_frames']} frames "
                   "per call, state in/out (zeros to start)")
    click.echo(f"  attention    : {window} window, {report['context']} positions")
    _print_validation(report)


@export_cli.command("check")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None,
              help="Also write the report as JSON.")
@_one_line_errors
def check_cmd(target, json_out) -> None:
    """Per execution provider, whether each graph would run whole: CoreML (ML Program and
    NeuralNetwork) and NNAPI from ONNX Runtime's usability checker, DirectML from a rule table."""
    _export_imports()
    from .export.check import check

    reports = check(target)
    for r in reports:
        click.echo(f"{r['file']} (opset {r['opset']}, {r['nodes']} nodes)")
        for ep, v in r["eps"].items():
            share = f"{v['supported']}/{v['nodes']} nodes"
            if v["full"]:
                click.echo(f"  {ep:<21} yes: one partition, {share}")
                continue
            grouped: dict[str, list[str]] = {}
            for op, reason in v["reasons"].items():
                grouped.setdefault(reason, []).append(op)
            why = "; ".join(f"{', '.join(ops)}: {reason}" for reason, ops in grouped.items())
            click.echo(f"  {ep:<21} no: {v['partitions']} partitions, {share} - {why}")
    if json_out:
        with atomic_path(json_out) as tmp:
            tmp.write_text(json.dumps(reports, indent=2))
        click.echo(f"wrote {json_out}")


# ---- codec-run ---------------------------------------------------------------------------
provider_option = click.option("--provider", type=click.Choice(["cpu", "cuda", "dml", "coreml", "auto"]),
                               default="cpu", help="ONNX Runtime execution provider.")
model_option = click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path),
                            required=True, help="Folder written by codec-export.")
fallback_option = click.option("--fallback", type=click.Choice(["cpu"]), default=None,
                               help="Use this provider when the requested one is not installed.")


def _parse_options(ctx, param, values) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{v!r} is not KEY=VALUE", ctx=ctx, param=param)
        out[key] = value
    return out


option_option = click.option("--provider-option", "options", multiple=True, callback=_parse_options,
                             metavar="KEY=VALUE",
                             help="ONNX Runtime provider option, overriding codecport's defaults "
                                  "(e.g. MLComputeUnits=CPUAndNeuralEngine for CoreML); repeatable.")


@click.group(context_settings={"show_default": True})
def run_cli() -> None:
    """Encode and decode audio with exported ONNX graphs (no torch needed)."""


def _codec(model_dir: Path, provider: str, fallback: str | None, options: dict[str, str]):
    """DacCodec or MimiCodec, by what the folder's graphs say they are."""
    from .runtime.dac import DacCodec
    from .runtime.mimi import MimiCodec
    from .runtime.session import read_metadata

    graphs = _graph_files(model_dir) if model_dir.is_dir() else []
    if not graphs:
        raise ModelFileError(f"{model_dir}: no exported graphs here; run codec-export first")
    try:  # the manifest says it without loading a model; the codec class checks the graphs anyway
        codec = json.loads((model_dir / "manifest.json").read_text())["codec"]
    except (OSError, ValueError, KeyError, TypeError):
        codec = read_metadata(graphs[0]).get("codec")
    if codec == "mimi":
        return MimiCodec(model_dir, provider, fallback, options)
    return DacCodec(model_dir, provider, fallback, options)


def _graph_files(folder: Path) -> list[Path]:
    """The folder's graphs: each `.onnx`, and each `.ort` without an `.onnx` beside it (what the
    runtime loads, see runtime/session.py)."""
    onnx_files = sorted(folder.glob("*.onnx"))
    stems = {f.stem for f in onnx_files}
    return onnx_files + sorted(f for f in folder.glob("*.ort") if f.stem not in stems)


def _is_mimi(codec) -> bool:
    return type(codec).__name__ == "MimiCodec"


streaming_option = click.option("--streaming", is_flag=True,
                                help="Mimi: go through the step graphs (as a live stream would) "
                                     "even when the clip fits the fixed-length graph.")


@run_cli.command("encode")
@click.argument("audio_in", type=click.Path(path_type=Path))
@model_option
@click.option("-o", "--out", "out", type=click.Path(path_type=Path), required=True,
              help="codes.npy (codes [channels, codebooks, frames]); or codes.dac (DAC's official "
                   "format) / codes.npz (Mimi: codes + original length and rate), which decode "
                   "back to the original length and rate.")
@click.option("--codebooks", type=click.IntRange(min=1), default=None,
              help="Use the first K codebooks (lower bitrate) [default: all for DAC, 8 for Mimi "
                   "as Moshi uses].")
@streaming_option
@provider_option
@fallback_option
@option_option
@click.option("-v", "--verbose", is_flag=True)
@_one_line_errors
def encode_cmd(audio_in, model_dir, out, codebooks, streaming, provider, fallback, options,
               verbose) -> None:
    """Encode a WAV/FLAC file of any length and sample rate to codes."""
    from .runtime.audio import read_audio

    _logging(verbose)
    codec = _codec(model_dir, provider, fallback, options)
    mimi = _is_mimi(codec)
    suffixes = (".npy", ".npz") if mimi else (".npy", ".dac")
    if out.suffix not in suffixes:
        raise CodesError(f"{out}: the output must end in {' or '.join(suffixes)}")
    if streaming and not mimi:
        raise click.UsageError("--streaming is for Mimi folders; DAC streams long audio in chunks anyway")
    audio, sr = read_audio(audio_in)
    if sr != codec.sample_rate:
        click.echo(f"resampling {sr} Hz -> {codec.sample_rate} Hz (soxr)")
    t0 = time.perf_counter()
    if mimi:
        from .runtime.audio import check_audio, resample
        from .runtime.mimi import save_codes

        x = resample(check_audio(audio), sr, codec.sample_rate)
        codes = codec.encode(x, codec.sample_rate, codebooks, streaming=streaming, progress=True)
        took = time.perf_counter() - t0
        mode = "fixed graph" if not streaming and codec.fits_fixed(x.shape[1]) else "streaming step graphs"
        if out.suffix == ".npz":
            save_codes(out, codes, audio.shape[1], sr)
    else:
        f = codec.compress(audio, sr, codebooks, progress=True)
        took, codes = time.perf_counter() - t0, f.codes
        mode = "exact (official encode)" if f.padding else f"chunked ({f.chunk_length} frames/chunk)"
        if out.suffix == ".dac":
            f.save(out)
    if out.suffix == ".npy":
        with atomic_path(out) as tmp, open(tmp, "wb") as fh:
            np.save(fh, codes)
    click.echo(f"{audio_in}: {audio.shape[0]} ch x {audio.shape[1]} samples @ {sr} Hz -> codes "
               f"{list(codes.shape)} [{mode}] in {took:.2f} s on {codec.provider}")
    click.echo(f"wrote {out}")


@run_cli.command("decode")
@click.argument("codes_in", type=click.Path(path_type=Path))
@model_option
@click.option("-o", "--out", "out", type=click.Path(path_type=Path), required=True,
              help="Output audio (.wav or .flac).")
@streaming_option
@provider_option
@fallback_option
@option_option
@click.option("-v", "--verbose", is_flag=True)
@_one_line_errors
def decode_cmd(codes_in, model_dir, out, streaming, provider, fallback, options, verbose) -> None:
    """Decode codes.npy, codes.dac (DAC) or codes.npz (Mimi) to audio."""
    from .runtime.audio import write_audio, write_audio_pieces
    from .runtime.dacfile import DacFile

    _logging(verbose)
    codec = _codec(model_dir, provider, fallback, options)
    mimi = _is_mimi(codec)
    if streaming and not mimi:
        raise click.UsageError("--streaming is for Mimi folders")
    t0 = time.perf_counter()
    if mimi and codes_in.suffix == ".npz":
        audio, sr = codec.decode_file(codes_in, streaming=streaming, progress=True)
    elif codes_in.suffix == ".dac" and not mimi:
        audio, sr = codec.decompress(DacFile.load(codes_in), progress=True)
    else:
        # Bare codes: written piece by piece, so memory stays flat however long the file is.
        codes, sr = _load_npy(codes_in), codec.sample_rate
        pieces = codec.decode_pieces(codes, streaming, progress=True) if mimi else \
            codec.decode_pieces(codes, progress=True)
        channels, samples = write_audio_pieces(out, pieces, sr)
        audio = None
    took = time.perf_counter() - t0
    if audio is not None:
        write_audio(out, audio, sr)
        channels, samples = audio.shape
    click.echo(f"{codes_in} -> {channels} ch x {samples} samples @ {sr} Hz in "
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
    """Show what an exported folder or .onnx/.ort file holds (from its metadata)."""
    from .runtime.session import read_metadata

    files = _graph_files(target) if target.is_dir() else [target]
    if not files:
        raise ModelFileError(f"{target}: no .onnx or .ort files here; run codec-export first")
    for f in files:
        meta = read_metadata(f)
        click.echo(f"{f}:")
        click.echo(json.dumps(meta, indent=2, sort_keys=True))
