"""Command line: `codec-export` (needs the [export] extra) and `codec-run` (runtime only).

Both iterate over the codec registry: `codec-export CODEC` is one command per registered codec
(its presets and its own options come from its declaration), and `codec-run` asks each folder
which codec it holds. Results go to stdout, diagnostics to stderr; every failure is one line
(`error: ...`, exit 1; anything unexpected `internal error: ...`, exit 2) and no traceback
unless -v asks for it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

import click

from . import __version__, registry
from .atomic import atomic_path
from .errors import CodecportError, CodesError

# export.variants.TARGETS and PRECISIONS, named here so that `--help` does not import onnx
TARGET_CHOICES = ("cpu", "cuda", "dml", "coreml", "nnapi", "mobile", "web")
PRECISION_CHOICES = ("fp32", "fp16", "int8")
PROVIDER_CHOICES = ("cpu", "cuda", "dml", "coreml", "auto")
MODE_CHOICES = ("auto", "fixed", "chunked", "step", "whole")
_state = {"verbose": False}


def _guard(fn):
    """One line instead of a traceback: a `CodecportError` exits 1, anything unexpected exits 2
    (with the traceback under -v)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except CodecportError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:  # stdout closed early (`| head`): nothing left to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        except Exception as e:  # noqa: BLE001 (the last line of defence: a bug, never a traceback)
            if _state["verbose"]:
                traceback.print_exc()
            first = (str(e).strip().splitlines() or [""])[0]
            click.echo(f"internal error: {type(e).__name__}: {first}; rerun with -v for the "
                       "traceback, and please report it", err=True)
            sys.exit(2)

    return wrapper


def _logging(verbose: bool) -> None:
    _state["verbose"] = verbose
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


def _note(message: str) -> None:
    """A diagnostic: stderr, so that stdout holds only results."""
    click.echo(message, err=True)


verbose_option = click.option("-v", "--verbose", is_flag=True, help="Log what happens; show tracebacks.")


# ---- codec-export ------------------------------------------------------------------------
@click.group(context_settings={"show_default": True})
@click.version_option(__version__, prog_name="codec-export")
def export_cli() -> None:
    """Export a codec to fixed-length ONNX graphs, validated against torch."""


def _export_params(spec) -> list[click.Parameter]:
    """Options of `codec-export CODEC`: those every codec takes, then the codec's own."""
    presets = list(spec.presets)
    common = [
        click.Option(["--variant"], type=click.Choice(presets), default=None,
                     help=f"Model preset [default: {spec.default_variant}, or what the checkpoint's "
                          "config matches]; a checkpoint's own config wins when it carries one."),
        click.Option(["--len", "length"], type=click.IntRange(min=1), default=None,
                     help="Samples per call of the fixed-length encoder/decoder pair (not a multiple "
                          "of the frame: zero-padded inside the graph, as the official model does)."),
        click.Option(["--weights"], default=None,
                     help="Released name (" + ", ".join(spec.module("config").RELEASES) + "), a "
                          "checkpoint file or folder, or a URL [default: the variant's release]."),
        click.Option(["--revision"], default=None,
                     help="Revision (branch, tag or commit) of weights fetched from Hugging Face."),
        click.Option(["--random-init"], is_flag=True, help="Seeded random weights instead of a "
                     "checkpoint (for trying the pipeline; the audio is noise)."),
        click.Option(["--seed"], type=int, default=0, help="Seed for --random-init."),
        click.Option(["--in-graph-quantizer"], is_flag=True, help="Put the RVQ inside the graphs: "
                     "the encoder outputs codes, the decoder takes them."),
        click.Option(["--codebooks"], type=click.IntRange(min=1), default=None,
                     help="With --in-graph-quantizer: codebooks in the graphs [default: all]."),
        click.Option(["--batch"], type=click.IntRange(min=2), default=None,
                     help="Also write the encoders with batch dimension B (encoder_bB.onnx...), "
                          "for codec-run tokenize; each row is checked against the batch-1 graph."),
        click.Option(["-o", "--out", "out_dir"], type=click.Path(path_type=Path), default=None,
                     help="Output folder, replaced whole [default: CODEC-VARIANT-LEN]."),
        click.Option(["--target"], type=click.Choice(TARGET_CHOICES), default="cpu",
                     help="Where the graphs will run: nnapi/mobile carry the convs as 2-D and spell "
                          "the ops NNAPI lacks, mobile adds .ort files and a reduced-build operator "
                          "config, coreml adds .mlpackage files (coremltools), web puts the quantizer in "
                          "the graphs and their facts in the manifest for codecport.mjs."),
        click.Option(["--precision"], type=click.Choice(PRECISION_CHOICES), default="fp32",
                     help="fp16 (fp32 inputs/outputs) or int8 (static QDQ); the deviation from "
                          "fp32 is measured and written into each file and the manifest."),
        click.Option(["--calibration"], type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     multiple=True, help="Audio file(s) to calibrate int8 on (repeatable) "
                                         "[default: generated clips]."),
    ]
    own = [click.Option([o.flag, o.dest], default=o.default, help=o.help,
                        type=click.Choice(o.type) if isinstance(o.type, tuple)
                        else click.IntRange(min=o.minimum) if o.type is int else o.type)
           for o in spec.export_options]
    verbose = click.Option(["-v", "--verbose"], is_flag=True, help="Log what happens; show tracebacks.")
    return [*common, *own, verbose]


