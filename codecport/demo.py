"""Offline demo of the main job, for every registered codec: export it, then encode and decode a
generated clip through `codecport.load`, tokenize a small folder into Parquet, and check the
fixed graphs against torch.

Runs without network access, so the weights are seeded random ones (clearly not a trained
codec: the decoded audio is noise). With real weights, pass `--weights NAME` to codec-export.
"""

from __future__ import annotations

import time
from pathlib import Path

import click
import numpy as np

from . import registry
from .bench.facts import facts_of
from .frontend import Command, Finite, guard, unwinds_on_sigterm


def _clip(sr: int, seconds: float) -> np.ndarray:
    """A chirp over a soft noise floor, `[1, samples]`."""
    t = np.arange(int(sr * seconds)) / sr
    chirp = 0.4 * np.sin(2 * np.pi * (110 * t + 400 * t ** 2))
    rng = np.random.default_rng(0)
    return (chirp + 0.02 * rng.standard_normal(t.size)).astype(np.float32)[None]


@click.command(cls=Command, context_settings={"show_default": True})
@click.option("--codec", "names", multiple=True, type=click.Choice(registry.names()),
              help="Codecs to demo (repeatable) [default: all].")
@click.option("--seconds", type=Finite(min=1, max=600), default=4.0, help="Length of the generated clip.")
@click.option("-o", "--out", "out_dir", type=click.Path(path_type=Path), default=Path("demo-out"))
@guard
@unwinds_on_sigterm
def main(names: tuple[str, ...], seconds: float, out_dir: Path) -> None:
    """Export each codec (random weights), encode and decode a generated clip, and report."""
    # A list, not a generator: every codec's demo runs even when one fails.
    ok = all([_demo(registry.get(name), seconds, out_dir / name) for name in names or registry.names()])  # noqa: C419
    click.echo("files written:")
    for p in sorted(out_dir.rglob("*")):
        if p.is_file():
            click.echo(f"  {p} ({p.stat().st_size / 1e6:.1f} MB)")
    if not ok:
        raise SystemExit(1)


def _demo(spec, seconds: float, out_dir: Path) -> bool:
    import torch

    import codecport

    models, facts = spec.module("model"), facts_of(spec)
    # The clip is longer than one call of the fixed graphs, so the long-audio mode runs too.
    preset, call_seconds = facts.demo_preset, facts.demo_seconds
    cfg = spec.presets[preset]
    length = facts.clip_samples(cfg, call_seconds)
    click.echo(f"\ncodecport demo: {spec.label} {preset} with RANDOM weights (seed 0) - not a trained "
               "model, so the audio is noise; the graphs, codes and timings are real.")
    t0 = time.perf_counter()
    model = models.init_random(models.MODEL(cfg), 0).eval()
    report = spec.module("export").export(model, out_dir / "model", length, options={}, preset=preset,
                                          weights="random-init seed 0 (NOT trained weights)",
                                          weights_sha256="none")
    click.echo(f"export + validation: {time.perf_counter() - t0:.1f} s")
    for name, errs in report["validation"].items():
        shown = ", ".join(f"{k}={v:.2e}" if "err" in k else "codes identical to torch"
                          for k, v in errs.items())
        click.echo(f"  {name:<16} {shown}")

    codec = codecport.load(out_dir / "model")
    rate = codec.input_rate  # what the encoder takes (NeuCodec encodes 16 kHz, decodes 24 kHz)
    clip = _clip(rate, seconds)
    codecport.write_audio(out_dir / "input.wav", clip, rate)
    t0 = time.perf_counter()
    codes = codec.encode(clip, rate)
    t_enc = time.perf_counter() - t0
    codes_file = out_dir / f"codes{spec.suffixes[-1]}"
    codes.save(codes_file)
    t0 = time.perf_counter()
    audio, sr = codec.decode(codecport.load_codes(codes_file))
    t_dec = time.perf_counter() - t0
    codecport.write_audio(out_dir / "decoded.wav", audio, sr)
    shapes = " + ".join(str(list(a.shape)) for a in codes.arrays)
    click.echo(f"{seconds:g} s clip in {codes.mode} mode on {codec.provider}: codes "
               f"{shapes} ({codes.n_codebooks} of {codec.n_codebooks} codebooks), "
               f"encode {t_enc:.2f} s (RTF {t_enc / seconds:.3f}), decode {t_dec:.2f} s "
               f"(RTF {t_dec / seconds:.3f}); codes in {codes_file.name}")

    if codec.streams:
        click.echo(_streams(codec, clip))

    tokens_ok = _tokenize(codec, out_dir)

    # One call of the fixed graphs against the torch reference: the longest clip they take.
    one = clip[:, :codec.graph("encoder").int("samples")]
    mode = facts.fixed_mode
    fixed = codec.encode(one, rate, mode=mode).arrays
    onnx_audio = codec.decode(codecport.Codes(fixed), mode=mode, **facts.compare_noise)[0]
    with torch.no_grad():
        want = facts.torch_codes(model, torch.from_numpy(one)[:, None], fixed[0].shape[1])
        want_audio = facts.torch_decode(model, fixed)
    same = len(fixed) == len(want) and all(np.array_equal(a, b) for a, b in zip(fixed, want))
    n = min(onnx_audio.shape[1], want_audio.shape[1])
    click.echo(f"fixed graphs, {call_seconds:g} s: codes {'identical to' if same else 'DIFFER from'} torch, "
               "decoded audio max abs error vs torch "
               f"{np.abs(onnx_audio[:, :n] - want_audio[:, :n]).max():.2e}")
    return same and tokens_ok


