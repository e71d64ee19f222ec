"""Bad input to a NeuCodec export: codes of the wrong shape, range or codec, audio too short or
not finite, a clip past the graphs in the fixed mode, damaged graphs. One line each, exit 1, no
output file left."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from cli_support import invoke
from mimi_cli_support import assert_one_line_error
from shared_exports import damaged_copy
from support import noise

import codecport
from codecport.codecs.neucodec.fsq import Fsq
from codecport.codecs.neucodec.runtime import NeuCodecCodec
from codecport.errors import AudioError, CodecportError, CodesError, ModelFileError
from codecport.runtime.audio import ArraySource, audio_format
from codecport.runtime.codes import Codes
from codecport.runtime.stream import StreamState, as_pcm


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
    ("encoder", "levels", "64,1,1", r"levels='64,1,1' is outside \[2, .*damaged"),  # an FSQ level of 1
])
def test_a_damaged_graph_is_refused_when_opened(model, tmp_path, graph, key, value, match):
    bad = damaged_copy(model, tmp_path / "model", graph, key, value)
    with pytest.raises(ModelFileError, match=match):
        c = codecport.load(bad)
        c.graph("encoder")
        c.graph("decoder")


def test_an_output_format_that_cannot_hold_the_audio_is_refused_before_decoding(model, tmp_path, monkeypatch):
    np.save(tmp_path / "nine.npy", np.zeros((9, 1, 4), np.int64))  # 9 channels: FLAC holds 8
    monkeypatch.setattr(NeuCodecCodec, "_decode_window", lambda *a: pytest.fail("decoded before refusing"))
    out = tmp_path / "y.flac"
    proc = run("decode", tmp_path / "nine.npy", "-m", model, "-o", out)
    line = assert_one_line_error(proc, out)
    assert proc.returncode == 1 and "FLAC holds at most 8 channels" in line and ".wav" in line, line
    with pytest.raises(AudioError, match="MP3 cannot be written at 1000 Hz .*8000, 11025"):
        codecport.write_audio(tmp_path / "a.mp3", np.zeros((1, 10), np.float32), 1000)
    with pytest.raises(AudioError, match="at most 200000 Hz"):  # libvorbis would crash the process
        audio_format(tmp_path / "a.ogg", 1, 0, 250_000)
    assert not list(tmp_path.glob("a.*"))


def test_audio_of_absurd_amplitude_is_refused_not_encoded(model, tmp_path):
    sf.write(tmp_path / "loud.wav", np.full(4000, 1e20, np.float32), 16000, subtype="FLOAT")
    out = tmp_path / "c.npz"
    proc = run("encode", tmp_path / "loud.wav", "-m", model, "-o", out)
    line = assert_one_line_error(proc, out)
    assert proc.returncode == 1 and "samples reach 1e+20" in line and "[-1, 1]" in line, line
    codec = codecport.load(model)
    with pytest.raises(AudioError, match="samples reach"):
        codec.encode(noise(3000) * np.float32(1e30), 16000)
    # what every encoder stream (Mimi's, a server's) takes
    with pytest.raises(AudioError, match="samples reach"):
        as_pcm(np.full(4, -1e20, np.float32))
    # Past the reader: an encoder output that overflowed anyway is refused, not quantized or written.
    with pytest.raises(AudioError, match="not finite"):
        Fsq([4, 4, 4]).indices(np.full((3, 3), np.nan, np.float32))
    with pytest.raises(AudioError, match=r"codes outside \[0, 64\)"):
        codec.codes([np.full((1, 1, 3), -(1 << 31), np.int64)], ArraySource(noise(3000), 16000), 3000)


def test_codes_of_more_channels_than_audio_has_are_refused(model, tmp_path):
    np.save(tmp_path / "tokens.npy", np.zeros((2000, 1, 1), np.int64))  # LLM tokens saved as [T, 1, 1]
    out = tmp_path / "o.wav"
    line = assert_one_line_error(run("decode", tmp_path / "tokens.npy", "-m", model, "-o", out), out)
    assert "2000 channels" in line and "[channels, codebooks, frames]" in line, line
    with pytest.raises(CodesError, match="65 channels, more than 64"):
        Codes((np.zeros((65, 1, 1), np.int64),))


@pytest.mark.parametrize("changes, match", [
    (lambda m: {"levels": "64,1,1"}, r"levels='64,1,1' is outside \[2, "),
    # Twice the rate in and out: the frame sizes still agree, the 16 kHz features would not.
    (lambda m: {"input_rate": "32000", "sample_rate": str(2 * int(m["sample_rate"]))},
     "input rate is 32000 Hz, NeuCodec encodes 16000 Hz"),
])
def test_a_manifest_of_impossible_facts_is_a_damaged_folder(model, tmp_path, changes, match):
    """A folder opened for its facts alone (a tokenizing driver's) reads them from its manifest,
    through the same checks as the graphs' metadata."""
    bad = tmp_path / "model"
    bad.mkdir()
    for f in model.iterdir():
        if f.name != "manifest.json":
            (bad / f.name).symlink_to(f)
    manifest = json.loads((model / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps({**manifest, **changes(manifest)}))
    with pytest.raises(ModelFileError, match=match):
        NeuCodecCodec(bad, sessions=False)


@pytest.mark.parametrize("arrays, faded, match", [
    ({"codes": np.array([1.5, 2.0])}, False, "must be integers"),
    ({"codes": np.array([3, 64])}, False, r"codes must be in \[0, 64\)"),
    ({"codes": np.zeros(25, np.int64)}, False, "holds 25 codes"),  # a whole window push would have run
    ({"codes": np.zeros(6, np.int64), "tail": np.zeros(3, np.float32)}, True, "3 samples of overlap"),
])
def test_a_stream_state_that_is_not_this_streams_is_refused(model, arrays, faded, match):
    stream = codecport.load(model).decoder_stream()
    state = StreamState(stream.kind, {"tail": np.zeros(0, np.float32), **arrays}, {"faded": faded})
    with pytest.raises(CodesError, match=match):
        stream.state = state


@pytest.mark.parametrize("conf, match", [
    ('{"num_attention_heads": 1, "layer_norm_eps": -1.0}', "not valid"),
    ('{"num_attention_heads": 1, "layer_norm_eps": NaN}', "not valid"),  # json reads NaN
    ('{"num_attention_heads": true, "layer_norm_eps": 1e-5}', "not valid"),  # not one head
    ('{"x": ' + "[" * 100000 + "]" * 100000 + "}", "not a JSON config"),  # past the parser's depth
])
def test_a_distilhubert_config_it_would_not_compute_is_refused(tmp_path, conf, match):
    """A config.json beside the distilled weights that would build a model ORT refuses, or
    another than it says (`true` heads), or that the JSON parser cannot follow: one line."""
    from codecport.codecs.neucodec.config import PRESETS
    from codecport.codecs.neucodec.weights import hubert_facts
    from codecport.errors import CheckpointError

    (tmp_path / "config.json").write_text(conf)
    (tmp_path / "preprocessor_config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=match):
        hubert_facts(PRESETS["tiny-distill"], tmp_path / "config.json", tmp_path / "preprocessor_config.json")


@pytest.mark.parametrize("data", [b"\x80\x02b.", b"\x80\x02]q\x00(K\x01e."])
def test_a_damaged_pickle_is_one_checkpoint_error(tmp_path, data):
    """torch's weights-only unpickler fails a damaged file in its own terms (IndexError for a
    BUILD with nothing on the stack, a list where a dict belongs): one line, no code run."""
    from codecport.errors import CheckpointError
    from codecport.models.checkpoint import load_torch

    (tmp_path / "pytorch_model.bin").write_bytes(data)
    with pytest.raises(CheckpointError, match="pytorch_model.bin: (not a readable torch checkpoint|refused)"):
        load_torch(tmp_path / "pytorch_model.bin", "pass the official file")


def test_metadata_that_misaligns_the_two_paths_is_refused_when_opened(model, tmp_path):
    """Every graph and the manifest agreeing on a `fbank_pad` that gives the semantic path
    another row count than the graph's frames: refused as the encoder opens (it was a numpy
    broadcast error at the first encode). A lying `acoustic_extra` changes the audio's shape,
    which the shapes' check refuses."""
    key, value = "fbank_pad", "160"
    import onnx

    bad = tmp_path / "model"
    shutil.copytree(model, bad)
    for path in bad.glob("*.onnx"):
        graph = onnx.load(str(path))
        for p in graph.metadata_props:
            if p.key == key:
                p.value = value
        onnx.save(graph, str(path))
    manifest = json.loads((bad / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps({**manifest, key: value}))
    with pytest.raises(ModelFileError, match=r"give \d+ feature rows for its \d+ frames"):
        codecport.load(bad).graph("encoder")
