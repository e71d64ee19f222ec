"""`codec-export`: one command per registered codec (its presets and its own options come from its
declaration in the registry), and `codec-export check`. Needs the [export] extra to run; its
`--help` needs neither torch nor onnx."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import click

from .. import registry
from ..atomic import atomic_path
from ..errors import CodecportError
from ..export.targets import PRECISIONS, TARGETS
from ..frontend import INT_MAX, SEED_MAX, Group, guard, setup_logging, unwinds_on_sigterm
from ..version import __version__
from .common import note, verbose_option


@click.group(cls=Group, context_settings={"show_default": True})
@click.version_option(__version__, prog_name="codec-export")
def export_cli() -> None:
    """Export a codec to fixed-length ONNX graphs, validated against torch."""


def _export_params(spec) -> list[click.Parameter]:
    """Options of `codec-export CODEC`: those every codec takes, then the codec's own."""
    presets = list(spec.presets)
    common = [
        click.Option(["--preset"], type=click.Choice(presets), default=None,
                     help=f"Model preset [default: {spec.default_preset}, or what the checkpoint's "
                          "config matches]; a checkpoint's own config wins when it carries one."),
        click.Option(["--variant", "preset_alias"], type=click.Choice(presets), default=None, hidden=True),
        click.Option(["--len", "length"], type=click.IntRange(1, INT_MAX), default=None,
                     help="The fixed-length graphs hold a clip of this many samples, at the rate the "
                          "codec decodes to, in one call (a length off the frame is zero-padded inside "
                          "the graph, as the official model pads)."),
        click.Option(["--weights"], default=None,
                     help="Released name (" + ", ".join(spec.releases) + "), a checkpoint file or "
                          "folder, or a URL [default: the preset's release]."),
        click.Option(["--revision"], default=None,
                     help="Revision (branch, tag or commit) of weights fetched from Hugging Face."),
        click.Option(["--random-init"], is_flag=True, help="Seeded random weights instead of a "
                     "checkpoint (for trying the pipeline; the audio is noise)."),
        click.Option(["--seed"], type=click.IntRange(0, SEED_MAX), default=0, help="Seed for --random-init."),
        click.Option(["--in-graph-quantizer"], is_flag=True, help="Put the RVQ inside the graphs: "
                     "the encoder outputs codes, the decoder takes them."),
        click.Option(["--codebooks"], type=click.IntRange(1, INT_MAX), default=None,
                     help="With --in-graph-quantizer: codebooks in the graphs [default: all]."),
        click.Option(["--batch"], type=click.IntRange(2, INT_MAX), default=None,
                     help="Also write the encoders with batch dimension B (encoder_bB.onnx...), "
                          "for codec-run tokenize; each row is checked against the batch-1 graph."),
        click.Option(["-o", "--out", "out_dir"], type=click.Path(path_type=Path), default=None,
                     help="Output folder, replaced whole when it holds an earlier export "
                          "[default: CODEC-PRESET-LEN]."),
        click.Option(["--target"], type=click.Choice(list(TARGETS)), default="cpu",
                     help="Where the graphs will run: nnapi/mobile carry the convs as 2-D and spell "
                          "the ops NNAPI lacks, mobile adds .ort files and a reduced-build operator "
                          "config, coreml adds .mlpackage files (coremltools), web puts the quantizer in "
                          "the graphs and their facts in the manifest for codecport.mjs."),
        click.Option(["--precision"], type=click.Choice(PRECISIONS), default="fp32",
                     help="fp16 (fp32 inputs/outputs) or int8 (static QDQ); the deviation from "
                          "fp32 is measured and written into each file and the manifest."),
        click.Option(["--calibration"], type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     multiple=True, help="Audio file(s) to calibrate int8 on (repeatable) "
                                         "[default: generated clips]."),
    ]
    own = []
    for o in spec.export_options:
        kind = click.Choice(o.type) if isinstance(o.type, tuple) else \
            click.IntRange(o.minimum, INT_MAX) if o.type is int else o.type
        own.append(click.Option([o.flag, o.dest], default=o.default, help=o.help, type=kind))
        own += [click.Option([alias, f"{o.dest}__{i}"], default=None, type=kind, hidden=True)
                for i, alias in enumerate(o.aliases)]
    verbose = click.Option(["-v", "--verbose"], is_flag=True, help="Log what happens; show tracebacks.")
    return [*common, *own, verbose]


def _known_config(spec, preset: str | None, weights: str | None, random_init: bool):
    """The config the export will have, where it is known before any weights are read (a preset,
    or a release named by --weights); None where a checkpoint brings its own."""
    if random_init or weights is None:
        return spec.presets.get(preset or spec.default_preset)
    return spec.presets.get(weights) if weights in spec.releases else None


