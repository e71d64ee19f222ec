"""codec-bench's application benches end to end: `codec-bench tokenize` (the corpus tokenizer's
engines against the torch loop) and `codec-bench serve` (codec-serve under a load generator),
their reports complete (not their speed). Apart from test_bench.py so that the test processes
share the work evenly."""

from __future__ import annotations

import json
import re
import time

import pytest
from test_bench import bench

pytestmark = pytest.mark.bench


def test_bench_tokenize_runs_every_local_contender_and_reports_ratios(tmp_path):
    """`codec-bench tokenize` end to end on the tiny Mimi (batched encoders, so a local bB; and
    no loudness meter, whose scipy import costs each of DAC's workers seconds), one clip a corpus
    (the start, corpus and short-clip runs are the same code at any count; one clip is one worker
    a run). Its Ray contenders are the same command with --engine ray, which test_ray
    runs."""
    out = tmp_path / "tok.json"
    t0 = time.perf_counter()
    proc = bench("tokenize", "--codec", "mimi", "--preset", "tiny", "--len", "0.1", "--batch", "2",
                 "--clips", "1", "--min-seconds", "0.1", "--max-seconds", "0.3", "--slices", "1",
                 "--short-clips", "1", "--no-ray", "--json", out)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["clips"] == 1 and report["slices"] == 1 and 0.1 <= report["audio_s"] <= 0.3
    results = report["results"]
    assert set(results) == {"torch-loop", "local b1", "local b2"}
    # Each time is a run of a process the command made, one after another: every one of them
    # and all of them together within the command's own time (a unit or a run counted twice
    # would break it).
    times = [r[k] for r in results.values() for k in ("start_s", "wall_s", "many_wall_s") if k in r]
    assert len(times) == 3 + 3 + 2 and min(times) > 0 and sum(times) < elapsed, (times, elapsed)
    for name, r in results.items():
        assert ("per_file_ms" in r) == (name != "torch-loop") and r["audio_s_per_s"] > 0
        if name != "torch-loop":  # beyond the start, at most the short clip's run less the start
            assert 0 <= r["per_file_ms"] <= 1000 * max(0.0, r["many_wall_s"] - r["start_s"]) + 1e-9, r
    # The ratios: each contender against itself is 1, and a faster one reads above 1 (a ratio
    # the wrong way up reads below).
    assert results["torch-loop"]["vs_torch_loop"] == 1.0
    assert results["local b1"]["vs_local_same_batch"] == results["local b2"]["vs_local_same_batch"] == 1.0
    base, local = results["torch-loop"]["audio_s_per_s"], results["local b1"]["audio_s_per_s"]
    for name, r in results.items():
        assert (r["vs_torch_loop"] > 1) == (r["audio_s_per_s"] > base), (name, r)
        if name == "torch-loop":
            assert (r["vs_local_same_batch"] > 1) == (r["audio_s_per_s"] > local), r
    # The table says what the report says (to its rounding).
    rows = {line[:14].strip(): line[14:].split() for line in proc.stdout.splitlines()
            if line.startswith(tuple(results))}
    assert set(rows) == set(results), proc.stdout
    for name, (rate, vs_torch, vs_local, start, per) in rows.items():
        r = results[name]
        assert float(rate) == pytest.approx(r["audio_s_per_s"], abs=0.051), (name, rate)
        assert float(vs_torch.rstrip("x")) == pytest.approx(r["vs_torch_loop"], abs=0.0051), (name, vs_torch)
        assert float(vs_local.rstrip("x")) == pytest.approx(r["vs_local_same_batch"], abs=0.0051), name
        assert float(start) == pytest.approx(r["start_s"], abs=0.051), (name, start)
        if name == "torch-loop":
            assert per == "-", per
        else:
            assert float(per) == pytest.approx(r["per_file_ms"], abs=0.051), (name, per)


def test_per_file_cost_is_what_a_file_costs_beyond_the_start_and_its_audio():
    """On an engine that takes 4 s to start, 250 ms a file and 70 ms a second of audio: the
    docs' corpus (200 clips, 0.54 h, 2 slices; 40 short clips) reads about 250 ms a file, and a
    corpus of one short clip, nearly all start, reads 0 (it read -4285 ms: the corpus's rate
    counted the start as audio)."""
    from codecport.bench.tokenize import ONE_S, SHORT_S, per_file_ms

    def wall(runs, files, audio):
        return runs * 4.0 + files * 0.25 + audio * 0.07

    start = wall(1, 1, ONE_S)
    big = per_file_ms(start, wall(1, 40, 40 * SHORT_S), 40, wall(2, 200, 1944.0), 2, 1944.0)
    assert 225 < big < 275
    assert per_file_ms(start, wall(1, 1, SHORT_S), 1, wall(1, 1, 0.2), 1, 0.2) == 0


