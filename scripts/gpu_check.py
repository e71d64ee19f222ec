#!/usr/bin/env python3
"""GPU check: codecport's graphs on the CUDA EP against the CPU EP, with timings.

  python scripts/gpu_check.py check FOLDER... [--json F]     on the GPU machine
  python scripts/gpu_check.py pack-ort WHEEL OUT.tar.xz      here: onnxruntime-gpu cut to fit a carry

`check` takes `codec-export` folders (any registered codec, any precision). For each it opens the graphs
on the device provider (CUDA) and on the reference provider (CPU), then:
- parity: codes of one generated clip (tones with moving pitch, envelope, noise) from both, and
  the audio both decode from the reference's codes (so a code flip in the encoder does not count
  twice); DAC's chunked graphs and Mimi's streaming step graphs the same way;
- timings: one warm-up call (its time is reported: it holds the cuDNN algorithm search), then the
  median of N calls, as seconds and real-time factor; Mimi streaming step latency p50/p95/p99;
- placement: every graph must run on the provider asked for. ORT drops a provider whose libraries
  fail to load and runs on the CPU without a word; here that is a failure, not a slow result.

It prints a table, writes JSON (to $OUT/gpu_check.json when $OUT is set), and exits 0 when every
folder passed, 1 on a parity failure or an error in a folder, 2 when the device provider is
missing or not used, 3 when the deadline left folders unchecked. `--device-provider cpu` dry-runs
the whole path without a GPU (CPU against CPU: identical by construction). docs/gpu.md says how
to run it on the device.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import lzma
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

# Run from a checkout without `pip install -e .` (the device machine gets the working tree only).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Parity gates, device provider against the reference provider on the same folder.
# fp32: both providers compute the same graph in fp32, but CUDA's convolutions and GEMMs sum in
# another order and, by ORT's default (use_tf32=1), round their inputs to TF32's 10-bit mantissa
# on Ampere and later. Codes can flip only where two codebook entries are nearly tied, and each
# flip changes every later residual level, so agreement is the sensitive number; 99 % and 40 dB
# (error 1 % of the amplitude) leave room for that and still catch a wrong kernel, which shows
# as chance agreement and ~0 dB.
# fp16: the CPU EP has no fp16 kernels for most of our ops and runs them in fp32 between inserted
# Casts, while CUDA computes in fp16: the two differ by about what fp16 itself costs against
# fp32 (measured here on the CPU, fp16 folder against fp32 with this script's metrics: DAC 44 kHz
# 98.98 % codes and 52.8 dB decoded, the tiny DAC 99.9 % and 59.5 dB). 90 % and 20 dB sit under
# that with a margin for CUDA's own rounding, and still fail a broken kernel.
THRESHOLDS = {"fp32": {"codes_pct": 99.0, "snr_db": 40.0},
              "fp16": {"codes_pct": 90.0, "snr_db": 20.0},
              # int8 QDQ: CUDA runs QDQ through its own int8 or fake-quant kernels; rounding
              # points differ from the CPU EP's, so only a gross failure is caught.
              "int8": {"codes_pct": 80.0, "snr_db": 10.0}}
EXIT_FAILED, EXIT_PROVIDER, EXIT_INCOMPLETE = 1, 2, 3


# ---- pack-ort -------------------------------------------------------------------------------
FATBIN_MAGIC = 0xBA55ED50


def _section(elf: bytes, name: str) -> tuple[int, int]:
    """(file offset, size) of ELF64 section `name`."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    strtab_off, = struct.unpack_from("<Q", elf, shoff + shstrndx * shentsize + 0x18)
    for i in range(shnum):
        base = shoff + i * shentsize
        name_off, = struct.unpack_from("<I", elf, base)
        end = elf.index(b"\0", strtab_off + name_off)
        if elf[strtab_off + name_off:end].decode() == name:
            return struct.unpack_from("<QQ", elf, base + 0x18)
    raise SystemExit(f"no {name} section: not a CUDA library")


