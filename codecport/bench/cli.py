"""codec-bench: speed, efficiency and memory of our graphs against the torch implementations and
the official packages (`codec-bench CODEC`, run.py), corpus tokenizing (`codec-bench tokenize`)
and the browser (`codec-bench web`).

Each contender runs in its own process (`codecport.bench.worker`), one after another, so the
timings and the peak RSS are its own. Needs the [export] extra (the model is exported first).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import click

from .. import registry
from ..export.targets import PRECISIONS
from ..frontend import Finite, Group, guard, unwinds_on_sigterm
from ..runtime.providers import PROVIDERS
from .facts import facts_of
from .measure import run_report
from .prepare import fail as _fail
from .prepare import preset_of
from .report import plot as plot_report
from .report import table
from .serve import serve_cmd
from .tokenize import tokenize_cmd
from .web import web_cmd


def codec_cmd(codec, preset, variant, seconds, runs, rounds, providers, precisions, steps, frames,
              long_windows, contenders, official_python, minutes, peak_seconds, work, json_out,
              plot) -> None:
    """Benchmark CODEC: our ONNX graphs vs the torch implementations, one process each."""
    if plot and importlib.util.find_spec("matplotlib") is None:  # before torch's seconds of import
        _fail("--plot needs matplotlib; pip install 'codecport[bench]'", 1)
    from .run import Options, bench

    try:
        import onnx  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        _fail(f"codec-bench needs the [export] extra ({e}); pip install 'codecport[export]'", 1)
    spec = registry.get(codec)
    facts = facts_of(spec)
    if frames != 1 and not spec.has_step_graphs:
        with_steps = [c.name for c in registry.codecs() if c.has_step_graphs]
        _fail(f"--frames is for codecs with step graphs ({', '.join(with_steps)}); {codec} has none")
    if official_python and not (facts.official and facts.official.script):
        own = [c.name for c in registry.codecs() if facts_of(c).official and facts_of(c).official.script]
        _fail(f"--official-python is for {', '.join(own)}; {codec}'s official package runs in the bench's "
              "own environment")
    preset = preset_of(spec, preset, variant)
    options = Options(preset, seconds, runs, rounds, tuple(providers), tuple(precisions), steps, frames,
                      long_windows, tuple(contenders), tuple(minutes), official_python, peak_seconds)
    report = run_report(work, "codec-bench-", lambda w: bench(spec, options, w), table, json_out)
    if plot:
        plot_report(report, plot)
        click.echo(f"wrote {plot}")


_OPTIONS = [
    click.Option(["--preset"], default=None, help="Preset [default: the codec's default: " + ", ".join(
        f"{s.default_preset} for {s.name}" for s in registry.codecs()) + "]."),
    click.Option(["--variant"], default=None, hidden=True),
    click.Option(["--seconds"], type=Finite(min=0.01, max=3600), default=5.0,
                 help="Audio per encode/decode call."),
    click.Option(["--runs"], type=click.IntRange(min=1), default=3, help="Timed runs after one warm-up."),
    click.Option(["--rounds"], type=click.IntRange(min=1), default=1,
                 help="Run every contender this many times, taking turns, and pool their runs: a slow "
                      "spell of the machine then falls on all of them."),
    click.Option(["--provider", "providers"], multiple=True, default=["cpu"],
                 type=click.Choice(list(PROVIDERS)), help="Our graphs on these (repeatable)."),
    click.Option(["--precision", "precisions"], multiple=True, default=["fp32"],
                 type=click.Choice(PRECISIONS),
                 help="Our graphs in these precisions (repeatable); fp16/int8 are built from the fp32 "
                      "export and their measured deviation is reported next to their speed."),
    click.Option(["--steps"], type=click.IntRange(min=1), default=50, help="Streaming steps timed."),
    click.Option(["--frames"], type=click.IntRange(min=1), default=1,
                 help="Codecs with step graphs: code frames (coarse frames for SNAC) per call of the step "
                      "graphs (codec-export --step-frames). A step reads all the weights once, so more "
                      "frames cost less per frame, at that many frames of latency."),
    click.Option(["--long", "long_windows"], type=click.IntRange(min=0), default=4,
                 help="Codecs with a long-audio path (DAC's chunked graphs, SNAC's overlapping windows): "
                      "also time audio of this many windows, as codec-run slides them (our runtime "
                      "runs windows at once, see the `parallel` option), against the same windows "
                      "through torch; 0 for none."),
    click.Option(["--contender", "contenders"], multiple=True,
                 default=["torch", "transformers", "official",
                          *sorted({c for s in registry.codecs() for c in facts_of(s).contenders}
                                  - {"official"})],
                 help="Others to compare with (repeatable): torch, transformers, official (each codec's "
                      "official package), and a codec's own (" + ", ".join(
                          f"{c} for {s.name}" for s in registry.codecs() for c in facts_of(s).contenders
                          if c != "official") + ")."),
    click.Option(["--official-python"], type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 default=None,
                 help="For a codec whose official package cannot share codecport's environment (" + ", ".join(
                     f"{s.name}: {facts_of(s).official.label}" for s in registry.codecs()
                     if facts_of(s).official and facts_of(s).official.script)
                      + "): the Python of an environment where it is installed, for `--contender official`."),
    click.Option(["--memory", "minutes"], multiple=True, type=Finite(min=0.01, max=600),
                 help="Also run `codec-run encode` on a 44.1 kHz stereo WAV and `codec-run decode` on "
                      "codes this many minutes long, and report their peak RSS (repeatable, e.g. "
                      "--memory 0.5 --memory 10: each later length is compared with the first)."),
    click.Option(["--peak-seconds"], type=Finite(min=0.01, max=60), default=1.5,
                 help="Seconds spent measuring this machine's fp32 GEMM peak, for each of three "
                      "matrix sizes."),
    click.Option(["--dir", "work"], type=click.Path(path_type=Path), default=None,
                 help="Keep the exported model here and reuse it on the next run [default: a temp folder]."),
    click.Option(["--json", "json_out"], type=click.Path(path_type=Path), default=None,
                 help="Write the report."),
    click.Option(["--plot"], type=click.Path(path_type=Path), default=None,
                 help="Bar chart PNG (matplotlib)."),
]

main = Group("codec-bench", context_settings={"show_default": True},
                   help="Benchmark a codec (our graphs against torch and the official packages), "
                        "corpus tokenizing (`codec-bench tokenize`), the browser (`codec-bench web`), or "
                        "the streams a server holds (`codec-bench serve`).")
for _spec in registry.codecs():
    main.add_command(click.Command(
        _spec.name, params=_OPTIONS,
        callback=guard(unwinds_on_sigterm(functools.partial(codec_cmd, _spec.name))),
        context_settings={"show_default": True},
        help=f"Benchmark {_spec.label}: our ONNX graphs vs the torch implementations, one process each."))
main.add_command(tokenize_cmd)
main.add_command(web_cmd)
main.add_command(serve_cmd)


if __name__ == "__main__":
    main()