def test_bench_serve_ramps_every_configuration_and_soaks(tmp_path):
    """`codec-bench serve` on the tiny SNAC (decoder-only clients; its frames are 1.5 ms, so the
    load is extreme and no count of streams is asserted), two configurations, their servers
    started at once: each starts, takes a trial, stops with exit 0; the bound is
    measured three times (on fixed graphs of 0.1 s); the soak's well-behaved streams (no longer
    than the soak) are checked against single streams and every slot is free after it."""
    out = tmp_path / "serve.json"
    proc = bench("serve", "snac", "--preset", "tiny", "--slots", "1", "--slots", "2", "--precision", "fp32",
                 "--seconds", "0.2", "--len", "0.1", "--max-streams", "1", "--soak", "0.01",
                 "--dir", tmp_path / "w", "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    # The tiny SNAC's coarse frame: 4 latent frames of 2 * 3 samples at 16 kHz, 1.5 ms; a trial
    # of 0.2 s is 133 of them (its unit, lcm(4, the attention window 4), is one frame).
    assert report["period_ms"] == pytest.approx(1.5)
    assert set(report["configs"]) == {"B=1 fp32", "B=2 fp32"}
    for c in report["configs"].values():
        assert c["exit_code"] == 0 and set(c["trials"]) == {"1"}  # the ramp ends at --max-streams
        t = c["trials"]["1"]
        # One well-behaved client: an error is the server's.
        assert t["streams"] == 1 and t["frames"] == 133 and t["n_errors"] == 0, t
        lat = t["latency_ms"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] and t["budget_ms"] == pytest.approx(1.5), t
        # Its one trial held or not (the load is extreme): it holds 1 stream, capped, or none.
        assert c["held"] == int(t["held"]) and c["capped"] == t["held"], c
    # The bound: measured at the start, the middle and the end, and the table says so.
    bound = report["bound"]["fp32"]
    assert len(bound) == 3 and all(b["rtf"] > 0 and b["streams"] > 0 for b in bound)
    printed = re.search(r"fixed-graph bound \(fp32\): [\d.]+ streams \(RTF ([\d., ]+) at", proc.stdout)
    assert printed and printed.group(1).split(", ") == [f"{b['rtf']:.3f}" for b in bound], proc.stdout
    soak = report["soak"]
    assert soak["health_after"]["slots"]["active"] == 0 and soak["check"]["checked"] > 0
    assert soak["check"]["audio_max_abs_err"] <= 1e-4 and soak["check"]["codes_exact"] is None
    assert "B=2 fp32" in proc.stdout and "soak:" in proc.stdout


def test_frame_latency_counts_the_servers_delay_for_steps_and_for_windows():
    """A frame's latency runs from sending the frame that made its audio final to the arrival of
    that audio. Steps: frame i makes final the audio up to the stated latency before it. Windows
    (8 frames from every 6th, 7 frames of latency): only a window's last frame makes audio final,
    the window's up to its overlap; the frames before it wait for input, not for the server."""
    from codecport.bench.load import Stream

    frame = 10
    sent = [float(i) for i in range(20)]
    steps = Stream(sent=sent, frame=frame, lookahead=2 * frame,
                   arrivals=[((i - 1) * frame, i + 0.25) for i in range(2, 20)])  # 0.25 s a step
    assert steps.latencies() == [0.25] * 18  # frames 2..19 (0 and 1 make nothing final)
    # Windows: audio of frames 0..5 out 0.5 s after frame 7 is sent, 6..11 after 13, 12..17 after 19.
    windows = Stream(sent=sent, frame=frame, lookahead=7 * frame, window_step=6,
                     arrivals=[(6 * frame, 7.5), (12 * frame, 13.5), (18 * frame, 19.5)])
    assert windows.latencies() == [0.5, 0.5, 0.5]
    assert windows.latencies(skip=8) == [0.5, 0.5]


def test_bench_serve_batches_only_codecs_with_step_graphs():
    from click.testing import CliRunner

    from codecport.bench.cli import main

    r = CliRunner().invoke(main, ["serve", "neucodec", "--slots", "1", "--slots", "8"])
    assert r.exit_code == 2 and "NeuCodec has no step graphs" in r.stderr and \
        "--slots 1" in r.stderr, r.stderr
    r = CliRunner().invoke(main, ["serve", "dac"])
    assert r.exit_code == 2 and "'dac' is not one of" in r.stderr, r.stderr
