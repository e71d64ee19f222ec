"""Bad input to Qwen3-TTS's tokenizer: one `error:` line, a non-zero exit, no output file, for
audio, codes and weights (config, files, a checkpoint that would unpickle code)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from cli_support import invoke, process
from support import noise

OFFICIAL = Path(__file__).parent / "data" / "qwen3tts-official"


def one_line_error(r, out: Path | None = None) -> str:
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error:"), r.stderr
    assert out is None or not out.exists()
    return lines[-1]


@pytest.mark.parametrize("audio, says", [
    (np.zeros(0, np.float32), "no samples"),
    (np.array([0.1, np.nan, 0.2] * 10, np.float32), "NaN"),
])
def test_bad_audio(smoke_exports, tmp_path, audio, says):
    sf.write(tmp_path / "a.wav", audio, 24000, subtype="FLOAT")
    out = tmp_path / "c.npy"
    r = process("codec-run", "encode", tmp_path / "a.wav", "-m", smoke_exports["qwen3tts"], "-o", out)
    assert says in one_line_error(r, out)


def test_a_clip_longer_than_the_encoder_in_the_fixed_mode(smoke_exports, tmp_path):
    sf.write(tmp_path / "a.wav", noise(481)[0], 24000, subtype="FLOAT")
    out = tmp_path / "c.npy"
    line = one_line_error(process("codec-run", "encode", tmp_path / "a.wav", "-m", smoke_exports["qwen3tts"],
                                  "-o", out, "--mode", "fixed"), out)
    assert "export with a longer --len, or use the windowed mode" in line


@pytest.mark.parametrize("codes, says", [
    (np.full((1, 4, 5), 64), "codes must be in [0, 64)"),
    (np.zeros((1, 3, 5), np.int64), "takes exactly 4 codebooks"),
    (np.zeros((1, 4, 5), np.float32), "integers"),
])
def test_bad_codes(smoke_exports, tmp_path, codes, says):
    np.save(tmp_path / "c.npy", codes)
    out = tmp_path / "o.wav"
    r = process("codec-run", "decode", tmp_path / "c.npy", "-m", smoke_exports["qwen3tts"], "-o", out)
    assert says in one_line_error(r, out)


def _weights(tmp_path: Path, edit) -> Path:
    d = tmp_path / "w"
    shutil.copytree(OFFICIAL, d, ignore=shutil.ignore_patterns("reference-*"))
    edit(d)
    return d


def _config(d: Path, **changes):
    conf = json.loads((d / "config.json").read_text())
    for key, value in changes.items():
        section, _, name = key.partition("__")
        (conf[section] if name else conf)[name or section] = value
    (d / "config.json").write_text(json.dumps(conf))


def _drop(d: Path, section: str, key: str):
    conf = json.loads((d / "config.json").read_text())
    del conf[section][key]
    (d / "config.json").write_text(json.dumps(conf))


class _Evil:
    def __reduce__(self):
        return (print, ("unpickled",))


@pytest.mark.parametrize("edit, says", [
    (lambda d: _config(d, model_type="qwen3_tts_tokenizer_25hz"), "not qwen3_tts_tokenizer_12hz"),
    (lambda d: _config(d, decoder_config__hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    (lambda d: _config(d, decoder_config__num_quantizers=3), "the decoder takes 3 codebooks"),
    # No heads: said as such, not as a ZeroDivisionError (head_dim's default divides by them) nor
    # as the key-value heads' fault (compared with them).
    (lambda d: (_config(d, decoder_config__num_attention_heads=0, decoder_config__num_key_value_heads=0),
                _drop(d, "decoder_config", "head_dim")), "num_attention_heads=0 is outside [1, 256]"),
    (lambda d: _config(d, decoder_config__num_attention_heads=0), "num_attention_heads=0 is outside"),
    (lambda d: (d / "config.json").unlink(), "no config.json"),
    (lambda d: (d / "config.json").write_text("{"), "unreadable config"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\0" * 100), "model.safetensors"),
    (lambda d: ((d / "model.safetensors").unlink(), (d / "pytorch_model.bin").write_bytes(
        pickle.dumps({"x": _Evil()}))), "pytorch_model.bin"),
])
def test_bad_weights(tmp_path, edit, says):
    d = _weights(tmp_path, edit)
    out = tmp_path / "o"
    r = invoke("codec-export", "qwen3tts", "--weights", d, "--len", 960, "-o", out)
    assert says in one_line_error(r) and "unpickled" not in r.stdout + r.stderr
    assert not out.exists()


def test_a_state_dict_of_other_shapes(tmp_path):
    """The weights of a smaller decoder under a config that says otherwise: named, not loaded."""
    d = _weights(tmp_path, lambda d: _config(d, decoder_config__latent_dim=40))
    r = invoke("codec-export", "qwen3tts", "--weights", d, "--len", 960, "-o", tmp_path / "o")
    assert "decoder." in one_line_error(r)


def test_the_bin_beside_is_read_without_unpickling_code(tmp_path):
    """pytorch_model.bin alone (the official save writes both): read with weights_only."""
    import torch
    from safetensors.torch import load_file

    d = _weights(tmp_path, lambda d: None)
    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    r = invoke("codec-export", "qwen3tts", "--weights", d, "--len", 960, "-o", tmp_path / "o")
    assert r.returncode == 0 and "codes identical" in r.stdout, r.stderr
