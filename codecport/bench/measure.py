"""What codec-bench measures: timings, FLOPs counted from a graph, this machine's GEMM peak, RSS."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def clip(n: int, sample_rate: int = 24000, seed: int = 0) -> np.ndarray:
    """The bench's audio, `[1, n]` float32 in [-1, 1]: tones with moving pitch under an envelope,
    plus noise, the same for every contender. Something with structure at every scale, so no
    codebook sees only silence."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / sample_rate
    out = np.zeros(n)
    for f0 in (110.0, 440.0, 1760.0):
        f = f0 * (1 + 0.3 * np.sin(2 * np.pi * rng.uniform(0.1, 0.5) * t))
        out += np.sin(2 * np.pi * np.cumsum(f) / sample_rate) * (0.5 + 0.5 * np.sin(2 * np.pi * 0.7 * t + f0))
    out = out / 3 * (0.6 + 0.4 * np.sin(2 * np.pi * 0.25 * t)) + 0.05 * rng.standard_normal(n)
    return (0.9 * out / max(float(np.max(np.abs(out))), 1e-9))[None].astype(np.float32)


def agreement(ref: np.ndarray, got: np.ndarray) -> dict:
    """Share of codes `got` has equal to `ref` (all codebooks, and the first), in percent."""
    if ref.shape != got.shape:
        return {"code_agreement_pct": 0.0, "first_codebook_pct": 0.0,
                "shape_mismatch": [list(ref.shape), list(got.shape)]}
    ref, got = ref.reshape(-1, *ref.shape[-2:]), got.reshape(-1, *got.shape[-2:])
    return {"code_agreement_pct": round(100 * float(np.mean(ref == got)), 3),
            "first_codebook_pct": round(100 * float(np.mean(ref[:, 0] == got[:, 0])), 3)}


def closeness(ref: np.ndarray, got: np.ndarray) -> dict:
    """SNR of `got` against `ref` (None when identical: JSON has no infinity) and max abs error."""
    if ref.shape != got.shape:
        return {"snr_db": None, "max_abs_err": None, "shape_mismatch": [list(ref.shape), list(got.shape)]}
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    err = float(np.sum((got - ref) ** 2))
    snr = None if err == 0 else round(float(10 * np.log10(max(float(np.sum(ref ** 2)), 1e-30) / err)), 2)
    return {"snr_db": snr, "max_abs_err": float(np.max(np.abs(got - ref))), "identical": err == 0}


