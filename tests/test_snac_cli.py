"""`codec-run` on a SNAC export: multi-scale `.npz` in the official shapes, the original length
and rate back, the Orpheus layout, the noise options, tokenize and info."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from cli_support import invoke
from support import noise

import codecport
from codecport.codecs.snac.codesfile import to_orpheus

BIN = Path(sys.executable).parent


def run(*args):
    """`codec-run ARGS` in this process (cli_support.py)."""
    return invoke("codec-run", *args)


@pytest.fixture(scope="module")
def wav(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("snac_cli") / "in.wav"
    sf.write(path, noise(int(0.35 * 22050), channels=2, seed=12).T, 22050, subtype="FLOAT")
    return path


def test_npz_holds_each_time_scale_as_the_official_encode_does(tiny_snac_export, tiny_snac_official, wav,
                                                               tmp_path):
    out = tmp_path / "c.npz"
    proc = run("encode", wav, "-m", tiny_snac_export, "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "[1, 1," not in proc.stdout and "whole clip, overlapping windows" in proc.stdout
    z = np.load(out)
    assert sorted(k for k in z if k.startswith("codes_")) == ["codes_0", "codes_1", "codes_2"]
    assert int(z["sample_rate"]) == 22050 and int(z["num_samples"]) == int(0.35 * 22050)
    audio = codecport.read_audio(wav)
    resampled = codecport.load(tiny_snac_export).encode(*audio)
    for i, a in enumerate(resampled.arrays):
        assert z[f"codes_{i}"].shape == (2, a.shape[-1]) and z[f"codes_{i}"].dtype == np.int64
        np.testing.assert_array_equal(z[f"codes_{i}"], a[:, 0])
    # The official encode of the resampled audio: the same codes.
    from codecport.runtime.audio import resample

    x = resample(audio[0], 22050, 16000)
    with torch.no_grad():
        want = tiny_snac_official.encode(torch.from_numpy(x)[:, None])
    for i, w in enumerate(want):
        np.testing.assert_array_equal(z[f"codes_{i}"], w.numpy())


def test_decode_gives_the_original_length_and_rate_and_the_seed_the_same_audio(tiny_snac_export, wav,
                                                                               tmp_path):
    assert run("encode", wav, "-m", tiny_snac_export, "-o", tmp_path / "c.npz").returncode == 0
    outs = []
    for name, extra in (("a", ["--noise-seed", "4"]), ("b", ["--noise-seed", "4"]), ("c", []),
                        ("z", ["--no-noise"])):
        proc = run("decode", tmp_path / "c.npz", "-m", tiny_snac_export, "-o", tmp_path / f"{name}.wav",
                   *extra)
        assert proc.returncode == 0, proc.stderr
        y, sr = sf.read(tmp_path / f"{name}.wav", dtype="float32", always_2d=True)
        assert sr == 22050 and y.shape == (int(0.35 * 22050), 2)
        outs.append(y)
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])
    codec = codecport.load(tiny_snac_export)
    want, _ = codec.decode(codecport.load_codes(tmp_path / "c.npz"), noise="zero")
    np.testing.assert_array_equal(outs[3].T, np.clip(want, -1, 1))
    both = run("decode", tmp_path / "c.npz", "-m", tiny_snac_export, "-o", tmp_path / "x.wav", "--no-noise",
               "--noise-seed", "1")
    assert both.returncode == 2 and "exclude each other" in both.stderr


def test_the_orpheus_layout_writes_and_reads_the_flat_sequence(tiny_snac_export, tmp_path):
    mono = tmp_path / "mono.wav"
    sf.write(mono, noise(5000, seed=13)[0], 16000, subtype="FLOAT")
    out = tmp_path / "o.npy"
    proc = run("encode", mono, "-m", tiny_snac_export, "-o", out, "--layout", "orpheus")
    assert proc.returncode == 0, proc.stderr
    flat = np.load(out)
    codec = codecport.load(tiny_snac_export)
    codes = codec.encode_file(mono)
    assert flat.ndim == 1 and flat.shape[0] == 7 * codes.n_frames[0]
    np.testing.assert_array_equal(flat, to_orpheus(codes.arrays)[0])
    back = codecport.load_codes(out, layout="orpheus")  # the API reads the layout too
    assert all(np.array_equal(a, b) for a, b in zip(back.arrays, codes.arrays, strict=True))
    proc = run("decode", out, "--layout", "orpheus", "-m", tiny_snac_export, "-o", tmp_path / "o.wav",
               "--noise-seed", "2")
    assert proc.returncode == 0, proc.stderr
    y, sr = sf.read(tmp_path / "o.wav", dtype="float32")
    bare = codes.replace(sample_rate=None, num_samples=None)
    assert sr == 16000 and y.shape == (7 * codes.n_frames[0] // 7 * 4 * 6,)  # whole coarse frames, no length
    np.testing.assert_array_equal(y, np.clip(codec.decode(bare, noise=2)[0][0], -1, 1))
    wrong = run("encode", mono, "-m", tiny_snac_export, "-o", tmp_path / "o.npz", "--layout", "orpheus")
    assert wrong.returncode == 1 and "the orpheus layout is written as .npy" in wrong.stderr
    bare_npy = run("encode", mono, "-m", tiny_snac_export, "-o", tmp_path / "b.npy")
    assert bare_npy.returncode == 1 and "write .npz (or a flat layout: --layout orpheus)" in bare_npy.stderr
    assert not (tmp_path / "b.npy").exists()
    for empty in (np.zeros((0, 7), np.int64), np.zeros(0, np.int64)):  # no channel, no frame
        np.save(tmp_path / "e.npy", empty)
        proc = run("decode", tmp_path / "e.npy", "--layout", "orpheus", "-m", tiny_snac_export,
                   "-o", tmp_path / "e.wav")
        assert proc.returncode == 1 and proc.stderr.startswith("error: ") and \
            "7 codes a coarse frame" in proc.stderr
        assert proc.stderr.count("e.npy") == 1 and not (tmp_path / "e.wav").exists(), proc.stderr


def test_tokenize_writes_every_time_scale(tiny_snac_export, wav, tmp_path):
    proc = run("tokenize", wav, "-m", tiny_snac_export, "-o", tmp_path / "tok", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    import pyarrow.dataset as pads

    [row] = pads.dataset(tmp_path / "tok", format="parquet").to_table().to_pylist()
    codes = codecport.load(tiny_snac_export).encode_file(wav)
    assert row["n_codebooks"] == 3 and row["n_frames"] == codes.n_frames[0]
    for i, a in enumerate(codes.arrays):
        np.testing.assert_array_equal(np.array(row["codes" if i == 0 else f"codes_{i}"]), a)


def test_info_names_the_graphs_and_the_export_their_receptive_field(tiny_snac_export):
    proc = run("info", tiny_snac_export)
    assert proc.returncode == 0 and "snac tiny" in proc.stdout and "decoder step" in proc.stdout
    info = json.loads(run("info", tiny_snac_export, "--json").stdout)
    graphs = {Path(p).stem: m for p, m in info["graphs"].items()}
    assert {k: int(m["margin"]) for k, m in graphs.items() if "margin" in m} == {"encoder": 28, "decoder": 28}
    # The step decoders state their delay (the decoder's right context) instead of a margin.
    assert {k: int(m["delay"]) for k, m in graphs.items() if "delay" in m} == {
        "decoder_step": 149, "decoder_slots": 149, "decoder_slots_s2": 149}
