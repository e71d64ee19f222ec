"""codec-bench's application benches end to end: `codec-bench tokenize` (the corpus tokenizer's
engines against the torch loop) and `codec-bench serve` (codec-serve under a load generator),
their reports complete (not their speed). Apart from test_bench.py so that the test processes
share the work evenly."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from test_bench import bench

pytestmark = pytest.mark.bench


def test_bench_tokenize_runs_every_local_contender_and_reports_ratios(tmp_path):
    """`codec-bench tokenize` end to end on the tiny DAC (its Ray contenders are the same command
    with --engine ray, which test_tokenize_ray runs)."""
    out = tmp_path / "tok.json"
    proc = bench("tokenize", "--codec", "dac", "--preset", "tiny", "--len", "0.1", "--batch", "2", "--clips", "3",
                 "--min-seconds", "0.1", "--max-seconds", "0.3", "--slices", "1", "--short-clips", "2", "--no-ray",
                 "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert set(report["results"]) == {"torch-loop", "local b1", "local b2"}
    for name, r in report["results"].items():
        assert r["audio_s_per_s"] > 0 and r["start_s"] > 0 and r["wall_s"] > 0
        assert ("per_file_ms" in r) == (name != "torch-loop")
        assert r["vs_torch_loop"] == r["audio_s_per_s"] / report["results"]["torch-loop"]["audio_s_per_s"]
    assert "local b2" in proc.stdout and "vs torch" in proc.stdout


def test_bench_serve_ramps_every_configuration_and_soaks(tmp_path):
    """`codec-bench serve` on the tiny SNAC (decoder-only clients; its frames are 1.5 ms, so the
    load is extreme and no count of streams is asserted), one configuration (each is the same
    code with other flags): its server starts, takes a trial, stops with exit 0; the bound is measured three times; the soak's well-behaved
    streams are checked against single streams and every slot is free after it."""
    out = tmp_path / "serve.json"
    args = ("serve", "snac", "--preset", "tiny", "--slots", "2", "--precision", "fp32", "--seconds", "0.5",
            "--max-streams", "1", "--soak", "0.08", "--dir", tmp_path / "w", "--json", out)
    # On a thread of its own: a browser test before this file may leave an event loop running on
    # the main thread, under which the command's asyncio.run would not start.
    with ThreadPoolExecutor(1) as pool:
        proc = pool.submit(bench, *args).result()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert set(report["configs"]) == {"B=2 fp32"}
    for c in report["configs"].values():
        assert c["exit_code"] == 0 and c["trials"] and 0 <= c["held"] <= 1
        for t in c["trials"].values():
            assert t["frames"] > 0 and (t["n_errors"] > 0 or t["latency_ms"]["p99"] >= t["latency_ms"]["p50"] > 0)
    assert len(report["bound"]["fp32"]) == 3 and all(b["streams"] > 0 for b in report["bound"]["fp32"])
    soak = report["soak"]
    assert soak["health_after"]["slots"]["active"] == 0 and soak["check"]["checked"] > 0
    assert soak["check"]["audio_max_abs_err"] <= 1e-4 and soak["check"]["codes_exact"] is None
    assert "B=2 fp32" in proc.stdout and "fixed-graph bound" in proc.stdout and "soak:" in proc.stdout