def _export_command(spec) -> click.Command:
    return click.Command(
        spec.name, params=_export_params(spec), context_settings={"show_default": True},
        callback=_guard(functools.partial(_export, spec)),
        help=f"Write {spec.label}'s graphs (fixed-length, and what any length needs), the RVQ "
             "arrays and a manifest, every graph validated against torch first.")


def _export(spec, *, variant, length, weights, revision, random_init, seed, in_graph_quantizer,
            codebooks, batch, out_dir, target, precision, calibration, verbose, **own) -> None:
    _logging(verbose)
    if target == "web":
        if not spec.web:
            runs = ", ".join(c.label for c in registry.codecs() if c.web)
            raise click.UsageError(f"{spec.label} has no browser runtime yet (codecport.mjs runs {runs}); "
                                   "export it for another --target")
        in_graph_quantizer = True  # the browser reads no rvq.npz
    if in_graph_quantizer and not spec.runtime.in_graph_quantizer:
        raise click.UsageError(f"{spec.label}'s quantizer runs in numpy beside the graphs (rvq.npz); "
                               "leave out --in-graph-quantizer")
    if codebooks is not None and not in_graph_quantizer:
        raise click.UsageError("--codebooks only applies with --in-graph-quantizer; the numpy "
                               "quantizer takes --codebooks at codec-run time")
    try:
        from .export import graph  # noqa: F401 (torch, onnx, onnxsim)
    except ImportError as e:
        raise CodecportError(f"exporting needs torch and onnx ({e}); pip install 'codecport[export]'") from e
    from .export.variants import Shaping

    shaping = Shaping(target, precision, list(calibration) or None)
    shaping.check()  # before the (long) export, not after
    from .export.batch import check_batch

    check_batch(batch, shaping)
    if out_dir is not None:  # refused now, not after a long trace (the default name is checked later)
        from .export.graph import check_out_dir

        check_out_dir(out_dir)
    models, presets = spec.module("model"), spec.presets
    t0 = time.perf_counter()
    if random_init:
        variant = variant or spec.default_variant
        _note(f"using RANDOM weights (seed {seed}): the graphs are real, the audio is not")
        model = models.init_random(models.MODEL(presets[variant]), seed).eval()
        source, sha = f"random-init seed {seed} (NOT trained weights)", "none"
    else:
        loader = spec.module("weights")
        source = weights or variant or spec.default_variant
        if weights is None and source not in spec.module("config").RELEASES:
            raise click.UsageError(f"--variant {variant} has no released weights; pass --weights "
                                   "or --random-init")
        model, sha = loader.load(source, variant=variant, revision=revision)
        # Label the graphs by what the weights are, not by a default the user never chose.
        variant = next((name for name, cfg in presets.items() if cfg == model.cfg), "custom")
    out_dir = out_dir or Path(f"{spec.name}-{variant}-{length or 'any'}")
    in_graph = (codebooks or model.cfg.n_codebooks) if in_graph_quantizer else None
    exporter = spec.module("export")
    report = exporter.export(model, out_dir, length, options=own, variant=variant, weights=source,
                             weights_sha256=sha, in_graph_codebooks=in_graph, shaping=shaping,
                             batch=batch)
    click.echo(f"exported {spec.name} {variant} ({source}) in {time.perf_counter() - t0:.1f} s to {out_dir}/")
    for line in exporter.describe(report):
        click.echo(line)
    _print_validation(report)


