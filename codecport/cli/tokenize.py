"""`codec-run tokenize`: the corpus tokenizer's command (the tokenizer is codecport/tokenize/)."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import CodecportError
from ..frontend import INT_MAX, guard, setup_logging, unwinds_on_sigterm
from ..tokenize.driver import ENGINES
from ..tokenize.output import ERRORS
from .common import codebooks_help, note, provider_options, verbose_option


@click.command("tokenize")
@click.argument("inputs", nargs=-1, required=True)
@click.option("-m", "--model", "model_dir", type=click.Path(path_type=Path), required=True,
              help="Folder written by codec-export (with --batch B for batched graphs).")
@click.option("-o", "--out", "out_dir", type=click.Path(path_type=Path), required=True,
              help="Output folder: a Parquet dataset, one row per input; rerun to resume.")
@click.option("--engine", type=click.Choice(ENGINES), default="local",
              help="local: worker processes on this machine; ray: Ray Data (pip install "
                   "'codecport[ray]'), a private local cluster or --address.")
@click.option("--address", default=None, help="Ray cluster to attach to [default: RAY_ADDRESS, "
                                              "else a private local cluster].")
@click.option("--workers", type=click.IntRange(1, 1024), default=None,
              help="Worker processes (local) or actors (ray) [default: one per core; on a Ray "
                   "cluster its CPUs less one].")
@click.option("--batch", type=click.IntRange(1, INT_MAX), default=None,
              help="Rows per call of the batched encoders [default: the folder's, else 1].")
@click.option("--codebooks", type=click.IntRange(1, INT_MAX), default=None,
              help=codebooks_help("Use the first K codebooks"))
@click.option("--shard-rows", type=click.IntRange(1, INT_MAX), default=1000,
              help="Rows per Parquet shard (a shard is also written every minute when rows come slower).")
@provider_options
@verbose_option
@guard
@unwinds_on_sigterm
def tokenize_cmd(inputs, model_dir, out_dir, engine, address, workers, batch, codebooks, shard_rows,
                 provider, fallback, options, verbose) -> None:
    """Tokenize a corpus: audio files, folders, globs, manifests (.txt, .csv, .jsonl, .parquet
    with a path column) or Hugging Face Parquet datasets, into a resumable Parquet dataset.
    A file's id is its path under the folder that holds every input (`corpus/` gives
    `spk1/a.wav`; `train/ test/` give `train/a.wav`, `test/a.wav`); manifests keep their ids."""
    from ..tokenize import tokenize

    setup_logging(verbose)
    summary = tokenize(list(inputs), model_dir, out_dir, engine=engine, address=address, workers=workers,
                       batch=batch, codebooks=codebooks, provider=provider, fallback=fallback,
                       options=options, shard_rows=shard_rows, progress=True)
    for ident, error in summary.errors[:5]:
        note(f"failed: {ident}: {error}")
    if summary.failed > 5:
        note(f"... and {summary.failed - 5} more: see {out_dir / ERRORS}")
    click.echo(summary.line())
    if summary.failed and not summary.done:
        # Not one input could be tokenized: a systematic cause (the wrong files, a format this
        # build cannot read), which a script must see in the exit status, not in a table.
        first = f", as {summary.errors[0][0]}: {summary.errors[0][1]}" if summary.errors else ""
        raise CodecportError(f"every input this run tried failed ({summary.failed}){first}; "
                             f"see {out_dir / ERRORS}")
    click.echo(f"wrote {out_dir}/")
