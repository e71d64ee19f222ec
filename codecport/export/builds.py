"""Builds of an export: where the graphs run (`--target`) and in what precision (`--precision`),
each measured against the fp32 graphs before anything is written (the targets: targets.py).

The fp32 graphs come out of the codec exporters already validated against torch. A build is a
rewrite of those ONNX graphs, never a second trace, so it cannot drift from what was validated:
- layout: NNAPI and CoreML's NeuralNetwork take only 2-D Conv, so `nnapi` and `mobile` carry each
  1-D conv as `[1, C, T, 1]` with a `[k, 1]` kernel, and spell the ops NNAPI lacks with ops it
  has (rewrite.py);
- fp16 and int8 (precision.py), calibrated on audio the user passes or on generated clips;
- `mobile`: ORT-format `.ort` files and the reduced-build operator config (ORT's converter);
- `coreml`: a `.mlpackage` per graph, converted by coremltools from the torch reference;
- `web`: the quantizer inside the graphs, the codes gathered as int32 (WebGPU has no int64),
  and each graph's facts in the manifest, which is all the browser can read (web.py).

Deviation is measured through the runtime, the way users will run the files (deviation.py): the
same clip set goes through the fp32 folder and the build's folder, and each file's metadata and
the report record code agreement, SNR and max abs error of the decoded audio, and the file's size.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..errors import ExportError
from ..runtime.folder import split_slots
from ..runtime.step import ring_rows, ring_window
from .deviation import Probe, calibration_clips, deviation, generated_clips, record_feeds, slot_deviation
from .graph import copy_model, export_folder, export_id, write_export, write_graphs, write_manifest
from .precision import overflowing_nodes, quiet, to_fp16, to_int8
from .rewrite import conv_to_2d, nnapi_ops
from .targets import PRECISIONS, TARGETS
from .web import int32_indices, web_manifest

log = logging.getLogger(__name__)

# fp32 rewrites (layout, NNAPI spellings) must reproduce fp32 up to rounding: anything past this
# is a bug in the rewrite, not a property of the target.
REWRITE_MIN_AGREEMENT, REWRITE_MIN_SNR = 99.0, 60.0


@dataclass
class Build:
    """What the user asked for: `codec-export ... --target T --precision P [--calibration F]`."""

    target: str = "cpu"
    precision: str = "fp32"
    calibration: list[Path] | None = None

    @property
    def plain(self) -> bool:
        """Nothing to do beyond the validated fp32 graphs."""
        t = TARGETS[self.target]
        return self.precision == "fp32" and not (t.layout_2d or t.ort_format or t.mlpackage or t.web)

    def check(self) -> None:
        if self.target not in TARGETS:
            raise ExportError(f"--target must be one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.precision not in PRECISIONS:
            raise ExportError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.precision not in TARGETS[self.target].precisions:
            raise ExportError(f"--target {self.target} takes --precision "
                              f"{' or '.join(TARGETS[self.target].precisions)}, not {self.precision}")
        if self.calibration and self.precision != "int8":
            raise ExportError("--calibration only applies to --precision int8")
        if self.calibration:  # a bad file is reported now, not after a long fp32 export
            from ..runtime.audio import read_audio

            for path in self.calibration:
                read_audio(Path(path))


# ---- the whole step ------------------------------------------------------------------------
def slot_feeds(name: str, model: onnx.ModelProto, calib: dict[str, list[dict]]) -> list[dict] | None:
    """Calibration feeds of `<side>_slots` graph `name` or a copy of its ladder (B streams a call,
    every input batch-first) from its one-stream `<side>_step` graph's; None for another graph.
    Row r of the i-th feed is the (i·B + r)-th one-stream feed: as many stream rows as the step
    graph's feeds, not as many calls (each row carries a stream's state, 8 MB for Mimi: 64 calls
    of 8 rows for each graph of the released Mimi's ladder put its int8 build past 24 GB)."""
    base = split_slots(name)[0]  # a ladder's copies too (encoder_slots_s4)
    one = calib.get(base.removesuffix("_slots") + "_step") if base.endswith("_slots") else None
    if not one:
        return None
    dims = {t.name: [d.dim_value for d in t.type.tensor_type.shape.dim] for t in model.graph.input}
    b = dims[model.graph.input[0].name][0]
    rings = {o.name.removesuffix("_new") + "_in" for o in model.graph.output if o.name.endswith("_new")}

    def row(f: dict, k: str) -> np.ndarray:  # the caches a slot graph keeps as rings, as rings
        return ring_window(f[k], int(f["offset_in"][0]), back=True) if k in rings else f[k]

    out = [{k: np.concatenate([row(one[(i * b + r) % len(one)], k) for r in range(b)]) for k in one[0]}
           for i in range(max(1, len(one) // b))]
    if rings:
        ring = (dims["ring_at"][1], dims[next(iter(rings))][-2])
        for f in out:
            f["ring_at"] = ring_rows(f["offset_in"], ring)
    return out


def finish_export(out_dir: Path, models: dict[str, onnx.ModelProto], rvq: dict | None, manifest: dict,
                  build: Build, probe: Probe) -> dict:
    """Write the export for `build`: the validated fp32 graphs as they are, or their build
    with its measured deviation. Everything is built in a staging folder that then replaces
    `out_dir` whole: a failed step leaves `out_dir` as it was, a new export leaves nothing of an
    old one. Returns the report additions (files, deviation, target). The exporters checked
    `build` before their trace."""
    target = TARGETS[build.target]
    if target.web and rvq is not None:
        raise ExportError("the browser cannot read rvq.npz: --target web puts the quantizer in the graphs")
    if build.plain:
        with export_folder(out_dir) as stage:
            return {"files": write_export(stage, models, rvq, manifest)}
    new_id = export_id(manifest["export_id"], build.target, build.precision)
    tag = {"target": build.target, "precision": build.precision, "export_id": new_id}
    with tempfile.TemporaryDirectory(prefix="codecport-") as tmp:
        ref_dir, build_dir = Path(tmp) / "fp32", Path(tmp) / "build"
        write_export(ref_dir, models, rvq, manifest)
        calib = None
        if build.precision != "fp32":
            clips = calibration_clips(build.calibration, probe)
            # Without IO binding, every feed (state included) passes through session.run; with one
            # window at a time, through the sessions of `codec.present` (record_feeds' view).
            calib = record_feeds(probe.open(ref_dir, options={"io_binding": "0", "parallel": "1"}),
                                 probe, clips)
        built = {}
        for name, model in models.items():
            m = nnapi_ops(conv_to_2d(model)) if target.layout_2d else copy_model(model)
            if target.web:
                m = int32_indices(m)
            # A slot graph's feeds are made when it is built, and dropped after.
            feeds = None if calib is None else calib.get(name) or slot_feeds(name, model, calib)
            if build.precision == "fp16":
                m = to_fp16(m, overflowing_nodes(m, feeds[:4]))
            elif build.precision == "int8":
                m = to_int8(m, feeds)
            _set_metadata(m, tag)
            onnx.checker.check_model(m)
            built[name] = m
            log.info("%s: %s/%s build done", name, build.target, build.precision)
        build_manifest = {**manifest, **tag, "fp32_export_id": manifest["export_id"]}
        write_export(build_dir, built, rvq, build_manifest)
        clips = generated_clips(2, probe.clip_samples, probe.sample_rate, seed=7)
        dev = deviation(ref_dir, build_dir, probe, clips)
        dev.update(slot_deviation(ref_dir, build_dir, probe, clips, lambda n, f: slot_feeds(n, models[n], f)))
        if build.precision == "fp32":
            _check_lossless(dev)
        for name, m in built.items():
            d = {**dev.get(name, {}), "size_bytes": 0, "fp32_size_bytes": models[name].ByteSize()}
            while d["size_bytes"] != m.ByteSize():  # the record is part of the size it records
                d["size_bytes"] = m.ByteSize()
                _set_metadata(m, {"deviation": json.dumps(d, sort_keys=True)})
            dev[name] = d
        report = {"target": build.target, "precision": build.precision, "deviation": dev,
                  "clip_set": "2 generated clips (tones with moving pitch, envelope, noise), "
                              f"{probe.clip_samples} samples each, seed 7"}
        with export_folder(out_dir) as stage:
            files = write_graphs(stage, built, rvq, new_id)
            if target.ort_format:
                files.update(write_ort(stage, list(built)))
            if target.mlpackage:
                files.update(write_mlpackages(stage, probe, tag, report))
            if target.web:
                build_manifest.update(web_manifest(built, files, probe.open))
            report["files"] = write_manifest(stage, {**build_manifest, **report}, files)
    return report


def build_of_folder(spec, fp32_dir: Path, out_dir: Path, build: Build) -> dict:
    """`finish_export` from a written fp32 export folder of codec `spec` (its registry entry)
    instead of a fresh trace (no weights needed); the .mlpackage conversion needs the torch
    modules, so not `--target coreml`."""
    from ..runtime.folder import read_manifest

    build.check()
    if TARGETS[build.target].mlpackage:
        raise ExportError("a .mlpackage is converted from the torch model: export with --target coreml")
    manifest = read_manifest(fp32_dir)
    if manifest is None:
        raise ExportError(f"{fp32_dir} has no manifest.json; pass a folder written by codec-export")
    if "precision" in manifest:
        raise ExportError(f"{fp32_dir} is already a {manifest['precision']} build; start from an "
                          "fp32 export")
    if manifest["codec"] != spec.name:
        raise ExportError(f"{fp32_dir} holds a {manifest['codec']} export, not {spec.name}")
    models = {name: onnx.load(str(fp32_dir / file)) for name, file in manifest["files"].items()
              if file.endswith(".onnx")}
    codec = spec.runtime(fp32_dir)
    rvq = None if codec.rvq is None else codec.rvq.arrays()
    base = {k: v for k, v in manifest.items() if k != "files"}
    return finish_export(out_dir, models, rvq, base, build, spec.module("export").probe(manifest))


def _check_lossless(dev: dict[str, dict]) -> None:
    for name, d in dev.items():
        encoder = "code_agreement_pct" in d
        if (encoder and d["code_agreement_pct"] < REWRITE_MIN_AGREEMENT) or \
                (not encoder and not d.get("snr_db", 0.0) >= REWRITE_MIN_SNR):
            raise ExportError(f"{name}: the fp32 rewrite for this target changed the results ({d}); "
                              "this is a codecport bug, please report it")


def write_ort(out_dir: Path, names: list[str]) -> dict[str, str]:
    """ORT-format files of `out_dir`'s graphs and the reduced-build operator config, written
    into `out_dir`; returns file key -> name.

    'Runtime' optimization style, as ORT advises for NNAPI/CoreML: 'Fixed' would bake this
    machine's (x86) kernel layouts into a file meant for phones.
    """
    from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

    with tempfile.TemporaryDirectory(prefix="codecport-ort-") as tmp:
        src = Path(tmp) / "onnx"
        src.mkdir()
        for name in names:
            shutil.copy(out_dir / f"{name}.onnx", src / f"{name}.onnx")
        dst = Path(tmp) / "ort"
        try:
            with quiet("convert_onnx_models_to_ort"):
                convert_onnx_models_to_ort(src, output_dir=dst, enable_type_reduction=True,
                                           optimization_styles=[OptimizationStyle.Runtime])
        except Exception as e:  # the converter raises bare exceptions
            raise ExportError(f"ORT-format conversion failed: {str(e).splitlines()[0]}") from e
        files = {}
        for f in sorted(dst.iterdir()):
            if f.suffix in (".ort", ".config"):
                name = f.name.replace(".with_runtime_opt", "")
                shutil.copy(f, out_dir / name)
                files[name.replace(".", "_")] = name
    return files


def write_mlpackages(out_dir: Path, probe: Probe, tag: dict, report: dict) -> dict:
    """One `.mlpackage` per graph, converted from the torch reference (see export/coreml.py);
    the inspected specs go into `report["mlpackage"]`."""
    from .coreml import to_mlpackage

    files, specs = {}, {}
    for name, spec in probe.specs.items():
        spec.metadata = {**spec.metadata, **tag}
        specs[name] = to_mlpackage(spec, out_dir / f"{name}.mlpackage", tag["precision"])
        files[f"{name}_mlpackage"] = f"{name}.mlpackage"
    report["mlpackage"] = specs
    return files


def _set_metadata(model: onnx.ModelProto, values: dict[str, str]) -> None:
    props = {p.key: p.value for p in model.metadata_props}
    props.update({k: str(v) for k, v in values.items()})
    del model.metadata_props[:]
    for k, v in props.items():
        model.metadata_props.add(key=k, value=v)