def timings(fn: Callable[[], object], runs: int, warmup: int = 1) -> list[float]:
    """Seconds per call of `fn`, `runs` times after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def timed(fn: Callable[[], object], runs: int) -> tuple[object, list[float]]:
    """What a first call of `fn` gives (the result a contender reports, and the warm-up of its
    timings), and the seconds of `runs` calls after it."""
    first = fn()
    return first, timings(fn, runs, warmup=0)


def summary(seconds: list[float], audio_seconds: float) -> dict:
    """Real-time factor (compute seconds per audio second): median, min, max; with the timings
    themselves, so the runs of several rounds can be pooled (`pool`)."""
    rtf = np.array(seconds) / audio_seconds
    return {"rtf_median": float(np.median(rtf)), "rtf_min": float(rtf.min()),
            "rtf_max": float(rtf.max()), "seconds_median": float(np.median(seconds)),
            "audio_seconds": audio_seconds, "seconds": [float(x) for x in seconds]}


WARMUP_STEPS = 5  # streaming steps run before the timed ones: the first warm the sessions up


def percentiles(seconds: list[float]) -> dict:
    ms = np.array(seconds) * 1e3
    return {**{f"p{p}_ms": float(np.percentile(ms, p)) for p in (50, 95, 99)},
            "seconds": [float(x) for x in seconds]}


def pool(results: list[dict]) -> dict:
    """One contender's results from several rounds as one: timings pooled and summarised again,
    peak RSS the highest, anything else as the first round had it. Each round's own median is
    kept beside the pooled figures (`round_rtf_medians`, `round_p50_ms`): a round that ran in
    one of the machine's slow spells shows there, where the pooled median hides it."""
    out = dict(results[0])
    for key, first in results[0].items():
        if isinstance(first, dict) and "rtf_median" in first:
            out[key] = {**summary([x for r in results for x in r[key]["seconds"]], first["audio_seconds"]),
                        "round_rtf_medians": [r[key]["rtf_median"] for r in results]}
        elif key.startswith("streaming"):  # "streaming", and a contender's other ways of streaming
            out[key] = {**first, "steps": sum(r[key]["steps"] for r in results)}
            if "first_audio_ms" in first:
                out[key]["first_audio_ms"] = float(np.median([r[key]["first_audio_ms"] for r in results]))
            for d in [d for d in ("encode_step", "decode_step") if d in first]:
                out[key][d] = {**percentiles([x for r in results for x in r[key][d]["seconds"]]),
                               "round_p50_ms": [r[key][d]["p50_ms"] for r in results]}
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in results)
    return out


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB.

    Linux: VmHWM, which starts afresh at exec. ru_maxrss does not: a worker started from a
    process holding torch would report the parent's peak.
    """
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return _maxrss_mb(resource.RUSAGE_SELF)


def children_peak_rss_mb() -> float:
    """Peak resident set size of the largest child process waited for, in MB."""
    return _maxrss_mb(resource.RUSAGE_CHILDREN)


def _maxrss_mb(who: int) -> float:
    rss = resource.getrusage(who).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB elsewhere


def graph_flops(path) -> int:
    """Multiply-adds x 2 of the graph's Conv, ConvTranspose, MatMul and Gemm nodes.

    Shapes come from ONNX shape inference; our graphs are static, so every count is exact.
    Elementwise ops, Softmax and normalisations are left out: they are a small share and not
    what a GEMM peak bounds.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for init in model.graph.initializer:
        # Weights: shape inference reads their dims, never their values, and copying them to
        # it and back took a second a graph of the released Mimi. Shape inputs (Reshape's,
        # Slice's) are a few elements, and keep theirs.
        if int(np.prod(init.dims)) > 1024:
            init.ClearField("raw_data")
    model = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    for init in model.graph.initializer:
        shapes[init.name] = list(init.dims)
    total = 0
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type in ("Conv", "ConvTranspose"):
            w, out = shapes[node.input[1]], shapes[node.output[0]]
            per_out = int(np.prod(w[1:])) if node.op_type == "Conv" else \
                w[0] // attrs.get("group", 1) * int(np.prod(w[2:]))
            total += 2 * int(np.prod(out)) * per_out
        elif node.op_type in ("MatMul", "Gemm"):
            a, out = shapes[node.input[0]], shapes[node.output[0]]
            k = a[-2] if node.op_type == "Gemm" and attrs.get("transA", 0) else a[-1]
            total += 2 * int(np.prod(out)) * k
    return total


def node_times(path: Path, modules: dict[str, str], runs: int = 3) -> dict[str, dict]:
    """Where one call of graph `path` spends its time, from ORT's per-node profile of `runs`
    calls on random inputs (each node's median) (a node's time does not depend on the values):
    for each label, the ms a call in the nodes of the torch module it names (`"semantic_model"`,
    `"head.istft"`) and their share of all nodes' time. A node is the module's when its name or a
    tensor it reads or writes carries the module's path: the exporter names a Linear's Gemm after
    nothing but its weights."""
    import json
    import tempfile

    import onnx
    import onnxruntime as ort

    marks = {label: ("/" + m.replace(".", "/") + "/", "." + m + ".") for label, m in modules.items()}
    owner = {}
    for node in onnx.load(str(path)).graph.node:
        names = (node.name, *node.input, *node.output)
        owner[node.name] = next((label for label, (a, b) in marks.items()
                                 if any(n.startswith(a) or b in n for n in names)), None)
    with tempfile.TemporaryDirectory(prefix="codecport-profile-") as tmp:
        opts = ort.SessionOptions()
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "profile")
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}
        for _ in range(runs):
            sess.run(None, feeds)
        events = [e for e in json.loads(Path(sess.end_profiling()).read_text()) if e.get("cat") == "Node"
                  and e.get("name", "").endswith("_kernel_time")]
    # Each node's median over the calls: a kernel the OS preempted once (the machine is shared)
    # does not move a part's share.
    durs: dict[str, list[int]] = {}
    for e in events:
        durs.setdefault(e["name"][:-len("_kernel_time")], []).append(e["dur"])
    median = {name: float(np.median(d)) for name, d in durs.items()}
    total = sum(median.values()) or 1
    spent = dict.fromkeys(modules, 0.0)
    for name, t in median.items():
        # ORT's fusions name a node after one of the nodes they fused; else the path decides.
        label = owner.get(name) or next((lb for lb, (a, _) in marks.items() if name.startswith(a)), None)
        if label is not None:
            spent[label] += t
    return {label: {"ms": t / 1000, "share_pct": 100 * t / total} for label, t in spent.items()}


