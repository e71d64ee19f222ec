"""Provider options: codecport's defaults per EP, overridden from the API and the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from codecport.runtime.mimi import MimiCodec
from codecport.runtime.providers import DEFAULT_OPTIONS, provider_options

BIN = Path(sys.executable).parent


def test_defaults_and_overrides():
    coreml = provider_options("CoreMLExecutionProvider")
    assert coreml["ModelFormat"] == "MLProgram" and coreml["RequireStaticInputShapes"] == "1"
    assert provider_options("CUDAExecutionProvider")["cudnn_conv_algo_search"] == "EXHAUSTIVE"
    assert provider_options("CPUExecutionProvider") == {}
    custom = provider_options("CoreMLExecutionProvider", {"MLComputeUnits": "CPUAndNeuralEngine"})
    assert custom["MLComputeUnits"] == "CPUAndNeuralEngine" and custom["ModelFormat"] == "MLProgram"
    assert DEFAULT_OPTIONS["CoreMLExecutionProvider"]["MLComputeUnits"] == "ALL"  # not mutated


def test_options_reach_the_session(tiny_mimi_export):
    codec = MimiCodec(tiny_mimi_export, options={"some_option": "1"})
    assert codec.graph("encoder").provider == "CPUExecutionProvider"  # CPU takes no options
    codes = codec.encode(np.zeros((1, 480), np.float32), 24000)
    assert codes.n_frames == (20,)


def test_cli_option_syntax(tmp_path, tiny_mimi_export):
    codes = tmp_path / "c.npy"
    np.save(codes, np.zeros((1, 4, 5), np.int64))
    out = tmp_path / "o.wav"
    run = lambda *a: subprocess.run([str(BIN / "codec-run"), "decode", str(codes), "-m",
                                     str(tiny_mimi_export), "-o", str(out), *a],
                                    capture_output=True, text=True, check=False, timeout=120)
    bad = run("--provider-option", "no-equals-sign")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr and not out.exists()
    ok = run("--provider-option", "some_option=1")
    assert ok.returncode == 0, ok.stderr
    assert out.is_file()