def prune_fatbins(lib: bytearray, arch: int) -> dict:
    """Keep only the sm_`arch` cubins (and PTX at or below `arch`) in every fat binary that has
    one, in place; the bytes freed are zeroed, so they compress to nothing.

    The CUDA EP's kernels are cubins for sm_75...sm_120 and no PTX: a GPU can run only the cubin
    of its own major version, so on an sm_90 GPU the others are dead weight (three quarters of
    the library). A fat binary with no sm_`arch` entry is left whole, so every one the runtime
    registers still looks as the build wrote it.
    """
    off, size = _section(lib, ".nv_fatbin")
    i, stats = off, {"fatbins": 0, "kept": 0, "dropped": 0, "untouched": 0}
    while i < off + size - 16:
        magic, _version, header, fat_size = struct.unpack_from("<IHHQ", lib, i)
        if magic != FATBIN_MAGIC:
            i += 8  # fat binaries are 8-byte aligned, padding between them
            continue
        stats["fatbins"] += 1
        j, end, entries = i + header, i + header + fat_size, []
        while j < end:
            kind, _, ehead, payload = struct.unpack_from("<HHIQ", lib, j)
            entry_arch, = struct.unpack_from("<I", lib, j + 28)
            entries.append((kind, entry_arch, bytes(lib[j:j + ehead + payload])))
            j += ehead + payload
        keep = [e for k, a, e in entries if a == arch or (k == 1 and a <= arch)]  # kind 1: PTX
        if any(a == arch for _, a, _ in entries):
            body = b"".join(keep)
            lib[i + header:end] = body + bytes(fat_size - len(body))
            struct.pack_into("<Q", lib, i + 8, len(body))
            stats["kept"] += len(keep)
            stats["dropped"] += len(entries) - len(keep)
        else:
            stats["untouched"] += 1
        i = end
    return stats


