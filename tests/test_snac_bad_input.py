"""Bad input to a SNAC export: codes of the wrong shape, range or layout, a stream fed wrongly,
noise settings where no noise is drawn, damaged graphs and RVQ files. One line each, exit 1, no
output file left."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from cli_support import invoke
from mimi_cli_support import assert_one_line_error
from shared_exports import damaged_copy
from support import noise

import codecport
from codecport.codecs.snac.codesfile import from_orpheus, to_orpheus
from codecport.errors import CodecportError, CodesError, ModelFileError
from codecport.runtime.codes import Codes

BIN = Path(sys.executable).parent


def run(*args):
    """`codec-run ARGS` in this process (cli_support.py)."""
    return invoke("codec-run", *args)


@pytest.fixture(scope="module")
def codec(tiny_snac_export):
    return codecport.load(tiny_snac_export)


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, codec=np.array("snac"), **arrays)
    return path


@pytest.mark.parametrize("arrays, match", [
    ({"codes_0": np.zeros((1, 3), np.int64)}, "3 time scales"),
    ({"codes_0": np.zeros((1, 3), np.int64), "codes_1": np.zeros((1, 6), np.int64),
      "codes_2": np.zeros((1, 13), np.int64)}, "do not nest"),
    ({"codes_0": np.zeros((1, 3), np.int64), "codes_1": np.zeros((1, 6), np.int64),
      "codes_2": np.full((1, 12), 64, np.int64)}, r"codes must be in \[0, 64\)"),
    ({"codes_0": np.zeros((1, 3), np.float32), "codes_1": np.zeros((1, 6), np.int64),
      "codes_2": np.zeros((1, 12), np.int64)}, "must be integers"),
    ({"codes_0": np.zeros((2, 3), np.int64), "codes_1": np.zeros((1, 6), np.int64),
      "codes_2": np.zeros((1, 12), np.int64)}, "disagree on the channel count"),
])
def test_bad_codes_files_are_one_line(tiny_snac_export, tmp_path, arrays, match):
    path = _npz(tmp_path / "bad.npz", **arrays)
    out = tmp_path / "out.wav"
    line = assert_one_line_error(run("decode", path, "-m", tiny_snac_export, "-o", out), out)
    assert re.search(match, line), line


def test_bad_orpheus_sequences_are_one_line(tiny_snac_export, tmp_path):
    out = tmp_path / "out.wav"
    for bad, match in ((np.zeros(13, np.int64), "7 codes a coarse frame"),
                       (np.zeros(14, np.float32), "integer codes"),
                       (np.full(14, 4096, np.int64), r"codes must be in \[0, 64\)"),
                       (np.zeros((1, 2, 7), np.int64), r"\[channels, 7 \* frames\]")):
        np.save(tmp_path / "o.npy", bad)
        line = assert_one_line_error(run("decode", tmp_path / "o.npy", "--layout", "orpheus",
                                         "-m", tiny_snac_export, "-o", out), out)
        assert re.search(match, line), line
    (tmp_path / "t.npy").write_bytes(b"\x93NUMPY\x01\x00garbage")
    assert_one_line_error(run("decode", tmp_path / "t.npy", "--layout", "orpheus", "-m", tiny_snac_export,
                              "-o", out), out)
    four = Codes(tuple(np.zeros((1, 1, n), np.int64) for n in (1, 2, 4, 8)))
    with pytest.raises(CodesError, match="3 time scales"):
        to_orpheus(four.arrays)
    assert Codes(tuple(from_orpheus(np.arange(14)))).n_frames == (2, 4, 8)


def test_a_layout_of_another_codec_is_refused(smoke_exports, tmp_path):
    wav = tmp_path / "a.wav"
    sf.write(wav, noise(3000)[0], 16000)
    out = tmp_path / "o.npy"
    line = assert_one_line_error(run("encode", wav, "-m", smoke_exports["dac"], "-o", out,
                                     "--layout", "orpheus"), out)
    assert "the orpheus layout is for snac codes; this folder holds dac" in line


def test_noise_settings_where_no_noise_is_drawn_are_refused(smoke_exports, tmp_path):
    dac = codecport.load(smoke_exports["dac"])
    codes = dac.encode(noise(3000), 16000)
    with pytest.raises(CodesError, match="draws no noise"):
        dac.decode(codes, noise=1)
    codes.save(tmp_path / "c.npz")
    out = tmp_path / "o.wav"
    line = assert_one_line_error(run("decode", tmp_path / "c.npz", "-m", smoke_exports["dac"], "-o", out,
                                     "--noise-seed", "1"), out)
    assert "DAC's decoder draws no noise" in line


def test_bad_calls_of_the_api(codec):
    x = noise(3000)
    with pytest.raises(CodesError, match="needs all 3; pass no codebook count"):
        codec.encode(x, 16000, n_codebooks=2)
    with pytest.raises(CodecportError, match="has no fixed mode"):
        codec.encode(x, 16000, mode="fixed")
    with pytest.raises(CodecportError, match="has no encoder stream: it streams only its decoder side"):
        codec.stream()
    codes = codec.encode(x, 16000)
    for noise_arg, match in ((-1, "must be >= 0"), ("loud", "noise 'loud'"), ([np.zeros(3)], "2 blocks"),
                             (True, "noise must be")):
        with pytest.raises(CodecportError, match=match):
            codec.decode(codes, noise=noise_arg)
    with pytest.raises(CodesError, match="must hold"):
        codec.decode(codes, noise=[np.zeros(5), np.zeros(5)])
    stream = codec.decode_stream(noise=0)
    for frame, match in (([[1], [1, 2]], "one array per time scale"), ([[1], [1], [1, 2, 3, 4]], "holds"),
                         ([[64], [1, 2], [1, 2, 3, 4]], r"codes must be in \[0, 64\)")):
        with pytest.raises(CodesError, match=match):
            stream.push(frame)
    stream.push([[1], [1, 2], [1, 2, 3, 4]])
    assert stream.received == 4  # the bad pushes left nothing behind
    many = codec.decode_stream(noise=0)
    many.push([[1] * 3, [1] * 6, [1] * 12])
    assert len(many.finish()) == 3 * 4 * 6


@pytest.mark.parametrize("graph, key, value, match", [
    ("encoder", "margin", "60", "do not make windows"),
    ("encoder", "margin", "-1", "outside"),
    ("encoder", "vq_strides", "4,x,1", "not a list of integers"),
    ("decoder", "unit_frames", "8", "does not belong"),
    ("encoder", "noise", "maybe", "not one of 0, 1"),
])
def test_a_damaged_graph_is_refused_when_opened(tiny_snac_export, tmp_path, graph, key, value, match):
    bad = damaged_copy(tiny_snac_export, tmp_path / "model", graph, key, value)
    with pytest.raises(ModelFileError, match=match):
        c = codecport.load(bad)
        c.graph("encoder")
        c.graph("decoder")


def test_an_rvq_file_of_other_strides_is_refused(tiny_snac_export, tmp_path):
    bad = tmp_path / "model"
    shutil.copytree(tiny_snac_export, bad)
    z = dict(np.load(bad / "rvq.npz"))
    z["strides"] = np.array([4, 1, 1])
    np.savez(bad / "rvq.npz", **z)
    with pytest.raises(ModelFileError, match="strides .* are not the graphs'"):
        codecport.load(bad)
    wav = tmp_path / "a.wav"
    sf.write(wav, noise(3000)[0], 16000)
    out = tmp_path / "c.npz"
    assert_one_line_error(run("encode", wav, "-m", bad, "-o", out), out)
