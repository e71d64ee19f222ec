"""The bench's model: a codec exported with random weights (timings do not depend on them), kept
beside its weights and config so the torch and official contenders run the same model, and its
fp16/int8 builds."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import click

from .facts import facts_of


def fail(message: str, code: int = 2):
    """End the command with one `error:` line."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def preset_of(spec, preset: str | None, variant: str | None) -> str:
    """The preset asked for (`--preset`, or its old name `--variant`), else the codec's default;
    one it does not have ends the command."""
    preset = preset or variant or spec.default_preset
    if preset not in spec.presets:
        fail(f"{spec.name} has no preset {preset!r}; choose one of {', '.join(spec.presets)}")
    return preset


def export_options(spec, step_frames: int) -> dict:
    """The exporter's `options` for `step_frames` code frames a step, where it has step graphs."""
    return {"step_frames": step_frames} if spec.has_step_graphs else {}


def prepare(spec, preset: str, seconds: float, step_frames: int, seed: int, out: Path,
            batch: int | None = None, slots: int | None = None) -> dict:
    """Export `spec`'s `preset` (random weights) into `out/model`, with `weights.safetensors` and
    `config.json` beside it; `slots` adds the step graphs of that many streams a call."""
    from safetensors.torch import save_file

    facts, models = facts_of(spec), spec.module("model")
    cfg = spec.presets[preset]
    model = models.init_random(models.MODEL(cfg), seed).eval()
    samples = facts.clip_samples(cfg, seconds)
    options = {**export_options(spec, step_frames), **({"slots": slots} if slots else {})}
    spec.module("export").export(model, out / "model", samples, options=options,
                                 preset=preset, weights=f"random-init seed {seed}", weights_sha256="none",
                                 batch=batch)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "weights.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg.to_kwargs()))
    return {"samples": samples, "sample_rate": cfg.sample_rate}


def export_source_hash(root: Path | None = None) -> str:
    """Hash of the code that builds the graphs (of codecport's package folder `root`): a kept
    `--dir` export is rebuilt when it changed (the version number stays the same between
    releases)."""
    root = root or Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    # The shared machinery and every codec's folder (its model, exporter, runtime...).
    paths = [*(root / "models").glob("*.py"), *(root / "export").glob("*.py"),
             *(root / "codecs").rglob("*.py")]
    for path in sorted(paths):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def stamped(work: Path, key: dict, make: Callable[[], object], builds: str = "model-*") -> None:
    """`make()` the export kept in `work` unless `work/stamp.json` holds `key` (what it was made
    from), then stamp it. Builds of the previous export (`builds` in `work`) go first: the same
    seed gives the same export id, so they could not be told from builds of the new one."""
    stamp = work / "stamp.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == key:
        return
    for old in work.glob(builds):
        shutil.rmtree(old)
    make()
    work.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(key))


def build_folder(spec, work: Path, precision: str) -> Path:
    """The fp32 export's `precision` build, made once and kept beside it."""
    from ..export.builds import Build, build_of_folder

    folder = work / f"model-{precision}"
    fp32_id = json.loads((work / "model" / "manifest.json").read_text())["export_id"]
    manifest = folder / "manifest.json"
    if not manifest.is_file() or json.loads(manifest.read_text()).get("fp32_export_id") != fp32_id:
        click.echo(f"building the {precision} build (calibration and deviation measured) ...")
        build_of_folder(spec, work / "model", folder, Build("cpu", precision))
    return folder