def _print_validation(report: dict) -> None:
    fp32 = " (fp32, before the variant)" if "deviation" in report else ""
    for name, errs in report["validation"].items():
        what = ", ".join(f"{k}={v:.3g}" if "err" in k else "codes identical" for k, v in errs.items())
        against = "each row vs batch 1" if "rows_codes_identical" in errs else "vs torch"
        click.echo(f"  {name + '.onnx':<24} validated {against}{fp32}: {what}")
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


for _spec in registry.codecs():
    export_cli.add_command(_export_command(_spec))


@export_cli.command("check")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None,
              help="Also write the report as JSON.")
@verbose_option
@_guard
def check_cmd(target, json_out, verbose) -> None:
    """Per execution provider, whether each graph would run whole: CoreML (ML Program and
    NeuralNetwork) and NNAPI from ONNX Runtime's usability checker, DirectML from a rule table."""
    _logging(verbose)
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
def _parse_options(ctx, param, values) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{v!r} is not KEY=VALUE", ctx=ctx, param=param)
        out[key] = value
    return out


def _run_options(fn):
    """Options every `codec-run` command that runs a model takes."""
    for option in reversed([
        click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path), required=True,
                     help="Folder written by codec-export."),
        click.option("--mode", type=click.Choice(MODE_CHOICES), default="auto",
                     help="Way through the graphs: fixed (one call of the fixed-length pair), "
                          "chunked (DAC's windows, as the official compress), step (streaming steps), "
                          "whole (windows overlapping by the receptive field: the official codes of "
                          "the whole clip), or auto (the codec's choice by length)."),
        click.option("--provider", type=click.Choice(PROVIDER_CHOICES), default="cpu",
                     help="ONNX Runtime execution provider."),
        click.option("--fallback", type=click.Choice(["cpu"]), default=None,
                     help="Use this provider when the requested one is not installed."),
        click.option("--provider-option", "options", multiple=True, callback=_parse_options,
                     metavar="KEY=VALUE",
                     help="ONNX Runtime provider option, overriding codecport's defaults "
                          "(e.g. MLComputeUnits=CPUAndNeuralEngine for CoreML); repeatable."),
        verbose_option,
    ]):
        fn = option(fn)
    return fn


@click.group(context_settings={"show_default": True})
@click.version_option(__version__, prog_name="codec-run")
def run_cli() -> None:
    """Encode and decode audio with exported ONNX graphs (no torch needed)."""


MODE_LABELS = {"fixed": "fixed graph", "chunked": "chunked, {chunk} frames a chunk",
               "step": "streaming step graphs", "whole": "whole clip, overlapping windows"}
_layout_option = click.option(
    "--layout", type=click.Choice(registry.layout_names()) if registry.layout_names() else None,
    default=None, help="Another arrangement of the codes in the file: " + "; ".join(
        f"{lay.name} ({c.label}, {lay.suffix}): {lay.help}" for c in registry.codecs() for lay in c.layouts))


@run_cli.command("encode")
@click.argument("audio_in", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out", type=click.Path(path_type=Path), required=True,
              help="codes.npy (bare codes [channels, codebooks, frames]), codes.npz (codes plus "
                   "the original length and rate), or the codec's own format (DAC: .dac).")
@click.option("--codebooks", type=click.IntRange(min=1), default=None,
              help="Use the first K codebooks (lower bitrate) [default: all for DAC, 8 for Mimi "
                   "as Moshi uses].")
