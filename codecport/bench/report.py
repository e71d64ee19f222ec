"""codec-bench's report: the table it prints, the speedups between contenders, the codes of the
contenders compared with ours, and the plot."""

from __future__ import annotations

from pathlib import Path

from ..atomic import atomic_path

DIRECTIONS = ("encode", "decode", "encode-long", "decode-long")


def directions(result: dict) -> list[str]:
    return [d for d in DIRECTIONS if d in result]


def speedups(results: dict, ours: str) -> dict:
    """How many times faster `ours` is than every other contender that ran, per direction."""
    out = {}
    for name, r in results.items():
        if name == ours or "skipped" in r or "deviation" in r:  # builds: against our fp32 below
            continue
        sp = {d: r[d]["seconds_median"] / results[ours][d]["seconds_median"]
              for d in directions(r) if d in results[ours]}
        if "streaming" in r and "streaming" in results[ours]:
            for d in ("encode_step", "decode_step"):
                if d in r["streaming"] and d in results[ours]["streaming"]:
                    sp[f"{d} p95"] = r["streaming"][d]["p95_ms"] / results[ours]["streaming"][d]["p95_ms"]
        out[f"{ours} vs {name}"] = sp
    return out


def code_agreement(contenders: dict, ours: str | None) -> None:
    """Codes of the contenders on the bench's weights, compared with our fp32 graphs' codes.

    The codes themselves leave the report. transformers builds its own random weights, so it
    has none to compare; our lower precisions report their deviation instead.
    """
    import numpy as np

    codes = {n: np.asarray(r.pop("codes")) for n, r in contenders.items() if "codes" in r}
    if ours not in codes:
        return
    for name, c in codes.items():
        if name == ours or "deviation" in contenders[name]:
            continue
        want = codes[ours]
        # Over the frames both have; a differing count is printed beside the share.
        k, t = min(c.shape[-2], want.shape[-2]), min(c.shape[-1], want.shape[-1])
        contenders[name]["codes_equal_pct"] = {
            "to": ours, "pct": float((c[..., :k, :t] == want[..., :k, :t]).mean() * 100),
            "frames": [int(c.shape[-1]), int(want.shape[-1])]}


