"""What `--buckets` buys: a short clip through its bucket against the same clip through the main
graphs, in one process, the two interleaved call by call (this machine's speed drifts).

    python scripts/bench_buckets.py FOLDER --seconds 1 --runs 10

FOLDER is a NeuCodec or XCodec2 export with buckets; a copy of it without them (the main graphs
alone) is made in a temporary folder. Prints the median time of an encode and a decode call of
a clip of `--seconds` through each, and the ratios.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np

import codecport


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@click.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--seconds", type=float, default=1.0, help="Length of the clip (at the encoder's rate).")
@click.option("--runs", type=int, default=10, help="Calls of each, interleaved.")
def main(folder: Path, seconds: float, runs: int) -> None:
    bucketed = codecport.load(folder)
    if not bucketed.sizes:
        raise click.UsageError(f"{folder} holds no buckets; export it with --buckets")
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "main"
        shutil.copytree(folder, plain, ignore=shutil.ignore_patterns("*_f[0-9]*.onnx"))
        main_only = codecport.load(plain)
        rate = bucketed.input_rate
        x = (0.3 * np.random.default_rng(0).standard_normal((1, int(seconds * rate)))).astype(np.float32)
        codes = bucketed.encode(x, rate)
        np.testing.assert_array_equal(codes.data, main_only.encode(x, rate).data)
        graph = bucketed._bucket("encoder", codes.data.shape[-1])
        click.echo(f"{bucketed.label} {bucketed.preset}: a {seconds:g} s clip "
                   f"({codes.data.shape[-1]} frames) through "
                   f"{graph[0]} ({graph[1]} frames) against the main graphs ({bucketed.frames} frames)")
        times: dict[str, list[float]] = {k: [] for k in ("encode bucket", "encode main", "decode bucket",
                                                         "decode main")}
        main_only.decode(codes.data)
        bucketed.decode(codes.data)
        for _ in range(runs):
            times["encode bucket"].append(_timed(lambda: bucketed.encode(x, rate)))
            times["encode main"].append(_timed(lambda: main_only.encode(x, rate)))
            times["decode bucket"].append(_timed(lambda: bucketed.decode(codes.data)))
            times["decode main"].append(_timed(lambda: main_only.decode(codes.data)))
        med = {k: statistics.median(v) for k, v in times.items()}
        for side in ("encode", "decode"):
            ratios = [m / b for b, m in zip(times[f"{side} bucket"], times[f"{side} main"])]
            click.echo(f"{side}: bucket {med[f'{side} bucket'] * 1000:.0f} ms, "
                       f"main {med[f'{side} main'] * 1000:.0f} ms "
                       f"(medians of {runs}); main / bucket {statistics.median(ratios):.2f}x "
                       f"(min {min(ratios):.2f}, max {max(ratios):.2f}, call by call)")


if __name__ == "__main__":
    sys.exit(main())