@_layout_option
@_run_options
@_guard
def encode_cmd(audio_in, out, codebooks, layout, model_dir, mode, provider, fallback, options, verbose) -> None:
    """Encode an audio file of any length and sample rate to codes (read block by block)."""
    from .runtime.audio import FileSource
    from .runtime.codes import check_npy

    _logging(verbose)
    spec = registry.codec_of_folder(model_dir)
    lay = None if layout is None else registry.layout(layout, spec.name)
    if lay is not None and out.suffix != lay.suffix:
        raise CodesError(f"{out}: the {lay.name} layout is written as {lay.suffix}")
    if out.suffix not in spec.suffixes:
        raise CodesError(f"{out}: {spec.label} codes are written as {', '.join(spec.suffixes)}")
    source = FileSource(audio_in)
    codec = spec.runtime(model_dir, provider, fallback, options)
    if lay is None and out.suffix == ".npy":  # refused before the work, not after
        check_npy(out, codec.levels)
    if source.sample_rate != codec.sample_rate:
        _note(f"resampling {source.sample_rate} Hz -> {codec.sample_rate} Hz (soxr)")
    t0 = time.perf_counter()
    codes = codec.encode_source(source, codebooks, codec.check_mode(None if mode == "auto" else mode), True)
    took = time.perf_counter() - t0
    if lay is not None:
        lay.save(codes, out)
    else:
        codes.save(out)
    label = MODE_LABELS[codes.mode].format(chunk=codes.chunk_frames)
    shapes = " + ".join(str(list(a.shape)) for a in codes.arrays)
    click.echo(f"{audio_in}: {codes.channels} ch x {codes.num_samples} samples @ {codes.sample_rate} Hz "
               f"-> codes {shapes} [{label}] in {took:.2f} s on {codec.provider}")
    click.echo(f"wrote {out}")


@run_cli.command("tokenize")
@click.argument("inputs", nargs=-1, required=True)
@click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="Folder written by codec-export (with --batch B for batched graphs).")
@click.option("-o", "--out", "out_dir", type=click.Path(path_type=Path), required=True,
              help="Output folder: a Parquet dataset, one row per input; rerun to resume.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local",
              help="local: worker processes on this machine; ray: Ray Data (pip install "
                   "'codecport[ray]'), a private local cluster or --address.")
@click.option("--address", default=None, help="Ray cluster to attach to [default: RAY_ADDRESS, "
                                              "else a private local cluster].")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes (local) or actors (ray) [default: one per core; on a Ray "
                   "cluster its CPUs less one].")
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="Rows per call of the batched encoders [default: the folder's, else 1].")
@click.option("--codebooks", type=click.IntRange(min=1), default=None,
              help="Use the first K codebooks [default: all for DAC, 8 for Mimi].")
@click.option("--shard-rows", type=click.IntRange(min=1), default=1000,
              help="Rows per Parquet shard (a shard is also written every minute when rows come slower).")
@click.option("--provider", type=click.Choice(PROVIDER_CHOICES), default="cpu",
              help="ONNX Runtime execution provider of every worker (cuda: one GPU per Ray actor).")
@click.option("--fallback", type=click.Choice(["cpu"]), default=None,
              help="Use this provider when the requested one is not installed.")
@click.option("--provider-option", "options", multiple=True, callback=_parse_options, metavar="KEY=VALUE",
              help="ONNX Runtime provider option; repeatable.")
@verbose_option
@_guard
def tokenize_cmd(inputs, model_dir, out_dir, engine, address, workers, batch, codebooks, shard_rows,
                 provider, fallback, options, verbose) -> None:
    """Tokenize a corpus: audio files, folders, globs, manifests (.txt, .csv, .jsonl, .parquet
    with a path column) or Hugging Face Parquet datasets, into a resumable Parquet dataset."""
    from .runtime.tokenize import tokenize

    _logging(verbose)
    registry.codec_of_folder(model_dir)  # says what the folder is before anything starts
    summary = tokenize(list(inputs), model_dir, out_dir, engine=engine, address=address, workers=workers,
                       batch=batch, codebooks=codebooks, provider=provider, fallback=fallback,
                       options=options, shard_rows=shard_rows, progress=True)
    for ident, error in summary.errors[:5]:
        _note(f"failed: {ident}: {error}")
    if summary.failed > 5:
        _note(f"... and {summary.failed - 5} more: see {out_dir / '__errors__' / 'errors.parquet'}")
    click.echo(summary.line())
    click.echo(f"wrote {out_dir}/")


@run_cli.command("decode")
@click.argument("codes_in", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out", type=click.Path(path_type=Path), required=True,
              help="Output audio (.wav, written as RF64 past 4 GiB, or .flac).")
@_layout_option
@click.option("--noise-seed", type=click.IntRange(min=0), default=None,
              help="Decoders that add noise (SNAC): draw it from this seed, the same audio every "
                   "time [default: fresh noise each decode, as the official decode].")