def table(report: dict) -> list[str]:
    peak = report["gemm_peak"]["gflops"]
    w = max(16, 2 + max(map(len, report["contenders"]), default=0))  # the contender column
    lines = [(f"{report['codec']} {report['preset']}: {report['seconds']:g} s of audio, "
             f"{report['runs']} runs after a warm-up"
             + (f", in each of {report['rounds']} rounds taken in turn" if report["rounds"] > 1 else "")
             + f"; fp32 GEMM peak {peak:.0f} GFLOP/s "
             f"({report['gemm_peak']['library']})"),
             (f"{'contender':<{w}}{'direction':<12}{'RTF med':>7}{'min':>8}{'max':>8}{'GFLOP/s':>9}"
             f"{'of peak':>9}{'peak RSS':>10}")]
    for name, r in report["contenders"].items():
        if "skipped" in r:
            lines.append(f"{name:<{w}}skipped: {r['skipped']}")
            continue
        for d in directions(r):
            s = r[d]
            rate = report["flops"][d] / s["seconds_median"] / 1e9
            lines.append(f"{name:<{w}}{d:<12}{s['rtf_median']:>7.3f}{s['rtf_min']:>8.3f}"
                         f"{s['rtf_max']:>8.3f}{rate:>9.0f}{rate / peak:>9.0%}"
                         f"{r['peak_rss_mb']:>8.0f}MB")
    for name, r in report["contenders"].items():
        for graph, d in r.get("deviation", {}).items():
            what = []
            if "code_agreement_pct" in d:
                what.append(f"codes {d['code_agreement_pct']:.1f}% equal (first codebook "
                            f"{d['first_codebook_agreement_pct']:.1f}%)")
            what.append(f"audio SNR {d['snr_db']:.1f} dB")
            lines.append(f"{name} {graph} deviation from fp32: {', '.join(what)}, "
                         f"{d['size_bytes'] / 1e6:.0f} MB (fp32 {d['fp32_size_bytes'] / 1e6:.0f} MB)")
    if "long" in report:
        lines.append(f"-long: {report['long']['windows']} windows ({report['long']['seconds']:g} s of audio) "
                     f"{report['long'].get('through', 'through the chunked graphs')}; ours run "
                     + ", ".join(f"{r['windows_at_once']} at once ({n})"
                                 for n, r in report["contenders"].items() if "windows_at_once" in r)
                     + (f"; torch {report['long'].get('torch', 'one after another')}"
                        if "encode-long" in report["contenders"].get("torch-eager", {}) else ""))
    for name, r in report["contenders"].items():
        if "codes_equal_pct" in r:
            eq = r["codes_equal_pct"]
            lines.append(f"{name} codes: {eq['pct']:.1f}% equal to {eq['to']}'s on the same weights"
                         + ("" if eq["frames"][0] == eq["frames"][1]
                            else f" ({eq['frames'][0]} against {eq['frames'][1]} frames)"))
    for name, r in report["contenders"].items():
        if "parts" in r:
            lines.append(f"{name} time in: " + ", ".join(
                f"{label} {p['ms']:.1f} ms a call ({p['share_pct']:.0f}% of the {p['graph']})"
                for label, p in r["parts"].items() if p["ms"] > 0))  # a part this model has not: 0
    for pair, sp in report["speedups"].items():
        lines.append(f"{pair}: " + ", ".join(f"{d} {x:.2f}x" for d, x in sp.items()) + " faster")
    first: dict[str, dict] = {}
    for m in report.get("memory", []):
        d = m.get("direction", "decode")
        ref = first.setdefault(d, m)
        what = "of a 44.1 kHz stereo WAV" if d == "encode" else f"({m['output_mb']:.0f} MB of audio written)"
        what += "" if d == "encode" else f" from {m['from']}"
        ratio = (f" ({m['peak_rss_mb'] / ref['peak_rss_mb']:.2f}x the {ref['minutes']:g} min run)"
                 if m is not ref else "")
        lines.append(f"codec-run {d} of {m['minutes']:g} min {what}: peak RSS {m['peak_rss_mb']:.0f} MB"
                     f"{ratio}, {m['seconds']:.1f} s")
    for name, r in report["contenders"].items():
        for key in [k for k in r if k.startswith("streaming")]:
            st, how = r[key], key.removeprefix("streaming")
            for d in [d for d in ("encode_step", "decode_step") if d in st]:
                p = st[d]
                f = st["frames_per_step"]
                line = (f"{name} streaming{how} {d} ({f} × {st['frame_ms']:g} ms "
                        f"frame{'s' if f > 1 else ''} a step, "
                        f"{st['steps']} steps): p50 {p['p50_ms']:.1f} ms, p95 {p['p95_ms']:.1f} ms, "
                        f"p99 {p['p99_ms']:.1f} ms")
                if f > 1:  # the weights are read once a step, so the cost of a frame falls
                    line += f"; per frame p50 {p['p50_ms'] / f:.1f} ms, p95 {p['p95_ms'] / f:.1f} ms"
                if len(p.get("round_p50_ms", ())) > 1:
                    line += "; p50 by round " + " / ".join(f"{x:.1f}" for x in p["round_p50_ms"]) + " ms"
                if "first_audio_ms" in st and d == "decode_step":
                    line += f"; first audio {st['first_audio_ms']:.1f} ms after a new stream's first push"
                if "latency_frames" in st:
                    line += (f"; audio final {st['latency_frames']:g} frames "
                             f"({st['latency_frames'] * st['frame_ms']:.0f} ms) after its frame")
                lines.append(line)
    return lines


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ran = {n: r for n, r in report["contenders"].items() if "skipped" not in r}
    dirs = [d for d in DIRECTIONS if any(d in r for r in ran.values())]
    fig, ax = plt.subplots(figsize=(3.5 * len(dirs), 3.5))
    width = 0.8 / max(1, len(ran))
    for i, (name, r) in enumerate(ran.items()):
        ax.bar([j + i * width for j, d in enumerate(dirs) if d in r],
               [r[d]["rtf_median"] for d in dirs if d in r], width, label=name)
    ax.set_xticks([j + width * (len(ran) - 1) / 2 for j in range(len(dirs))], dirs)
    ax.set_ylabel("real-time factor (lower is faster)")
    ax.set_title(f"{report['codec']} {report['preset']}, {report['seconds']:g} s, "
                 f"{report['machine']['cpus']} CPUs")
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