_PEAKS: dict[tuple, dict] = {}  # (seconds, sizes) -> the peak measured in this process


def gemm_peak(seconds: float = 1.5, sizes: tuple[int, ...] = (512, 1024, 2048)) -> dict[str, float | str]:
    """Best fp32 GEMM rate of ONNX Runtime's CPU MatMul (MLAS) on this machine, in GFLOP/s.

    Measured with the same library and thread pool our graphs run on, so the efficiency
    figure compares like with like; the best over a few square sizes, so the peak is not
    understated (which would flatter the efficiency). Measured once a process: the runs of one
    process (the bench called from Python, as the tests call it) report the same machine's peak.
    """
    key = (seconds, tuple(sizes))
    if key not in _PEAKS:
        import onnxruntime as ort

        runs = {n: _gemm_rate(seconds, n) for n in sizes}
        n = max(runs, key=runs.get)
        _PEAKS[key] = {"gflops": runs[n], "by_size": {str(k): v for k, v in runs.items()},
                       "library": f"onnxruntime {ort.__version__} MatMul (MLAS sgemm), best of "
                                  f"{'/'.join(map(str, sizes))} square, {seconds:g} s each"}
    peak = _PEAKS[key]
    return {**peak, "by_size": dict(peak["by_size"])}  # a copy: a report may be changed by its caller


def _gemm_rate(seconds: float, n: int) -> float:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from ..runtime.providers import session_options

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = session_options()  # the thread settings our graphs run with
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((n, n), np.float32), "b": rng.standard_normal((n, n), np.float32)}
    sess.run(None, feeds)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        sess.run(None, feeds)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def flat_codes(arrays) -> np.ndarray:
    """The codes of one clip as one `[B, K, frames]` array to compare: a multi-scale codec's
    time scales laid end to end as `[B, 1, total]`."""
    arrays = [np.asarray(a) for a in arrays]
    if len(arrays) == 1:
        return arrays[0]
    return np.concatenate([a.reshape(a.shape[0], 1, -1) for a in arrays], axis=-1)


def run_report(work: Path | None, prefix: str, run: Callable[[Path], dict],
               lines: Callable[[dict], list[str]], json_out: Path | None) -> dict:
    """A codec-bench command's frame: `run(work)` in `work` (a temp folder when None, removed
    after), its table printed and its report written to `json_out`. Its failures are
    `CodecportError`s, which the commands' guard prints as one line."""
    import json
    import tempfile

    import click

    from ..atomic import atomic_path, ready_parent
    from ..errors import OutputError

    if json_out is not None:  # refused now, not after minutes of measuring
        if json_out.is_dir():
            raise OutputError(f"--json {json_out} is a folder; pass a file name")
        ready_parent(json_out)
    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix=prefix)
        work = Path(tmp.name)
    try:
        report = run(work)
    finally:
        if tmp is not None:
            tmp.cleanup()
    for line in lines(report):
        click.echo(line)
    if json_out:
        with atomic_path(json_out) as t:
            t.write_text(json.dumps(report, indent=2))
        click.echo(f"wrote {json_out}")
    return report