def _own_options(spec, given: dict) -> dict:
    """The codec's own options by their current names, an older name's value taken where the
    current one was left at its default."""
    out = {}
    for o in spec.export_options:
        value = given.get(o.dest)
        for i in range(len(o.aliases)):
            old = given.get(f"{o.dest}__{i}")
            if old is not None and value == o.default:
                value = old
        out[o.dest] = value
    return out


def _export_command(spec) -> click.Command:
    return click.Command(
        spec.name, params=_export_params(spec), context_settings={"show_default": True},
        callback=guard(unwinds_on_sigterm(functools.partial(_export, spec))),
        help=f"Write {spec.label}'s graphs (fixed-length, and what any length needs), the RVQ "
             "arrays and a manifest, every graph validated against torch first.")


def _export(spec, *, preset, preset_alias, length, weights, revision, random_init, seed, in_graph_quantizer,
            codebooks, batch, out_dir, target, precision, calibration, verbose, **given) -> None:
    setup_logging(verbose)
    preset = preset or preset_alias
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
        from ..export import graph  # noqa: F401 (torch, onnx, onnxsim)
    except ImportError as e:
        raise CodecportError(f"exporting needs torch and onnx ({e}); pip install 'codecport[export]'") from e
    from ..export.batch import check_batch
    from ..export.builds import Build
    from ..export.graph import check_out_dir

    build = Build(target, precision, list(calibration) or None)
    build.check()  # before the (long) export, not after
    check_batch(batch, build)
    if out_dir is not None:  # refused now, not after a long trace (the default name is checked later)
        check_out_dir(out_dir)
    exporter = spec.module("export")
    if weights is not None and not weights.strip():  # ("" read as no --weights named a preset's release)
        raise click.UsageError("--weights is empty; pass a released name, a checkpoint file or folder, "
                               "or a URL")
    if length is None and getattr(exporter, "LEN_NEEDED", None):  # before any weights are fetched
        raise CodecportError(f"pass --len N: {exporter.LEN_NEEDED}")
    if hasattr(exporter, "check_options"):  # the codec's own options, also before any weights
        exporter.check_options(length, _own_options(spec, given),
                               _known_config(spec, preset, weights, random_init))
    models, presets = spec.module("model"), spec.presets
    t0 = time.perf_counter()
    if random_init:
        preset = preset or spec.default_preset
        note(f"using RANDOM weights (seed {seed}): the graphs are real, the audio is not")
        model = models.init_random(models.MODEL(presets[preset]), seed).eval()
        source, sha = f"random-init seed {seed} (NOT trained weights)", "none"
    else:
        source = weights or preset or spec.default_preset
        if weights is None and source not in spec.releases:
            raise click.UsageError(f"--preset {preset} has no released weights; pass --weights "
                                   "or --random-init")
        model, sha = spec.module("weights").load(source, preset=preset, revision=revision)
        # Label the graphs by what the weights are, not by a default the user never chose.
        preset = next((name for name, cfg in presets.items() if cfg == model.cfg), "custom")
    if out_dir is None:  # the default name, known now: refused before the trace, not after it
        out_dir = Path(f"{spec.name}-{preset}-{length or 'any'}")
        check_out_dir(out_dir)
    in_graph = (codebooks or model.cfg.n_codebooks) if in_graph_quantizer else None
    report = exporter.export(model, out_dir, length, options=_own_options(spec, given), preset=preset,
                             weights=source, weights_sha256=sha, in_graph_codebooks=in_graph, build=build,
                             batch=batch)
    click.echo(f"exported {spec.name} {preset} ({source}) in {time.perf_counter() - t0:.1f} s to {out_dir}/")
    for line in exporter.describe(report):
        click.echo(line)
    _print_validation(report)


def _print_validation(report: dict) -> None:
    fp32 = " (fp32, before the build)" if "deviation" in report else ""
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
                of = "audio" if "calls" not in d else ("latent" if "encoder" in name else "audio") + \
                    f" of {d['calls']} single calls"
                parts.append(f"{of} SNR {d['snr_db']:.1f} dB, max abs err {d['max_abs_err']:.2g}")
            parts.append(f"{d['size_bytes'] / 1e6:.1f} MB (fp32 {d['fp32_size_bytes'] / 1e6:.1f} MB)")
            click.echo(f"    {name + '.onnx':<22} {', '.join(parts)}")
    for file in report["files"].values():
        if not file.endswith(".onnx"):
            click.echo(f"  {file}")


for _spec in registry.codecs():
    export_cli.add_command(_export_command(_spec))


@export_cli.command("check")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None,
              help="Also write the report as JSON.")
@verbose_option
@guard
def check_cmd(target, json_out, verbose) -> None:
    """Per execution provider, whether each graph would run whole: CoreML (ML Program and
    NeuralNetwork) and NNAPI from ONNX Runtime's usability checker, DirectML from a rule table,
    the browser (wasm, WebGPU) from onnxruntime-web's kernel table."""
    setup_logging(verbose)
    from ..export.check import check

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
