"""`codec-run`: encode, decode and inspect with exported graphs (runtime only, no torch); the
corpus tokenizer (tokenize.py) and the browser demo (web.py) join the group here."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from .. import registry
from ..atomic import check_apart, ready_parent
from ..errors import CodesError
from ..frontend import INT_MAX, SEED_MAX, Group, guard, setup_logging, unwinds_on_sigterm
from ..runtime.codefile import FORMATS, LAYOUTS
from ..version import __version__
from .common import codebooks_help, note, run_options, verbose_option
from .tokenize import tokenize_cmd
from .web import web_cmd


@click.group(cls=Group, context_settings={"show_default": True})
@click.version_option(__version__, prog_name="codec-run")
def run_cli() -> None:
    """Encode and decode audio with exported ONNX graphs (no torch needed)."""


MODE_LABELS = {"fixed": "fixed graph", "chunked": "chunked, {chunk} frames a chunk",
               "step": "step graphs", "whole": "whole clip, overlapping windows",
               "windowed": "cross-faded windows, not the whole-clip result"}
registry.codecs()  # the codecs' own layouts and formats: the registry adds them as it finds them
layout_option = click.option(
    "--layout", type=click.Choice(list(LAYOUTS)), default=None,
    help="Another arrangement of the codes in the file: " + "; ".join(
        f"{lay.name} ({lay.codec}, {lay.suffix}): {lay.help}" for lay in LAYOUTS.values()))


@run_cli.command("encode")
@click.argument("audio_in", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out", type=click.Path(path_type=Path), required=True,
              help="codes.npy (bare codes [channels, codebooks, frames]), codes.npz (codes plus "
                   "the original length and rate), or a codec's own format ("
                   + ", ".join(f"{f.codec}: {f.suffix}" for f in FORMATS.values() if f.codec) + ").")
@click.option("--codebooks", type=click.IntRange(1, INT_MAX), default=None,
              help=codebooks_help("Use the first K codebooks (lower bitrate)"))
@layout_option
@run_options
@guard
@unwinds_on_sigterm
def encode_cmd(audio_in, out, codebooks, layout, model_dir, mode, provider, fallback, options,
               verbose) -> None:
    """Encode an audio file of any length and sample rate to codes (read block by block)."""
    from ..runtime.audio import FileSource
    from ..runtime.codefile import check_npy, format_of
    from ..runtime.codefile import layout as find_layout

    setup_logging(verbose)
    spec = registry.codec_of_folder(model_dir)
    check_apart(out, [audio_in, model_dir])
    lay = None if layout is None else find_layout(layout, spec.name)
    if lay is not None:
        format_of(out, layout)  # the layout's suffix, refused before the work
    if out.suffix not in spec.suffixes:
        raise CodesError(f"{out}: {spec.label} codes are written as {', '.join(spec.suffixes)}")
    source = FileSource(audio_in)
    codec = spec.runtime(model_dir, provider, fallback, options)
    mode = codec.check_mode(mode)  # these three refused before the work, not after
    codec.codebooks(codebooks)
    if lay is None and out.suffix == ".npy":
        check_npy(out, codec.levels)
    ready_parent(out)
    if source.sample_rate != codec.input_rate:
        note(f"resampling {source.sample_rate} Hz -> {codec.input_rate} Hz (soxr)")
    t0 = time.perf_counter()
    codes = codec.encode_source(source, codebooks, mode, True)
    took = time.perf_counter() - t0
    codes.save(out, layout)
    label = MODE_LABELS[codes.mode].format(chunk=codes.chunk_frames)
    shapes = " + ".join(str(list(a.shape)) for a in codes.arrays)
    click.echo(f"{audio_in}: {codes.channels * codec.channels_per_row} ch x {codes.num_samples} samples "
               f"@ {codes.sample_rate} Hz "
               f"-> codes {shapes} [{label}] in {took:.2f} s on {codec.provider}")
    click.echo(f"wrote {out}")


@run_cli.command("decode")
@click.argument("codes_in", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out", type=click.Path(path_type=Path), required=True,
              help="Output audio (.wav, written as RF64 past 4 GiB, or .flac).")
@layout_option
@click.option("--noise-seed", type=click.IntRange(0, SEED_MAX), default=None,
              help="Decoders that add noise: draw it from this seed, the same audio every "
                   "time [default: fresh noise each decode, as the official decode].")
@click.option("--no-noise", is_flag=True, help="Decoders that add noise: add none (zero noise).")
@run_options
@guard
@unwinds_on_sigterm
def decode_cmd(codes_in, out, layout, noise_seed, no_noise, model_dir, mode, provider, fallback, options,
               verbose) -> None:
    """Decode codes (.npy, .npz, or the codec's own format) to audio, piece by piece."""
    from ..runtime.audio import audio_format
    from ..runtime.codefile import layout as find_layout
    from ..runtime.codes import load_codes

    setup_logging(verbose)
    if no_noise and noise_seed is not None:
        raise click.UsageError("--noise-seed and --no-noise exclude each other")
    spec = registry.codec_of_folder(model_dir)
    check_apart(out, [codes_in, model_dir])
    audio_format(out)
    if layout is not None:
        find_layout(layout, spec.name)
    codes = load_codes(codes_in, layout)
    if codes.codec not in (None, spec.name):
        raise CodesError(f"{codes_in}: holds {codes.codec} codes, not {spec.name}; decode them with "
                         f"a {codes.codec} export")
    if codes.bare and layout is None:
        note(f"{codes_in} names no codec: decoding it as bare {spec.label} codes with {model_dir} "
             "(every frame, at the model's rate)")
    codec = spec.runtime(model_dir, provider, fallback, options)
    t0 = time.perf_counter()
    noise = "zero" if no_noise else noise_seed
    channels, samples, sr = codec.decode_to_file(codes, out, mode=mode, progress=True, noise=noise)
    click.echo(f"{codes_in} -> {channels} ch x {samples} samples @ {sr} Hz in "
               f"{time.perf_counter() - t0:.2f} s on {codec.provider}")
    click.echo(f"wrote {out}")


@run_cli.command("info")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print everything as one JSON object.")
@verbose_option
@guard
def info_cmd(target, as_json, verbose) -> None:
    """Show what an exported folder or .onnx/.ort file holds (from its metadata), each graph of a
    folder checked as loading it would, without running one."""
    from ..errors import ModelFileError
    from ..runtime.folder import read_manifest
    from ..runtime.graph import graph_files, read_graph

    setup_logging(verbose)
    if target.is_dir():
        files, manifest = graph_files(target), read_manifest(target)
        if not files:
            raise ModelFileError(f"{target}: no .onnx or .ort files here; run codec-export first")
        # Read, not opened: the metadata and shapes of an .onnx file come from its protobuf.
        graphs = registry.codec_of_folder(target).runtime(target, sessions=False).read_graphs(files)
    else:
        manifest, graphs = None, [read_graph(target)]
    if as_json:
        click.echo(json.dumps({"path": str(target), "manifest": manifest,
                               "graphs": {str(g.path): g.meta for g in graphs}}, indent=2))
        return
    first = graphs[0]
    # Read through the checked accessors: a damaged value is one error line, not a crash.
    rate = first.int("sample_rate") / first.int("frame_size") if "frame_size" in first.meta else None
    click.echo(f"{target}: {first.meta.get('codec')} {first.meta.get('preset')}, "
               f"{first.int('sample_rate')} Hz"
               + (f" (encodes {first.int('input_rate')} Hz)" if "input_rate" in first.meta else "")
               + (f", {rate:g} frames/s" if rate else "")
               + f", {first.int('n_codebooks')} codebooks of {first.int('codebook_size')}, quantizer "
               f"{first.meta.get('quantizer')}, export {first.meta.get('export_id')}")
    for g in graphs:
        size = f"{g.meta.get('samples')} samples <-> {g.meta.get('frames')} frames"
        extra = "".join(f", {k} {g.meta[k]}" for k in ("target", "precision") if k in g.meta)
        click.echo(f"  {g.path}: {g.meta.get('role')} {g.meta.get('mode')}, {size}{extra}")


run_cli.add_command(tokenize_cmd)
run_cli.add_command(web_cmd)
