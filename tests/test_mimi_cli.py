"""Mimi through the real console scripts: export a tiny model, then encode and decode files
against the torch reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
from mimi_cli_support import (
    CLIPS,
    FIXED_LEN,
    FRAME,
    GRAPHS,
    SR,
    STEP_FRAMES,
    K,
    assert_one_line_error,
    cli,
    frames_of,
    read_wav,
    run,
    write_wav,
)

from codecport.runtime.audio import read_audio, resample


# ---- export and info ----------------------------------------------------------------------
def test_export_writes_the_folder(exports):
    out, proc = exports["main"]
    assert "RANDOM weights (seed 0)" in proc.stderr
    assert f"fixed graphs : {FIXED_LEN} samples" in proc.stdout
    assert f"step graphs  : {STEP_FRAMES * FRAME} samples <-> {STEP_FRAMES} frames" in proc.stdout
    validated = [ln.split()[0] for ln in proc.stdout.splitlines() if "validated vs torch" in ln]
    assert sorted(validated) == sorted(GRAPHS)
    for name in ("rvq.npz", "manifest.json"):
        assert name in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted([*GRAPHS, "rvq.npz", "manifest.json"])


def test_info_says_mimi(model_dir):
    out = cli("codec-run", "info", model_dir).stdout
    assert out.startswith(f"{model_dir}: mimi tiny, 24000 Hz, 1000 frames/s, 4 codebooks of 64, "
                          "quantizer numpy")
    for name in GRAPHS:
        assert f"{model_dir / name}: {name.split('.')[0].split('_')[0]}" in out
    info = json.loads(cli("codec-run", "info", model_dir, "--json").stdout)
    assert {g["codec"] for g in info["graphs"].values()} == {"mimi"} and len(info["graphs"]) == len(GRAPHS)
    assert info["manifest"]["preset"] == "tiny" and info["manifest"]["quantizer"] == "numpy"


# ---- encode -------------------------------------------------------------------------------
@pytest.mark.parametrize("clip, mode", [("short", "fixed graph"), ("long", "step graphs")])
def test_codes_equal_torch_encode(clips, model_dir, encode, torch_codes, clip, mode):
    n, sr, _, _ = CLIPS[clip]
    codes, stdout = encode(clips[clip], model_dir)
    assert codes.shape == (1, K, frames_of(n, sr)) and codes.dtype == np.int64
    assert f"resampling {sr} Hz" not in stdout  # a diagnostic: stderr
    assert f"[{mode}]" in stdout
    want = torch_codes(clips[clip])
    np.testing.assert_array_equal(codes, want)
    assert len(np.unique(codes)) > 20  # spread-out codes: the comparison means something


@pytest.mark.parametrize("clip", ["short", "long"])
def test_step_mode_gives_the_same_codes(clips, model_dir, encode, clip):
    codes, _ = encode(clips[clip], model_dir)
    streamed, stdout = encode(clips[clip], model_dir, "--mode", "step")
    assert "[step graphs]" in stdout
    np.testing.assert_array_equal(streamed, codes)


@pytest.mark.parametrize("clip", ["short", "long"])
def test_fewer_codebooks_are_a_prefix(clips, model_dir, encode, clip):
    codes, _ = encode(clips[clip], model_dir)
    two, stdout = encode(clips[clip], model_dir, "--codebooks", 2)
    assert two.shape == (1, 2, codes.shape[2])
    assert f"codes [1, 2, {codes.shape[2]}]" in stdout
    np.testing.assert_array_equal(two, codes[:, :2])


@pytest.mark.parametrize("clip", ["short_stereo", "long_stereo"])
def test_stereo_channels_are_encoded_alone(tmp_path, clips, model_dir, encode, clip):
    n, sr, _, _ = CLIPS[clip]
    codes, stdout = encode(clips[clip], model_dir)
    assert codes.shape == (2, K, frames_of(n, sr))
    assert f"2 ch x {n} samples @ {sr} Hz" in stdout
    audio, _ = read_audio(clips[clip])
    for c in range(2):
        mono, _ = encode(write_wav(tmp_path / f"ch{c}.wav", audio[c:c + 1], sr), model_dir)
        np.testing.assert_array_equal(codes[c:c + 1], mono)
    assert not np.array_equal(codes[0], codes[1])


# ---- decode -------------------------------------------------------------------------------
@pytest.mark.parametrize("clip", ["short", "long"])
@pytest.mark.parametrize("streaming", [False, True])
def test_npy_decode_equals_torch_decode(tmp_path, clips, model_dir, encode, torch_audio, clip, streaming):
    codes, _ = encode(clips[clip], model_dir)
    np.save(tmp_path / "c.npy", codes)
    out = tmp_path / "out.wav"
    proc = cli("codec-run", "decode", tmp_path / "c.npy", "-m", model_dir, "-o", out,
               *(["--mode", "step"] if streaming else []))
    y, sr = read_wav(out)
    n = codes.shape[2] * FRAME
    assert (sr, y.shape) == (SR, (1, n))
    assert f"1 ch x {n} samples @ {SR} Hz" in proc.stdout
    ref = torch_audio(codes)
    assert np.abs(ref).max() > 1e-2  # audio-scale output, not near-silence
    assert np.abs(y - np.clip(ref, -1, 1)).max() <= 1e-4


def test_fewer_codebooks_decode_equals_torch(tmp_path, clips, model_dir, encode, torch_audio):
    two, _ = encode(clips["short"], model_dir, "--codebooks", 2)
    np.save(tmp_path / "two.npy", two)
    cli("codec-run", "decode", tmp_path / "two.npy", "-m", model_dir, "-o", tmp_path / "o.wav")
    y, _ = read_wav(tmp_path / "o.wav")
    assert np.abs(y - np.clip(torch_audio(two), -1, 1)).max() <= 1e-4


@pytest.mark.parametrize("clip", ["short", "long", "long_stereo"])
def test_npz_round_trip_gives_the_original_length_and_rate(tmp_path, clips, model_dir, encode,
                                                           torch_audio, clip):
    n, sr, ch, _ = CLIPS[clip]
    npz = tmp_path / "c.npz"
    cli("codec-run", "encode", clips[clip], "-m", model_dir, "-o", npz)
    with np.load(npz, allow_pickle=False) as z:
        assert str(z["codec"]) == "mimi" and (int(z["num_samples"]), int(z["sample_rate"])) == (n, sr)
        assert str(z["export_id"]) == json.loads((model_dir / "manifest.json").read_text())["export_id"]
        codes = z["codes_0"]
    np.testing.assert_array_equal(codes, encode(clips[clip], model_dir)[0])

    out = tmp_path / "out.wav"
    proc = cli("codec-run", "decode", npz, "-m", model_dir, "-o", out)
    assert f"{ch} ch x {n} samples @ {sr} Hz" in proc.stdout
    y, sr_out = read_wav(out)
    assert (sr_out, y.shape) == (sr, (ch, n))
    # What the CLI does: decode at 24 kHz, resample back, trim to the original length.
    want = np.clip(resample(torch_audio(codes), SR, sr)[:, :n], -1, 1)
    assert np.abs(y - want).max() <= 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npz", "out.wav"]  # no .part left


# ---- in-graph quantizer -------------------------------------------------------------------
def test_in_graph_quantizer_export(exports):
    out, proc = exports["in_graph"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*GRAPHS, "manifest.json"])  # no rvq.npz
    assert sum("codes identical" in ln for ln in proc.stdout.splitlines()) == 2
    graphs = json.loads(cli("codec-run", "info", out, "--json").stdout)["graphs"].values()
    assert [(g["quantizer"], g["n_codebooks"]) for g in graphs] == [("graph", "3")] * len(GRAPHS)


@pytest.mark.parametrize("clip", ["short", "long"])
def test_in_graph_quantizer_encode_decode(tmp_path, clips, in_graph, encode, torch_codes, torch_audio,
                                          clip):
    codes, _ = encode(clips[clip], in_graph)  # default: all 3 the graphs hold
    assert codes.shape == (1, 3, frames_of(*CLIPS[clip][:2]))
    # Residual levels are nested: torch's codes with 3 levels are the first 3 of all 4.
    np.testing.assert_array_equal(codes, torch_codes(clips[clip])[:, :3])
    if clip == "short":
        streamed, stdout = encode(clips[clip], in_graph, "--mode", "step")
        assert "[step graphs]" in stdout
        np.testing.assert_array_equal(streamed, codes)

    np.save(tmp_path / "c.npy", codes)
    cli("codec-run", "decode", tmp_path / "c.npy", "-m", in_graph, "-o", tmp_path / "o.wav")
    y, sr = read_wav(tmp_path / "o.wav")
    assert (sr, y.shape) == (SR, (1, codes.shape[2] * FRAME))
    assert np.abs(y - np.clip(torch_audio(codes), -1, 1)).max() <= 1e-4


def test_in_graph_quantizer_refuses_other_codebook_counts(tmp_path, clips, in_graph):
    out = tmp_path / "c.npy"
    proc = run("codec-run", "encode", clips["short"], "-m", in_graph, "-o", out, "--codebooks", 4)
    assert "between 1 and 3, got 4" in assert_one_line_error(proc, out)
    np.save(tmp_path / "two.npy", np.zeros((1, 2, 5), np.int64))
    out = tmp_path / "o.wav"
    proc = run("codec-run", "decode", tmp_path / "two.npy", "-m", in_graph, "-o", out)
    assert "exactly 3 codebooks, got 2" in assert_one_line_error(proc, out)