def _streams(codec, clip: np.ndarray) -> str:
    """The clip through the codec's streams a step at a time, as a live loop runs them (encoder
    then decoder, or the whole clip's codes into the decoder), against the whole decode."""
    noise = {"noise": 1} if codec.draws_noise else {}  # one seed for the stream and the whole decode
    dec = codec.decoder_stream(**noise)
    enc = codec.encoder_stream() if "encoder" in codec.streams else None
    step = (enc or dec).step_frames
    lat, parts = [], []
    if enc is not None:
        n = step * codec.frame_size
        codes = []
        for i in range(0, clip.shape[1] - n + 1, n):
            t0 = time.perf_counter()
            c = enc.push(clip[0, i:i + n])
            parts.append(dec.push(c))
            lat.append(time.perf_counter() - t0)
            codes.append(c)
        whole_codes = np.concatenate(codes, axis=1)[None]
        what = f"live loop (encode + decode), {1000 * n / codec.sample_rate:g} ms a push"
    else:
        whole_codes = codec.encode(clip, codec.sample_rate).replace(sample_rate=None, num_samples=None)
        frames = whole_codes.n_frames[0]
        for j in range(0, frames, step):
            t0 = time.perf_counter()
            parts.append(dec.push(whole_codes.frames(j, j + step)))
            lat.append(time.perf_counter() - t0)
        coarse_ms = 1000 * codec.strides[0] * codec.frame_size / codec.sample_rate
        what = f"stream decode, {step} frame{'s' if step > 1 else ''} ({step * coarse_ms:.0f} ms) a push"
    parts.append(dec.flush())
    whole = codec.decode(whole_codes, **noise)[0][0]
    got = np.concatenate(parts)
    err = float(np.abs(got[:len(whole)] - whole[:len(got)]).max())
    return (f"{what}: median {1e3 * np.median(lat):.1f} ms, p95 {1e3 * np.percentile(lat, 95):.1f} ms, "
            f"audio final {dec.latency.frames:g} frames later; max abs difference from the whole "
            f"decode {err:.1e}")


def _tokenize(codec, out_dir: Path) -> bool:
    """The corpus job: a folder of clips (mixed rates, a stereo one, a corrupt one) through
    `codec-run tokenize`'s local engine into a Parquet dataset, a row checked against encode."""
    import codecport
    from codecport.tokenize import tokenize
    from codecport.tokenize.output import codes_column

    corpus = out_dir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, (rate, seconds) in enumerate([(16000, 1.0), (22050, 1.5), (44100, 0.7), (48000, 2.0),
                                         (24000, 1.2)]):
        clip = _clip(rate, seconds)
        codecport.write_audio(corpus / f"clip{i}.wav", np.concatenate([clip, clip]) if i == 2 else clip, rate)
    (corpus / "broken.wav").write_bytes(b"RIFF not really a wav")
    summary = tokenize([str(corpus)], codec.dir, out_dir / "tokens", workers=2)
    import pyarrow.dataset as pads

    rows = {r["id"]: r for r in pads.dataset(out_dir / "tokens", format="parquet").to_table().to_pylist()}
    row, encoded = rows["clip3.wav"], codec.encode_file(corpus / "clip3.wav").arrays
    same = all(np.array_equal(np.array(row[codes_column(i)]), a) for i, a in enumerate(encoded))
    click.echo(f"tokenize (a folder of 6 files, 2 workers): {summary.line()}; {out_dir / 'tokens'} "
               f"holds {len(rows)} rows, clip3's codes {'equal' if same else 'DIFFER from'} encode's, "
               f"and the broken file is in __errors__/errors.parquet")
    return same and len(rows) == 5 and summary.failed == 1


if __name__ == "__main__":
    main()
