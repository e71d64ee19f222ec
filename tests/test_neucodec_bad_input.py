"""Bad input to a NeuCodec export: codes of the wrong shape, range or codec, audio too short or
not finite, a clip past the graphs in the fixed mode, damaged graphs. One line each, exit 1, no
output file left."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from cli_support import invoke
from conftest import noise
from mimi_cli_support import assert_one_line_error
from shared_exports import damaged_copy

import codecport
from codecport.errors import CodecportError, CodesError, ModelFileError


def run(*args):
    """`codec-run ARGS` in this process (cli_support.py)."""
    return invoke("codec-run", *args)


@pytest.fixture(scope="module")
def model(smoke_exports) -> Path:
    return smoke_exports["neucodec"]


@pytest.mark.parametrize("codes, match", [
    (np.full((1, 1, 4), 64, np.int64), r"codes must be in \[0, 64\)"),
    (np.full((1, 1, 4), -1, np.int64), r"codes must be in \[0, 64\)"),
    (np.zeros((1, 2, 4), np.int64), r"codebooks<=1"),
    (np.zeros((1, 1, 4), np.float32), "must be integers"),
    (np.zeros((1, 1, 0), np.int64), "frame"),
])
def test_bad_codes_are_one_line(model, tmp_path, codes, match):
    path, out = tmp_path / "bad.npy", tmp_path / "out.wav"
    np.save(path, codes)
    line = assert_one_line_error(run("decode", path, "-m", model, "-o", out), out)
    assert re.search(match, line), line


def test_codes_of_another_codec_or_preset_are_refused(model, smoke_exports, tmp_path):
    wav, out = tmp_path / "a.wav", tmp_path / "o.wav"
    sf.write(wav, noise(3000)[0], 16000)
    assert run("encode", wav, "-m", smoke_exports["dac"], "-o", tmp_path / "d.npz").returncode == 0
    line = assert_one_line_error(run("decode", tmp_path / "d.npz", "-m", model, "-o", out), out)
    assert "holds dac codes, not neucodec" in line


def test_bad_audio_is_one_line(model, tmp_path):
    out = tmp_path / "c.npz"
    for name, audio, match in (("short.wav", np.zeros(100, np.float32), "under one NeuCodec frame"),
                               ("nan.wav", np.full(4000, np.nan, np.float32), "NaN|not finite"),
                               ("empty.wav", np.zeros(0, np.float32), "no audio|empty|under one")):
        sf.write(tmp_path / name, audio, 16000, subtype="FLOAT")
        line = assert_one_line_error(run("encode", tmp_path / name, "-m", model, "-o", out), out)
        assert re.search(match, line), (name, line)
    (tmp_path / "junk.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    assert_one_line_error(run("encode", tmp_path / "junk.wav", "-m", model, "-o", out), out)


def test_bad_calls_of_the_api(model):
    codec = codecport.load(model)
    with pytest.raises(CodesError, match="one codebook"):
        codec.encode(noise(3000), 16000, n_codebooks=2)
    with pytest.raises(CodecportError, match="has no step mode"):
        codec.encode(noise(3000), 16000, mode="step")
    with pytest.raises(CodecportError, match="has no encoder stream"):
        codec.encoder_stream()
    with pytest.raises(CodesError, match=r"codes must be in \[0, 64\)"):
        codec.decoder_stream().push(np.full((1, 3), 64, np.int64))
    with pytest.raises(CodesError, match="draws no noise"):
        codec.decode(np.zeros((1, 1, 3), np.int64), noise=1)


@pytest.mark.parametrize("graph, key, value, match", [
    ("encoder", "frames", "30", "its inputs/outputs are"),
    ("decoder", "levels", "4,4", "does not belong|disagree"),
    ("encoder", "levels", "4,x", "not a list of integers"),
    ("decoder", "input_rate", "8000", "does not belong|disagree"),
])
def test_a_damaged_graph_is_refused_when_opened(model, tmp_path, graph, key, value, match):
    bad = damaged_copy(model, tmp_path / "model", graph, key, value)
    with pytest.raises(ModelFileError, match=match):
        c = codecport.load(bad)
        c.graph("encoder")
        c.graph("decoder")
