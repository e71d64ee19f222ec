"""Bad input to an XCodec2 export: codes of NeuCodec's export (the same model, another codec),
codes out of range, audio that is not finite, a graph whose alignment metadata is damaged. One
line each, exit 1, no output file left."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from cli_support import invoke
from mimi_cli_support import assert_one_line_error
from shared_exports import damaged_copy
from support import noise

import codecport
from codecport.errors import ModelFileError


def test_neucodec_codes_are_not_xcodec2s(smoke_exports, tmp_path):
    wav, out = tmp_path / "a.wav", tmp_path / "o.wav"
    sf.write(wav, noise(3000)[0], 16000)
    assert invoke("codec-run", "encode", wav, "-m", smoke_exports["neucodec"],
                  "-o", tmp_path / "n.npz").returncode == 0
    line = assert_one_line_error(invoke("codec-run", "decode", tmp_path / "n.npz",
                                        "-m", smoke_exports["xcodec2"], "-o", out), out)
    assert "holds neucodec codes, not xcodec2" in line


def test_bad_codes_and_audio_are_one_line(smoke_exports, tmp_path):
    model, out = smoke_exports["xcodec2"], tmp_path / "out.wav"
    np.save(tmp_path / "big.npy", np.full((1, 1, 4), 64, np.int64))
    line = assert_one_line_error(invoke("codec-run", "decode", tmp_path / "big.npy", "-m", model,
                                        "-o", out), out)
    assert "codes must be in [0, 64)" in line
    sf.write(tmp_path / "nan.wav", np.full(4000, np.nan, np.float32), 16000, subtype="FLOAT")
    out = tmp_path / "c.npz"
    line = assert_one_line_error(invoke("codec-run", "encode", tmp_path / "nan.wav", "-m", model,
                                        "-o", out), out)
    assert "contains NaN or infinite samples" in line, line
    # Finite but of no audio's amplitude: the features overflowed into codes of nothing, written.
    sf.write(tmp_path / "loud.wav", np.full(4000, 1e20, np.float32), 16000, subtype="FLOAT")
    line = assert_one_line_error(invoke("codec-run", "encode", tmp_path / "loud.wav", "-m", model,
                                        "-o", out), out)
    assert "samples reach 1e+20" in line, line


@pytest.mark.parametrize("key, value, match", [
    ("acoustic_extra", "1", "its inputs/outputs are"),  # the encoder's input says otherwise
    ("fbank_pad", "x", "not an integer"),
    ("acoustic_extra", "99", "outside"),
])
def test_damaged_alignment_metadata_is_refused(smoke_exports, tmp_path, key, value, match):
    bad = damaged_copy(smoke_exports["xcodec2"], tmp_path / "model", "encoder", key, value)
    with pytest.raises(ModelFileError, match=match):
        codecport.load(bad).graph("encoder")