def pack_ort(wheel: Path, out: Path, arch: int) -> None:
    """The onnxruntime package from `wheel`, its CUDA library cut to sm_`arch`, as a .tar.xz to
    unpack into a folder on PYTHONPATH. The C API library and the TensorRT EP are left out: the
    Python module links ORT statically and we run CUDA only."""
    with tempfile.TemporaryDirectory(prefix="ort-pack-") as tmp:
        root = Path(tmp)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root)
        capi = root / "onnxruntime" / "capi"
        for lib in [*capi.glob("libonnxruntime.so*"), *capi.glob("libonnxruntime_providers_tensorrt.so")]:
            lib.unlink()
        cuda = capi / "libonnxruntime_providers_cuda.so"
        data = bytearray(cuda.read_bytes())
        stats = prune_fatbins(data, arch)
        cuda.write_bytes(data)
        print(f"{cuda.name}: {stats['fatbins']} fat binaries, kept {stats['kept']} sm_{arch} entries, "
              f"dropped {stats['dropped']}, {stats['untouched']} without sm_{arch} left whole")
        out.parent.mkdir(parents=True, exist_ok=True)
        part = out.with_name(out.name + ".part")
        # xz, not zstd: Python's tarfile unpacks it on the device with nothing installed. The x86
        # branch filter makes the machine code compress better (58.0 -> 56.5 MiB): every MiB
        # counts under the carry limit.
        filters = [{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
        with lzma.open(part, "wb", format=lzma.FORMAT_XZ, filters=filters) as xz, \
                tarfile.open(fileobj=xz, mode="w|") as tar:
            for p in sorted(root.iterdir()):
                tar.add(p, arcname=p.name)
        part.replace(out)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")


# ---- check: environment ---------------------------------------------------------------------
def preload_cuda(mode: str) -> list[str]:
    """Load the CUDA/cuDNN libraries before the first CUDA session, and say how.

    onnxruntime-gpu does not ship them: it finds them through a torch of the same CUDA major
    imported first (which loads them process-wide), or `onnxruntime.preload_dlls()` (the `nvidia`
    pip packages beside it), or the system's library path.
    """
    notes = []
    if mode in ("auto", "torch"):
        try:
            import torch

            notes.append(f"imported torch {torch.__version__} (CUDA {torch.version.cuda}) first")
        except ImportError as e:
            if mode == "torch":
                raise SystemExit(f"--preload torch: {e}") from e
    import onnxruntime as ort

    if mode in ("auto", "ort") and hasattr(ort, "preload_dlls"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            ort.preload_dlls()
        notes.append("onnxruntime.preload_dlls(): " + (buf.getvalue().strip().replace("\n", "; ") or "ok"))
    return notes


def loaded_libraries() -> list[str]:
    """CUDA libraries mapped into this process: which copies the CUDA EP really uses."""
    names = ("libcudart", "libcublas", "libcudnn.so", "libcufft", "libcurand",
             "libonnxruntime_providers_cuda", "libcuda.so")
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    paths = {line.split()[-1] for line in maps if "/" in line}
    return sorted(p for p in paths if any(n in Path(p).name for n in names))


def gpu_name() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], check=False, capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


# ---- check: measurements --------------------------------------------------------------------
def make_clip(samples: int, sample_rate: int, seed: int = 0) -> np.ndarray:
    from codecport.bench.measure import clip

    return clip(samples, sample_rate, seed)


def timed(fn, runs: int, seconds: float) -> tuple[object, dict]:
    """fn's result, and its warm-up time and median/min/max of `runs` more calls (RTF: per
    second of audio)."""
    t0 = time.perf_counter()
    result = fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times = times or [first]
    med = statistics.median(times)
    return result, {"first_s": round(first, 4), "median_s": round(med, 5), "min_s": round(min(times), 5),
                    "max_s": round(max(times), 5), "runs": runs, "rtf": round(med / seconds, 5)}


def percentiles(ms: list[float]) -> dict:
    from codecport.bench.measure import percentiles as of_seconds

    out = of_seconds([x / 1e3 for x in ms])
    return {k: round(v, 3) for k, v in out.items() if k.endswith("_ms")} | {"steps": len(ms)}


def gate(result: dict, where: str, precision: str, failures: list[str]) -> None:
    """Append to `failures` what in `result` (one parity record) is under the precision's gate."""
    thr = THRESHOLDS.get(precision, THRESHOLDS["fp32"])
    if "shape_mismatch" in result:
        failures.append(f"{where}: shapes differ {result['shape_mismatch']}")
        return
    pct = result.get("code_agreement_pct")
    if pct is not None and pct < thr["codes_pct"]:
        failures.append(f"{where}: codes agree {pct:.2f} % < {thr['codes_pct']} %")
    if "snr_db" in result and not result.get("identical"):
        snr = result["snr_db"]
        if snr is None or snr < thr["snr_db"]:
            failures.append(f"{where}: decoded SNR {snr} dB < {thr['snr_db']} dB")


def graph_feed(codec, name: str, clip: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """The input one call of graph `name` takes: the clip zero-padded to the graph, or the codes
    zero-padded to its frames as the decoder takes them (latents from the numpy RVQ, or the codes
    themselves with the quantizer in the graph)."""
    g = codec.graph(name)
    if name.startswith("encoder"):
        x = np.zeros(g.session.get_inputs()[0].shape, np.float32)
        n = min(clip.shape[-1], x.shape[-1])
        x.reshape(-1)[:n] = clip[0, :n]
        return x
    c = np.pad(codes[0], ((0, 0), (0, g.int("frames") - codes.shape[-1])))
    return c[None].astype(np.int64) if codec.rvq is None else codec.rvq.decode(c)[None].astype(np.float32)


def graph_timing(graph, feed: np.ndarray, runs: int, seconds: float) -> dict:
    """One graph alone, without the numpy RVQ around it."""
    return timed(lambda: graph(feed), runs, seconds)[1]


def check_codec(dev, ref, args, out: dict, failures: list[str], label: str, precision: str) -> dict:
    """Every way through the folder's graphs, on the device against the reference: the fixed
    pair, then the long-audio modes the codec has (chunked windows, its streams)."""
    from codecport import registry
    from codecport.bench.facts import facts_of
    from codecport.bench.measure import agreement, closeness, flat_codes
    from codecport.runtime.codes import Codes

    sr, keep = dev.sample_rate, {}
    par, timing = {}, {"device": {}, "reference": {}}
    # One call of the fixed graphs, the way the codec's bench takes it (SNAC: its window graph,
    # decoded without noise so that both sides decode alike).
    facts = facts_of(registry.get(dev.name))
    mode, noise = facts.fixed_mode, facts.compare_noise
    rate_in = dev.input_rate  # the encoder's rate (NeuCodec's 16 kHz beside its 24 kHz out)
    fixed_enc = lambda codec, clip: codec.encode(clip, rate_in, mode=mode).arrays
    fixed_dec = lambda codec, arrays: codec.decode(Codes(arrays), mode=mode, **noise)[0]
    if "encoder" in dev.present and "decoder" in dev.present:
        clip = make_clip(dev.graph("encoder").int("samples"), rate_in)
        secs = clip.shape[1] / rate_in
        out["audio_seconds"] = secs
        codes_ref, t_ref_enc = timed(lambda: fixed_enc(ref, clip), args.reference_runs, secs)
        codes_dev, t_dev_enc = timed(lambda: fixed_enc(dev, clip), args.runs, secs)
        audio_ref, t_ref_dec = timed(lambda: fixed_dec(ref, codes_ref), args.reference_runs, secs)
        audio_dev, t_dev_dec = timed(lambda: fixed_dec(dev, codes_ref), args.runs, secs)
        par["encode"] = agreement(flat_codes(codes_ref), flat_codes(codes_dev))
        par["decode"] = closeness(audio_ref, audio_dev)
        timing["device"].update(encode=t_dev_enc, decode=t_dev_dec)
        timing["reference"].update(encode=t_ref_enc, decode=t_ref_dec)
        for name in ("encoder", "decoder"):
            if len(dev.graph(name).session.get_inputs()) == 1:  # graphs of one input: alone too
                feed = graph_feed(dev, name, clip, codes_ref[0])
                timing["device"][f"{name}_graph"] = graph_timing(dev.graph(name), feed, args.runs, secs)
        keep = {"clip": clip, "codes_ref": codes_ref, "audio_ref": audio_ref}
    if dev.streams == ("decoder",) and keep:
        # A decoder stream alone (SNAC, NeuCodec): the fixed codes a frame a push, against the
        # reference's whole decode (SNAC's with the same noise), and the time of a push.
        streamed, push_ms = [], []
        stream = dev.decoder_stream(noise=0) if noise else dev.decoder_stream()
        whole_codes = Codes(codes_ref)
        for j in range(whole_codes.n_frames[0]):
            t0 = time.perf_counter()
            streamed.append(stream.push(whole_codes.frames(j, j + 1)))
            push_ms.append(1e3 * (time.perf_counter() - t0))
        streamed.append(stream.flush())
        whole = ref.decode(whole_codes, **({'noise': 0} if noise else {}))[0][0]
        par["stream_decode"] = closeness(whole, np.concatenate(streamed))
        timing["device"]["stream"] = {"frame_ms": round(1e3 * dev.strides[0] * dev.frame_size / sr, 3),
                                      "push": percentiles(push_ms[3:] or push_ms)}
    if {"encoder_chunked", "decoder_chunked"} <= set(dev.present):
        step = dev.graph("encoder_chunked").int("chunk_step")
        long = make_clip(2 * step + step // 2, sr, seed=1)  # three windows, the last one partial
        lsecs = long.shape[1] / sr
        enc = lambda codec: codec.encode(long, sr, mode="chunked").data
        # The chunked graphs are sessions of their own, whose first call holds their own cuDNN
        # search: one more call is timed on the device. The reference's one call is enough.
        c_ref, timing["reference"]["chunked_encode"] = timed(lambda: enc(ref), 0, lsecs)
        c_dev, timing["device"]["chunked_encode"] = timed(lambda: enc(dev), 1, lsecs)
        a_ref, timing["reference"]["chunked_decode"] = timed(lambda: ref.decode(c_ref, mode="chunked")[0], 0,
                                                             lsecs)
        a_dev, timing["device"]["chunked_decode"] = timed(lambda: dev.decode(c_ref, mode="chunked")[0], 1,
                                                          lsecs)
        par["chunked_encode"], par["chunked_decode"] = agreement(c_ref, c_dev), closeness(a_ref, a_dev)
        out["chunked_audio_seconds"] = lsecs
    if dev.streams == ("encoder", "decoder"):
        enc_ref, dec_ref = ref.encoder_stream(), ref.decoder_stream()
        enc_dev, dec_dev = dev.encoder_stream(), dev.decoder_stream()
        step = enc_dev.step_frames * dev.frame_size
        n = args.warmup_steps + args.steps
        pcm = make_clip(n * step, sr, seed=2)[0]
        chunks = [pcm[i * step:(i + 1) * step] for i in range(n)]
        ref_codes = [enc_ref.push(c) for c in chunks]
        ref_audio = [dec_ref.push(c) for c in ref_codes]
        enc_ms, dec_ms, dev_codes, dev_audio = [], [], [], []
        for c, rc in zip(chunks, ref_codes, strict=True):
            t0 = time.perf_counter()
            dev_codes.append(enc_dev.push(c))
            t1 = time.perf_counter()
            dev_audio.append(dec_dev.push(rc))  # the reference's codes: see the module doc
            t2 = time.perf_counter()
            enc_ms.append(1e3 * (t1 - t0))
            dec_ms.append(1e3 * (t2 - t1))
        w = args.warmup_steps
        par["stream_encode"] = agreement(np.concatenate(ref_codes, 1), np.concatenate(dev_codes, 1))
        par["stream_decode"] = closeness(np.concatenate(ref_audio), np.concatenate(dev_audio))
        timing["device"]["stream"] = {
            "step_ms": round(1e3 * step / sr, 3),
            "io_binding": getattr(enc_dev, "io_binding", None),
            "first_steps_ms": [round(a + b, 2) for a, b in zip(enc_ms[:w], dec_ms[:w], strict=True)],
            "encode_step": percentiles(enc_ms[w:]), "decode_step": percentiles(dec_ms[w:]),
            "encode_plus_decode": percentiles([a + b for a, b in zip(enc_ms[w:], dec_ms[w:], strict=True)])}
    check_batched(dev, ref, args, par, timing)
    for what, r in par.items():
        gate(r, f"{label} {what}", precision, failures)
    out["parity"], out["timing"] = par, timing
    return keep


def check_batched(dev, ref, args, par: dict, timing: dict) -> None:
    """The batched encoders (`codec-export --batch B`, for corpus tokenizing): each row's codes on
    the device against the reference's batch-1 graph, and B rows a call against B single calls."""
    from codecport.bench.measure import agreement
    from codecport.runtime.audio import ArraySource
    from codecport.runtime.plan import call_input, stack_calls

    sr, k = dev.input_rate, dev.codebooks(None)
    for graph, sizes in dev.batches.items():
        single = dev.graph(graph)
        samples = single.int("window") if "window" in single.meta else single.int("samples")
        for b in sizes:
            name = f"{graph}_b{b}"
            if len(single.session.get_inputs()) == 1:
                rows = [make_clip(samples, sr, seed=10 + i)[None] for i in range(b)]
                codes = lambda codec, y: codec.latent_codes(y, k)
            else:  # feeds of several inputs (a mask a row): the codec's own plan makes them
                plans = [dev.window_plan(ArraySource(make_clip(samples - 97 * i, sr, seed=10 + i), sr), None)
                         for i in range(b)]
                rows = [call_input(next(iter(p.windows))) for p in plans]
                codes = lambda codec, y, p=plans[0]: p.codes_of(codec, y, 0)  # each plan's first window
            flat = lambda c: np.concatenate([np.ravel(a) for a in c]) if isinstance(c, list) else np.ravel(c)
            x = stack_calls(rows, b)
            y = dev.graph(name)(x)
            got = np.stack([flat(codes(dev, row)) for row in y])
            want = np.stack([flat(codes(ref, ref.graph(graph)(row)[0])) for row in rows])
            par[f"{name}_rows"] = agreement(want, got)
            secs = b * samples / sr
            timing["device"][f"{name}_graph"] = graph_timing(dev.graph(name), x, args.runs, secs)
            timing["device"][f"{graph}_graph_x{b}"] = timed(
                lambda g=single, rows=rows: [g(row) for row in rows], args.runs, secs)[1]


def check_folder(folder: Path, args, options: dict, failures: list[str], fp32_refs: dict) -> dict:
    import codecport
    from codecport.runtime.providers import PROVIDERS

    manifest = json.loads((folder / "manifest.json").read_text())
    codec, precision = manifest["codec"], manifest.get("precision", "fp32")
    label = f"{folder.name} ({codec} {manifest.get('preset', manifest.get('variant'))} {precision})"
    out = {"folder": str(folder), "codec": codec, "preset": manifest.get("preset", manifest.get("variant")),
           "precision": precision,
           "weights": manifest.get("weights"), "export_id": manifest.get("export_id"),
           "export_deviation": manifest.get("deviation")}
    t0 = time.perf_counter()
    dev = codecport.load(folder, provider=args.device_provider, options=options)  # opens the first graph
    opened = {dev.present[0]: round(time.perf_counter() - t0, 3)}
    batched = [f"{g}_b{b}" for g, sizes in dev.batches.items() for b in sizes]
    for name in [*dev.present[1:], *batched]:  # every graph now: no open time folded into a timing
        t1 = time.perf_counter()
        dev.graph(name)
        opened[name] = round(time.perf_counter() - t1, 3)
    out["open_s"] = opened
    want = PROVIDERS[args.device_provider]
    out["providers"] = {name: dev.graph(name).session.get_providers() for name in dev.present}
    wrong = {n: p[0] for n, p in out["providers"].items() if p[0] != want}
    if wrong:
        raise ProviderMissing(f"{label}: graphs run on {wrong}, not {want}")
    first = dev.graph(dev.present[0]).session
    out["provider_options"] = first.get_provider_options().get(want, {})
    ref = codecport.load(folder, provider=args.reference_provider)
    keep = check_codec(dev, ref, args, out, failures, label, precision)
    # An fp16/int8 variant against the fp32 export it was built from, when that ran too: what the
    # variant on the device costs against the reference users compare with (not gated here: the
    # export measured and recorded it).
    base = fp32_refs.get(manifest.get("fp32_export_id"))
    if precision == "fp32" and keep:
        fp32_refs[manifest.get("export_id")] = keep
    elif base is not None and keep and base["clip"].shape == keep["clip"].shape:
        from codecport import registry
        from codecport.bench.facts import facts_of
        from codecport.bench.measure import agreement, closeness, flat_codes
        from codecport.runtime.codes import Codes

        facts = facts_of(registry.get(dev.name))
        dec = dev.decode(Codes(base["codes_ref"]), mode=facts.fixed_mode, **facts.compare_noise)[0]
        codes = dev.encode(base["clip"], dev.input_rate, mode=facts.fixed_mode).arrays
        out["device_vs_fp32_reference"] = {"encode": agreement(flat_codes(base["codes_ref"]),
                                                               flat_codes(codes)),
                                           "decode": closeness(base["audio_ref"], dec)}
    return out


class ProviderMissing(Exception):
    """The device provider is not available, or a graph does not run on it."""


# ---- check: report --------------------------------------------------------------------------
def _fmt_par(r: dict | None) -> str:
    if not r:
        return "-"
    if "code_agreement_pct" in r:
        return f"{r['code_agreement_pct']:.2f}%"
    if r.get("identical"):
        return "identical"
    return f"{r['snr_db']:.1f} dB / {r['max_abs_err']:.2g}"


def _fmt_t(t: dict | None) -> str:
    return "-" if not t else f"{1e3 * t['median_s']:.1f} ms ({t['rtf']:.4f})"


STEPS = ("encode", "decode", "chunked_encode", "chunked_decode", "stream_encode", "stream_decode")


def table(report: dict) -> list[str]:
    dev, ref = report["device_provider"], report["reference_provider"]
    head = (f"{'folder':<28} {'step':<15} {'parity vs ' + ref:<22} {dev + ' median (RTF)':<24} "
            f"{ref + ' median (RTF)':<24} {dev + ' first call':<14}")
    lines = [head, "-" * len(head)]
    for f in report["folders"]:
        name = f"{Path(f['folder']).name} {f.get('precision', '')}"[:28]
        if "error" in f or "skipped" in f:
            lines.append(f"{name:<28} {f.get('error') or f.get('skipped')}")
            continue
        par, td, tr = f["parity"], f["timing"]["device"], f["timing"]["reference"]
        for step in STEPS:
            if step not in par:
                continue
            first = td.get(step, {}).get("first_s")
            first = "-" if first is None else f"{1e3 * first:.0f} ms"
            lines.append(f"{name:<28} {step:<15} {_fmt_par(par[step]):<22} {_fmt_t(td.get(step)):<24} "
                         f"{_fmt_t(tr.get(step)):<24} {first:<14}")
        for g in ("encoder_graph", "decoder_graph"):
            if g in td:
                lines.append(f"{name:<28} {g:<15} {'':<22} {_fmt_t(td[g]):<24}")
        if "stream" in td and "push" in td["stream"]:
            s = td["stream"]
            lines.append(f"{name:<28} {'stream decode':<15} a frame ({s['frame_ms']:g} ms) a push: "
                         f"p50 {s['push']['p50_ms']:.2f} / p95 {s['push']['p95_ms']:.2f} ms")
        elif "stream" in td:
            s = td["stream"]
            enc, dec, both = s["encode_step"], s["decode_step"], s["encode_plus_decode"]
            lines.append(f"{name:<28} {'stream step':<15} {s['step_ms']:g} ms of audio per step, "
                         f"io_binding {s['io_binding']}: encode p50 {enc['p50_ms']:.2f} / p95 "
                         f"{enc['p95_ms']:.2f} ms, decode p50 {dec['p50_ms']:.2f} / p95 "
                         f"{dec['p95_ms']:.2f} ms, both p95 {both['p95_ms']:.2f} ms")
        if "device_vs_fp32_reference" in f:
            v = f["device_vs_fp32_reference"]
            lines.append(f"{name:<28} {'vs fp32 ' + ref:<15} codes {_fmt_par(v['encode'])}, "
                         f"decoded {_fmt_par(v['decode'])}")
    return lines


def write_json(report: dict, path: Path | None) -> None:
    if path is None:
        return
    from codecport.atomic import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(report, indent=2, default=str))


def _options(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise SystemExit(f"--provider-option {v!r} is not KEY=VALUE")
        out[key] = value
    return out


def _precision(folder: Path) -> str:
    try:
        return json.loads((folder / "manifest.json").read_text()).get("precision", "fp32")
    except (OSError, ValueError):
        return "fp32"  # check_folder says what is wrong with it


def _source() -> dict:
    """codecport's version and, where the checkout has its .git, the commit and whether it was clean."""
    import codecport

    root, out = Path(__file__).resolve().parent.parent, {"codecport": codecport.__version__}
    try:
        for key, cmd in (("commit", ["git", "rev-parse", "HEAD"]),
                         ("dirty", ["git", "status", "--porcelain"])):
            r = subprocess.run(cmd, cwd=root, check=True, capture_output=True, text=True, timeout=30)
            out[key] = r.stdout.strip() if key == "commit" else bool(r.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def run_check(args) -> int:
    start = time.perf_counter()
    json_path = args.json or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None)
    preload = preload_cuda(args.preload) if args.device_provider == "cuda" else []
    import onnxruntime as ort

    from codecport.runtime.providers import PROVIDERS

    report = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "device_provider": args.device_provider,
              "reference_provider": args.reference_provider, "thresholds": THRESHOLDS,
              "source": _source(),
              "environment": {"python": sys.version.split()[0], "platform": platform.platform(),
                              "cpus": os.cpu_count(), "numpy": np.__version__,
                              "onnxruntime": ort.__version__, "onnxruntime_file": ort.__file__,
                              "available_providers": ort.get_available_providers(),
                              "gpu": gpu_name(), "preload": preload},
              "options": _options(args.provider_option), "runs": args.runs,
              "reference_runs": args.reference_runs, "folders": [], "failures": []}
    print(f"onnxruntime {ort.__version__} ({ort.__file__}); providers {ort.get_available_providers()}")
    print(f"GPU: {report['environment']['gpu']}; preload: {preload or 'none'}")
    failures, fp32_refs, code = report["failures"], {}, 0
    want = PROVIDERS[args.device_provider]
    if want not in ort.get_available_providers():
        failures.append(f"{want} is not in this onnxruntime ({ort.get_available_providers()})")
        report["ok"] = False
        write_json(report, json_path)
        print(f"FAIL: {failures[-1]}", file=sys.stderr)
        return EXIT_PROVIDER
    folders = sorted(args.folders, key=lambda f: _precision(f) != "fp32")  # the variants compare with fp32
    for folder in folders:
        if time.perf_counter() - start > args.deadline:
            report["folders"].append({"folder": str(folder),
                                      "skipped": f"deadline {args.deadline:g} s passed"})
            code = code or EXIT_INCOMPLETE
            continue
        print(f"== {folder}", flush=True)
        t0 = time.perf_counter()
        try:
            r = check_folder(folder, args, report["options"], failures, fp32_refs)
        except ProviderMissing as e:
            failures.append(str(e))
            report["folders"].append({"folder": str(folder), "error": str(e)})
            code = EXIT_PROVIDER
            break
        except Exception as e:  # noqa: BLE001 (ORT raises untyped errors; one folder's failure must not hide the others' results)
            from codecport.errors import ProviderError

            failures.append(f"{folder}: {type(e).__name__}: {e}")
            report["folders"].append({"folder": str(folder), "error": f"{type(e).__name__}: {e}"})
            if isinstance(e, ProviderError):
                code = EXIT_PROVIDER
                break
            code = code or EXIT_FAILED
            continue
        r["elapsed_s"] = round(time.perf_counter() - t0, 2)
        report["folders"].append(r)
        report["environment"]["cuda_libraries"] = loaded_libraries()
        write_json(report, json_path)  # after each folder: a run cut short still leaves its results
    if failures and code == 0:
        code = EXIT_FAILED
    report["ok"], report["exit_code"] = code == 0, code
    report["elapsed_s"] = round(time.perf_counter() - start, 2)
    print()
    for line in table(report):
        print(line)
    libs = report["environment"].get("cuda_libraries")
    if args.device_provider == "cuda" and libs:
        print("CUDA libraries in use:\n  " + "\n  ".join(libs))
    for f in failures:
        print(f"FAIL: {f}", file=sys.stderr)
    print(f"{'OK' if code == 0 else 'FAILED'} in {report['elapsed_s']:.1f} s (exit {code})")
    write_json(report, json_path)
    if json_path:
        print(f"wrote {json_path}")
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="parity and timings of export folders, device provider vs reference")
    c.add_argument("folders", nargs="+", type=Path, help="codec-export folders (any registered codec)")
    c.add_argument("--device-provider", default="cuda", choices=["cuda", "cpu", "dml", "coreml"],
                   help="provider under test [default: cuda; cpu dry-runs the script]")
    c.add_argument("--reference-provider", default="cpu", choices=["cpu", "cuda"])
    c.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="device provider option over codecport's defaults (e.g. use_tf32=0); repeatable")
    c.add_argument("--runs", type=int, default=5, help="timed calls on the device after one warm-up")
    c.add_argument("--reference-runs", type=int, default=1,
                   help="timed calls on the reference after one warm-up")
    c.add_argument("--steps", type=int, default=50, help="Mimi streaming steps timed")
    c.add_argument("--warmup-steps", type=int, default=5, help="Mimi streaming steps before timing")
    c.add_argument("--deadline", type=float, default=270.0,
                   help="seconds after which no further folder is started (the rest are reported skipped)")
    c.add_argument("--preload", default="auto", choices=["auto", "torch", "ort", "none"],
                   help="how the CUDA libraries are loaded (auto: torch if importable, then "
                        "onnxruntime.preload_dlls)")
    c.add_argument("--json", type=Path, default=None, help="[default: $OUT/gpu_check.json when OUT is set]")
    k = sub.add_parser("pack-ort", help="onnxruntime-gpu wheel -> .tar.xz with only one GPU arch's kernels")
    k.add_argument("wheel", type=Path)
    k.add_argument("out", type=Path)
    k.add_argument("--arch", type=int, default=90, help="SM version kept [default: 90, H100/H200]")
    args = p.parse_args(argv)
    if args.cmd == "pack-ort":
        pack_ort(args.wheel, args.out, args.arch)
        return 0
    return run_check(args)


if __name__ == "__main__":
    sys.exit(main())
