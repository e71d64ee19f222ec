"""Offline demo of the main job: export DAC and Mimi, then encode and decode a generated clip.

Runs without network access, so the weights are seeded random ones (clearly not a trained
codec: the decoded audio is noise). With real weights, pass `--weights 44khz` (DAC) or
`--weights mimi` to codec-export.
"""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np

from .cli import DAC_VARIANTS


def _clip(sr: int, seconds: float) -> np.ndarray:
    """A chirp over a soft noise floor, `[1, samples]`."""
    t = np.arange(int(sr * seconds)) / sr
    chirp = 0.4 * np.sin(2 * np.pi * (110 * t + 400 * t ** 2))
    rng = np.random.default_rng(0)
    return (chirp + 0.02 * rng.standard_normal(t.size)).astype(np.float32)[None]


@click.command(context_settings={"show_default": True})
@click.option("--codec", type=click.Choice(["dac", "mimi", "both"]), default="both")
@click.option("--variant", type=click.Choice(DAC_VARIANTS), default="24khz", help="DAC preset.")
@click.option("--seconds", type=float, default=4.0, help="Length of the generated clip.")
@click.option("-o", "--out", "out_dir", type=click.Path(path_type=Path), default=Path("demo-out"))
def main(codec: str, variant: str, seconds: float, out_dir: Path) -> None:
    """Export DAC and/or Mimi (random weights), encode and decode a generated clip, and report."""
    ok = True
    if codec in ("dac", "both"):
        ok &= _demo_dac(variant, seconds, out_dir / "dac")
    if codec in ("mimi", "both"):
        ok &= _demo_mimi(seconds, out_dir / "mimi")
    click.echo("files written:")
    for p in sorted(out_dir.rglob("*")):
        if p.is_file():
            click.echo(f"  {p} ({p.stat().st_size / 1e6:.1f} MB)")
    if not ok:
        raise SystemExit(1)


def _report(report: dict, took: float) -> None:
    click.echo(f"export + validation: {took:.1f} s")
    for name, errs in report["validation"].items():
        shown = ", ".join(f"{k}={v:.2e}" if "err" in k else "codes identical to torch"
                          for k, v in errs.items())
        click.echo(f"  {name:<16} {shown}")


def _demo_dac(variant: str, seconds: float, out_dir: Path) -> bool:
    import torch

    from .export.dac import export_dac
    from .models.dac import DAC, PRESETS, init_random
    from .runtime.audio import write_audio
    from .runtime.dac import DacCodec

    cfg = PRESETS[variant]
    length = cfg.sample_rate  # one second per exact-graph call and per chunk window
    click.echo(f"codecport demo: DAC {variant} with RANDOM weights (seed 0) - not a trained model, "
               "so the audio is noise; the graphs, codes and timings are real.")
    t0 = time.perf_counter()
    model = init_random(DAC(cfg), seed=0).eval()
    report = export_dac(model, out_dir / "model", length, variant=variant,
                        weights="random-init seed 0 (NOT trained weights)", weights_sha256="none")
    _report(report, time.perf_counter() - t0)

    codec = DacCodec(out_dir / "model")
    clip = _clip(cfg.sample_rate, seconds)
    write_audio(out_dir / "input.wav", clip, cfg.sample_rate)

    t0 = time.perf_counter()
    f = codec.compress(clip, cfg.sample_rate)
    t_enc = time.perf_counter() - t0
    f.save(out_dir / "codes.dac")
    t0 = time.perf_counter()
    audio, sr = codec.decompress(f)
    t_dec = time.perf_counter() - t0
    write_audio(out_dir / "decoded.wav", audio, sr)
    click.echo(f"{seconds:g} s clip, chunked mode on {codec.provider}: codes {list(f.codes.shape)}, "
               f"encode {t_enc:.2f} s (RTF {t_enc / seconds:.3f}), "
               f"decode {t_dec:.2f} s (RTF {t_dec / seconds:.3f})")

    # One exact-length clip through the fixed graphs, against the torch reference.
    one = clip[:, :length]
    codes = codec.encode_exact(one)
    onnx_audio = codec.decode(codes, padding=True)
    with torch.no_grad():
        want_codes = model.encode(torch.from_numpy(one)[:, None]).numpy()
        want_audio = model.decode(torch.from_numpy(codes))[:, 0].numpy()
    same = np.array_equal(codes, want_codes)
    click.echo(f"exact graph, 1 s: codes {'identical to' if same else 'DIFFER from'} torch, "
               f"decoded audio max abs error vs torch {np.abs(onnx_audio - want_audio).max():.2e}")
    return same


def _demo_mimi(seconds: float, out_dir: Path) -> bool:
    import torch

    from .export.mimi import export_mimi
    from .models.mimi import PRESETS, MimiModel, init_random
    from .runtime.audio import write_audio
    from .runtime.mimi import MimiCodec, MimiStream

    cfg = PRESETS["mimi"]
    length = 25 * cfg.frame_size  # 2 s fixed graphs; longer clips stream through the step graphs
    click.echo("\ncodecport demo: Mimi with RANDOM weights (seed 0) - not a trained model.")
    t0 = time.perf_counter()
    model = init_random(MimiModel(cfg), seed=0).eval()
    report = export_mimi(model, out_dir / "model", length, 1, variant="mimi",
                         weights="random-init seed 0 (NOT trained weights)", weights_sha256="none")
    _report(report, time.perf_counter() - t0)

    codec = MimiCodec(out_dir / "model")
    clip = _clip(cfg.sample_rate, seconds)
    write_audio(out_dir / "input.wav", clip, cfg.sample_rate)
    t0 = time.perf_counter()
    codes = codec.encode(clip, cfg.sample_rate)  # longer than 2 s: the step graphs
    t_enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    audio = codec.decode(codes)
    t_dec = time.perf_counter() - t0
    write_audio(out_dir / "decoded.wav", audio[:, :clip.shape[1]], cfg.sample_rate)
    click.echo(f"{seconds:g} s clip through the step graphs on {codec.provider}: codes "
               f"{list(codes.shape)} (8 of 32 codebooks, as Moshi), encode {t_enc:.2f} s "
               f"(RTF {t_enc / seconds:.3f}), decode {t_dec:.2f} s (RTF {t_dec / seconds:.3f})")

    stream, lat = MimiStream(codec), []
    for i in range(0, clip.shape[1] - cfg.frame_size + 1, cfg.frame_size):
        t0 = time.perf_counter()
        stream.decode_step(stream.encode_step(clip[0, i:i + cfg.frame_size]))
        lat.append(time.perf_counter() - t0)
    click.echo(f"live stream, one 80 ms frame per call (encode + decode): median "
               f"{1e3 * np.median(lat):.1f} ms, p95 {1e3 * np.percentile(lat, 95):.1f} ms")

    with torch.no_grad():
        want = model.encode(model.pad(torch.from_numpy(clip)[:, None]), codes.shape[1]).numpy()
        want_audio = model.decode(torch.from_numpy(codes))[:, 0].numpy()
    same = np.array_equal(codes, want)
    click.echo(f"whole clip: codes {'identical to' if same else 'DIFFER from'} torch, decoded audio "
               f"max abs error vs torch {np.abs(audio - want_audio).max():.2e}")
    return same


if __name__ == "__main__":
    main()