@click.option("--no-noise", is_flag=True, help="Decoders that add noise: add none (zero noise).")
@_run_options
@_guard
def decode_cmd(codes_in, out, layout, noise_seed, no_noise, model_dir, mode, provider, fallback, options,
               verbose) -> None:
    """Decode codes (.npy, .npz, or the codec's own format) to audio, piece by piece."""
    from .runtime.audio import audio_format
    from .runtime.codes import load_codes

    _logging(verbose)
    if no_noise and noise_seed is not None:
        raise click.UsageError("--noise-seed and --no-noise exclude each other")
    spec = registry.codec_of_folder(model_dir)
    audio_format(out)
    if layout is not None:
        lay = registry.layout(layout, spec.name)
        if not codes_in.is_file():
            raise CodesError(f"{codes_in}: no such codes file")
        codes = lay.load(codes_in)
    else:
        codes = load_codes(codes_in)
    if codes.codec not in (None, spec.name):
        raise CodesError(f"{codes_in}: holds {codes.codec} codes, not {spec.name}; decode them with "
                         f"a {codes.codec} export")
    codec = spec.runtime(model_dir, provider, fallback, options)
    t0 = time.perf_counter()
    noise = "zero" if no_noise else noise_seed
    channels, samples, sr = codec.decode_to_file(codes, out, mode=None if mode == "auto" else mode,
                                                 progress=True, noise=noise)
    click.echo(f"{codes_in} -> {channels} ch x {samples} samples @ {sr} Hz in "
               f"{time.perf_counter() - t0:.2f} s on {codec.provider}")
    click.echo(f"wrote {out}")


@run_cli.command("info")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print everything as one JSON object.")
@verbose_option
@_guard
def info_cmd(target, as_json, verbose) -> None:
    """Show what an exported folder or .onnx/.ort file holds (from its metadata)."""
    from .errors import ModelFileError
    from .runtime.folder import read_manifest
    from .runtime.graph import graph_files, read_metadata

    _logging(verbose)
    if target.is_dir():
        files, manifest = graph_files(target), read_manifest(target)
    else:
        files, manifest = [target], None
    if not files:
        raise ModelFileError(f"{target}: no .onnx or .ort files here; run codec-export first")
    graphs = {str(f): read_metadata(f) for f in files}
    if as_json:
        click.echo(json.dumps({"path": str(target), "manifest": manifest, "graphs": graphs}, indent=2))
        return
    first = next(iter(graphs.values()))
    rate = int(first["sample_rate"]) / int(first["frame_size"]) if "frame_size" in first else None
    click.echo(f"{target}: {first.get('codec')} {first.get('variant')}, {first.get('sample_rate')} Hz"
               + (f", {rate:g} frames/s" if rate else "")
               + f", {first.get('n_codebooks')} codebooks of {first.get('codebook_size')}, quantizer "
               f"{first.get('quantizer')}, export {first.get('export_id')}")
    for path, meta in graphs.items():
        size = f"{meta.get('samples')} samples <-> {meta.get('frames')} frames"
        extra = "".join(f", {k} {meta[k]}" for k in ("target", "precision") if k in meta)
        click.echo(f"  {path}: {meta.get('role')} {meta.get('mode')}, {size}{extra}")


@run_cli.command("web")
@click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="Folder written by codec-export ... --target web.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, help="Port on 127.0.0.1 (0: any free one).")
@click.option("--ort-web", "ort_web", type=click.Path(path_type=Path), default=None,
              help="onnxruntime-web's dist folder [default: $CODECPORT_ORT_WEB, else "
                   "node_modules/onnxruntime-web here or beside codecport's source].")
@verbose_option
@_guard
def web_cmd(model_dir, port, ort_web, verbose) -> None:
    """Serve the browser demo on 127.0.0.1: the page at /, codecport.mjs, the folder at /model/
    and onnxruntime-web at /ort/, cross-origin isolated for multi-threaded WASM."""
    from .runtime.web import WebServer

    _logging(verbose)
    server = WebServer(model_dir, ort_web, port)
    m = server.manifest
    click.echo(f"serving {m['codec']} {m.get('variant')} ({model_dir}) with onnxruntime-web from "
               f"{server.ort_dir}")
    click.echo(f"open {server.url}  (Ctrl-C stops)", nl=True)
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo("stopped")
