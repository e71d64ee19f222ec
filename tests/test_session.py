"""Provider options: codecport's defaults per EP, overridden from the API and the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_support import invoke

from codecport.codecs.mimi.runtime import MimiCodec
from codecport.errors import ProviderError
from codecport.runtime.providers import (
    DEFAULT_OPTIONS,
    SPIN_ENV,
    provider_options,
    resolve_provider,
    session_options,
)

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


def test_spinning_is_on_unless_the_environment_turns_it_off(tiny_mimi_export, monkeypatch):
    spin = lambda: session_options().get_session_config_entry("session.intra_op.allow_spinning")
    monkeypatch.delenv(SPIN_ENV, raising=False)
    assert spin() == "1"
    monkeypatch.setenv(SPIN_ENV, "0")
    assert spin() == "0"
    monkeypatch.setenv(SPIN_ENV, "off")
    with pytest.raises(ProviderError, match=f"{SPIN_ENV} must be 0 or 1, got 'off'"):
        MimiCodec(tiny_mimi_export).encode(np.zeros((1, 480), np.float32), 24000)


def test_cli_option_syntax(tmp_path, tiny_mimi_export):
    codes = tmp_path / "c.npy"
    np.save(codes, np.zeros((1, 4, 5), np.int64))
    out = tmp_path / "o.wav"
    run = lambda *a: invoke("codec-run", "decode", codes, "-m", tiny_mimi_export, "-o", out, *a)
    bad = run("--provider-option", "no-equals-sign")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr and not out.exists()
    ok = run("--provider-option", "some_option=1")
    assert ok.returncode == 0, ok.stderr
    assert out.is_file()


def test_a_graph_is_opened_once_whatever_the_threads_asking(tiny_mimi_export, monkeypatch):
    """Threads of a server asking for the same graph at once get the one session."""
    import threading
    import time

    from codecport.runtime import folder

    opened, real = [], folder.open_graph

    def slow_open(path, *args, **kwargs):
        opened.append(path.name)
        time.sleep(0.2)  # every thread arrives while the first is still opening
        return real(path, *args, **kwargs)

    codec = MimiCodec(tiny_mimi_export)
    monkeypatch.setattr(folder, "open_graph", slow_open)
    got, start = [], threading.Barrier(8)

    def ask():
        start.wait()
        got.append(codec.graph("decoder_step"))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert opened == ["decoder_step.onnx"] and len({id(g) for g in got}) == 1


def test_blas_goes_to_one_thread_once_and_stays(tiny_mimi_export):
    """numpy's BLAS is put on one thread once, when the process makes its first RVQ, and stays
    there: codecs run from many threads (a server's) never take and give back the process-wide
    limit (a fresh process, so no other test has set it)."""
    code = """
import threading, sys
from threadpoolctl import ThreadpoolController, threadpool_info
import numpy as np
import codecport
from codecport.runtime import rvq

calls = []
real = ThreadpoolController.limit
ThreadpoolController.limit = lambda self, **kw: calls.append(kw) or real(self, **kw)
blas = lambda: {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}
before = blas()
codec = codecport.load(sys.argv[1])
after_load = blas()
seen = []
def run():
    for _ in range(3):
        codec.encode(np.zeros((1, 2000), np.float32), codec.sample_rate)
        seen.append(blas())
threads = [threading.Thread(target=run) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(before, after_load, set(map(frozenset, seen)), blas(), len(calls))
"""
    proc = subprocess.run([sys.executable, "-c", code, str(tiny_mimi_export)], capture_output=True,
                          text=True, check=True, timeout=120)
    assert proc.stdout.split("} ", 1)[1].strip() == "{1} {frozenset({1})} {1} 1", proc.stdout
    # A host that keeps its BLAS threads: never limited.
    proc = subprocess.run([sys.executable, "-c", code, str(tiny_mimi_export)], capture_output=True, text=True,
                          check=True, timeout=120, env={**os.environ, "CODECPORT_BLAS_THREADS": "keep"})
    before, rest = proc.stdout.split("} ", 1)
    assert rest.strip().endswith(" 0") and before + "}" == rest.split(" ")[0], proc.stdout


def test_cuda_libraries_are_preloaded_once_and_what_ort_prints_is_logged(monkeypatch, capsys, caplog):
    """onnxruntime-gpu finds pip's CUDA libraries only through `preload_dlls()`, which prints:
    called once per process before the first CUDA session, its words go to the log, not stdout
    (a codec-run whose stdout is its output would carry them)."""
    import logging

    from codecport.runtime import providers

    calls = []

    class FakeOrt:
        @staticmethod
        def preload_dlls():
            calls.append(1)
            print("Failed to load libcudnn.so.9: not found")

    monkeypatch.setattr(providers, "onnxruntime", lambda: FakeOrt)
    monkeypatch.setattr(providers, "_cuda_loaded", False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with caplog.at_level(logging.INFO, logger=providers.__name__):
        providers.load_cuda_libraries()
        providers.load_cuda_libraries()
    assert calls == [1] and capsys.readouterr().out == ""
    assert "Failed to load libcudnn.so.9" in caplog.text
    # A torch imported first has loaded its own CUDA libraries (ORT's documented order): no second copy.
    monkeypatch.setattr(providers, "_cuda_loaded", False)
    monkeypatch.setitem(sys.modules, "torch", object())
    providers.load_cuda_libraries()
    assert calls == [1]


def test_a_listed_provider_that_fails_to_start_is_one_error_or_the_fallback(tiny_mimi_export, monkeypatch):
    """onnxruntime-gpu lists CUDA whether or not its libraries load; when they do not, ORT runs the
    session on the CPU without a word. Without --fallback that is a ProviderError naming what to
    install; with --fallback cpu the folder runs on the CPU (the flag's promise)."""
    import onnxruntime

    from codecport.runtime import providers

    listed = [*onnxruntime.get_available_providers(), "CUDAExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: listed)
    monkeypatch.setattr(providers, "_cuda_loaded", False)
    with pytest.raises(ProviderError, match=r"CUDAExecutionProvider failed to initialise "
                                            r".*codecport\[gpu\].*--fallback cpu"):
        MimiCodec(tiny_mimi_export, provider="cuda")
    codec = MimiCodec(tiny_mimi_export, provider="cuda", fallback="cpu")
    assert codec.provider == "CPUExecutionProvider"
    assert codec.encode(np.zeros((1, 480), np.float32), 24000).n_frames == (20,)


def test_a_cpu_onnxruntime_written_over_the_gpu_one_is_named(monkeypatch):
    """`codecport[gpu]` installs onnxruntime-gpu beside the onnxruntime codecport needs; both write
    one package folder, so the CPU one installed (or upgraded) last hides CUDA. The error says
    that, and the reinstall that undoes it, rather than "install codecport[gpu]" again."""
    from importlib import metadata

    versions = {"onnxruntime": "1.32.0", "onnxruntime-gpu": "1.31.1"}

    def version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(metadata, "version", version)
    with pytest.raises(ProviderError, match=r"both installed .* pip install --force-reinstall --no-deps "
                                            r"onnxruntime-gpu==1\.31\.1, or pass --fallback cpu"):
        resolve_provider("cuda")
    del versions["onnxruntime-gpu"]
    with pytest.raises(ProviderError, match=r"install it with pip install 'codecport\[gpu\]'"):
        resolve_provider("cuda")
