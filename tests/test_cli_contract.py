"""What every command promises, for every registered codec: --version, results on stdout and
diagnostics on stderr, the output suffix checked before any model is loaded, one line for any
failure (`error:` exit 1; `internal error:` exit 2, the traceback only with -v), and checkpoints
that are not checkpoints, or describe absurd models, refused in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from cli_support import invoke, process
from click.testing import CliRunner
from support import noise

from codecport import __version__, registry
from codecport.cli import export_cli, run_cli

BIN = Path(sys.executable).parent
NAMES = registry.names()


def run(tool: str, *args) -> subprocess.CompletedProcess:
    """The command in this process (cli_support.py): the contract does not depend on it."""
    return invoke(tool, *args)


def one_line_error(proc, prefix: str = "error:") -> str:
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith(prefix), proc.stderr
    return lines[-1]


@pytest.mark.parametrize("tool", ["codec-export", "codec-run"])
def test_version(tool):
    proc = process(tool, "--version")  # the installed console script
    assert proc.returncode == 0 and proc.stdout.strip() == f"{tool}, version {__version__}"


@pytest.mark.parametrize("name", NAMES)
def test_results_on_stdout_diagnostics_on_stderr(smoke_exports, tmp_path, name):
    wav = tmp_path / "in.wav"
    sf.write(wav, noise(3000).T, 11025, subtype="FLOAT")  # resampled: a diagnostic
    # One end-to-end run of the console script a codec: stdout and stderr of a real process.
    proc = process("codec-run", "encode", wav, "-m", smoke_exports[name], "-o", tmp_path / "c.npz")
    assert proc.returncode == 0, proc.stderr
    assert "resampling 11025 Hz" in proc.stderr and "resampling" not in proc.stdout
    assert proc.stdout.splitlines()[-1] == f"wrote {tmp_path / 'c.npz'}"
    info = json.loads(run("codec-run", "info", smoke_exports[name], "--json").stdout)
    assert info["manifest"]["codec"] == name and info["graphs"]


@pytest.mark.parametrize("name", NAMES)
def test_output_suffix_is_checked_before_the_model_is_loaded(smoke_exports, tmp_path, name):
    """The folder's graphs are garbage here, so loading a model would fail: the suffix error
    comes first because nothing is loaded before it is checked."""
    model = tmp_path / "model"
    shutil.copytree(smoke_exports[name], model)
    for graph in model.glob("*.onnx"):
        graph.write_bytes(b"garbage")
    wav = tmp_path / "in.wav"
    sf.write(wav, noise(300).T, 16000)
    line = one_line_error(run("codec-run", "encode", wav, "-m", model, "-o", tmp_path / "c.flac"))
    assert "codes are written as" in line
    np.save(tmp_path / "c.npy", np.zeros((1, 1, 2), np.int64))
    line = one_line_error(run("codec-run", "decode", tmp_path / "c.npy", "-m", model,
                              "-o", tmp_path / "o.mp5"))
    assert "not an audio format codecport writes" in line
    line = one_line_error(run("codec-run", "decode", tmp_path / "c.npy", "-m", model,
                              "-o", tmp_path / "o.wav"))
    assert "not a loadable model" in line and not (tmp_path / "o.wav").exists()


def _changed_input(path: Path) -> str:
    """Graph `path` with its last input renamed where it has several and that is not a state
    (a single input is fed by its place, whatever its name; a state's name is checked as the
    graph opens), else its first taking doubles, cast to what it took; what ORT will say."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path))
    inputs = model.graph.input
    rename = len(inputs) > 1 and not inputs[-1].name.endswith("_in")
    x = inputs[-1] if rename else inputs[0]
    old, new = x.name, x.name + "_in"
    for node in model.graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
    if rename:
        x.name = new
        said = new
    else:
        model.graph.node.insert(0, helper.make_node("Cast", [old], [new], to=x.type.tensor_type.elem_type))
        x.type.tensor_type.elem_type = TensorProto.DOUBLE
        said = "data type"
    onnx.save(model, str(path))
    return said


@pytest.mark.parametrize("name", NAMES)
def test_a_graph_whose_inputs_were_changed_is_one_line(smoke_exports, tmp_path, name):
    """A graph of the right shapes whose input was renamed, or retyped, by hand or by another
    tool: one `error:` line naming the file (it was an internal error at its first call), and no
    output written."""
    wav = tmp_path / "in.wav"
    sf.write(wav, noise(3000).T, 16000)
    codes = tmp_path / "c.npz"
    assert run("codec-run", "encode", wav, "-m", smoke_exports[name], "-o", codes).returncode == 0
    model = tmp_path / "model"
    shutil.copytree(smoke_exports[name], model)
    said = {graph.name: _changed_input(graph) for graph in model.glob("*.onnx")}
    for line in (one_line_error(run("codec-run", "encode", wav, "-m", model, "-o", tmp_path / "d.npz")),
                 one_line_error(run("codec-run", "decode", codes, "-m", model, "-o", tmp_path / "o.wav"))):
        file = line.split(": ")[1]
        assert file.startswith(f"{model}/") and ": its inputs are not those codecport feeds" in line, line
        assert said[Path(file).name] in line, line
    assert not (tmp_path / "d.npz").exists() and not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize("name", NAMES)
def test_an_output_that_cannot_be_written_is_one_line(smoke_exports, tmp_path, name):
    """An output that is a folder, or under a file, or where nothing may be written, is refused
    in one line (it was an internal error after the whole encode), and the folder or file in
    the way is left as it was."""
    wav = tmp_path / "in.wav"
    sf.write(wav, noise(3000).T, 16000)
    (tmp_path / "c.npz").mkdir()
    line = one_line_error(run("codec-run", "encode", wav, "-m", smoke_exports[name],
                              "-o", tmp_path / "c.npz"))
    assert "is a folder" in line and (tmp_path / "c.npz").is_dir()
    line = one_line_error(run("codec-run", "encode", wav, "-m", smoke_exports[name], "-o", wav / "c.npz"))
    assert "in.wav is a file, not a folder" in line and sf.info(str(wav)).frames == 3000
    line = one_line_error(run("codec-run", "encode", wav, "-m", smoke_exports[name], "-o", "/proc/c.npz"))
    assert "cannot write /proc/c.npz" in line
    assert run("codec-run", "encode", wav, "-m", smoke_exports[name],
               "-o", tmp_path / "ok.npz").returncode == 0
    codes = tmp_path / "ok.npz"
    line = one_line_error(run("codec-run", "decode", codes, "-m", smoke_exports[name], "-o", wav / "o.wav"))
    assert "in.wav is a file, not a folder" in line
    (tmp_path / "o.wav").mkdir()
    line = one_line_error(run("codec-run", "decode", codes, "-m", smoke_exports[name],
                              "-o", tmp_path / "o.wav"))
    assert "is a folder" in line


def test_an_unexpected_failure_is_one_line_and_exit_2(monkeypatch, tmp_path):
    def boom(*args, **kwargs):
        raise RuntimeError("something codecport did not expect\nsecond line")

    monkeypatch.setattr(registry, "codec_of_folder", boom)
    args = ["decode", str(tmp_path / "c.npy"), "-m", str(tmp_path), "-o", str(tmp_path / "o.wav")]
    result = CliRunner().invoke(run_cli, args)
    assert result.exit_code == 2
    assert result.output.strip() == ("internal error: RuntimeError: something codecport did not expect; "
                                     "rerun with -v for the traceback, and please report it")
    result = CliRunner().invoke(run_cli, [*args, "-v"])
    assert result.exit_code == 2 and "Traceback" in result.output and "in boom" in result.output


def test_running_out_of_memory_is_one_line_that_says_what_to_shrink(monkeypatch, tmp_path):
    """A job past the machine's memory (numpy's MemoryError, or torch's allocator failing as a
    RuntimeError: an export of a --len of hours, a huge --step-frames) is the user's to shrink:
    `error:`, exit 1, not an internal error. A RuntimeError of anything else still is one."""
    for raised, code, said in ((MemoryError("Unable to allocate 745. GiB"), 1,
                                "error: out of memory (Unable"),
                               (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"), 1,
                                "error: out of memory (DefaultCPUAllocator"),
                               (RuntimeError("a bug"), 2, "internal error: RuntimeError: a bug")):
        def boom(*args, exc=raised, **kwargs):
            raise exc

        monkeypatch.setattr(registry, "codec_of_folder", boom)
        result = CliRunner().invoke(run_cli, ["decode", str(tmp_path / "c.npy"), "-m", str(tmp_path), "-o",
                                              str(tmp_path / "o.wav")])
        assert result.exit_code == code and result.output.startswith(said), result.output
        assert len(result.output.strip().splitlines()) == 1
        if code == 1:
            assert "make it smaller (a shorter --len or --step-frames" in result.output


def test_empty_weights_are_not_read_as_the_presets_release():
    """`--weights ""` (an unset shell variable) was read as no --weights, then as a release named
    after the preset: "tiny: no such file"."""
    from codecport.cli import export_cli

    r = CliRunner().invoke(export_cli, ["dac", "--preset", "tiny", "--len", "32000", "--weights", ""])
    assert r.exit_code == 2 and "--weights is empty; pass a released name" in r.output, r.output


@pytest.mark.parametrize("command, args, says", [
    ("codec-export dac", ["--bogus"], "No such option '--bogus'"),
    ("codec-export", ["nosuch"], "No such command 'nosuch'"),
    ("codec-run encode", [], "Missing argument 'AUDIO_IN'"),
    ("codec-run tokenize", ["a", "-m", "b", "-o", "c", "--workers", "0"], "0 is not in the range 1<=x<=1024"),
    ("codec-serve", ["--port", "abc"], "'abc' is not a valid integer"),
    ("codec-serve", ["-m", "x", "--idle-timeout", "nan"], "'nan' is not a finite number"),
    ("codec-bench dac", ["--seconds", "nan"], "'nan' is not a finite number"),
    ("codec-bench dac", ["--seconds", "inf"], "inf is not in the range"),
    ("codec-bench tokenize", ["--codec", "nosuch"], "'nosuch' is not one of 'dac', 'mimi'"),
    ("codec-bench serve", ["mimi", "--soak", "-inf"], "-inf is not in the range"),
    ("codec-demo", ["--seconds", "nan"], "'nan' is not a finite number"),
    ("codec-export dac", ["--len", str(10**23)], "is not in the range 1<=x<=2147483647"),
    ("codec-export dac", ["--seed", str(10**20)], "is not in the range 0<=x<=4294967295"),
    ("codec-serve", ["--send-buffer", str(2**31)], "is not in the range 0<=x<=2147483647"),
])
def test_a_usage_error_is_one_line_naming_the_help(command, args, says):
    """click's usage errors are four lines (the usage, a hint, a blank line, `Error: ...`); ours
    are one, in every front end, and NaN or infinity is not a length or a timeout (click's
    float ranges let both through: a traceback from the bench and the demo)."""
    tool, *sub = command.split()
    proc = run(tool, *sub, *args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith("error: ") and says in proc.stderr, proc.stderr
    assert proc.stderr.strip().endswith(f"; see '{command} --help'"), proc.stderr


def test_an_output_that_would_replace_what_the_command_reads_is_refused(tiny_export, tmp_path):
    """-o naming the input (by its path, or a hard link to it, under a suffix the command writes)
    or a file inside the model folder (its rvq.npz) was written over: the user's audio, or the
    export, gone. Refused before the work, both untouched."""
    model = shutil.copytree(tiny_export, tmp_path / "model")
    audio = tmp_path / "clip.npz"  # audio under a codes suffix (soundfile reads by content)
    sf.write(audio, noise(800).T, 16000, format="WAV")
    (tmp_path / "link.npz").hardlink_to(audio)
    before = {p: p.read_bytes() for p in [audio, *model.iterdir()]}
    for args, says in ((["encode", audio, "-o", audio], "is the input"),
                       (["encode", audio, "-o", tmp_path / "link.npz"], "is the input"),
                       (["encode", audio, "-o", model / "rvq.npz"], "is inside"),
                       (["decode", audio, "-o", model / "x.wav"], "is inside")):
        line = one_line_error(run("codec-run", *args, "-m", model))
        assert says in line and "pass" in line, line
    assert {p: p.read_bytes() for p in [audio, *model.iterdir()]} == before


def test_encode_options_are_checked_before_the_audio_is_read(tiny_mimi_export, tmp_path):
    """--codebooks and --mode were checked after the whole input was read and resampled: the
    error came minutes late for a long file, after a resampling notice."""
    audio = tmp_path / "clip.wav"
    sf.write(audio, noise(3200).T, 16000)  # not the model's rate: it would be resampled first
    for args, says in ((["--codebooks", "10000"], "--codebooks must be between 1 and"),
                       (["--mode", "chunked"], "Mimi has no chunked mode")):
        proc = run("codec-run", "encode", audio, "-m", tiny_mimi_export, "-o", tmp_path / "c.npz", *args)
        assert proc.returncode == 1 and proc.stderr.splitlines() == [one_line_error(proc)], proc.stderr
        assert says in proc.stderr and not (tmp_path / "c.npz").exists()


def test_a_path_the_system_refuses_is_one_error_line(tiny_export, tmp_path):
    """A name past 255 bytes (ENAMETOOLONG) was an internal error from most commands; it is the
    user's path to change."""
    audio = tmp_path / "clip.wav"
    sf.write(audio, noise(800).T, 16000)
    long = tmp_path / ("a" * 300 + ".npz")
    for args in (["encode", audio, "-o", long], ["decode", long, "-o", tmp_path / "o.wav"],
                 ["info", long]):
        line = one_line_error(run("codec-run", *args, *(["-m", tiny_export] if args[0] != "info" else [])))
        assert "File name too long" in line, line


@pytest.mark.parametrize("name", NAMES)
def test_a_wav_as_weights_is_refused_in_one_line(tmp_path, name):
    for suffix in (".pth", ".safetensors", ".wav"):
        path = tmp_path / f"weights{suffix}"
        sf.write(path, noise(1000).T, 16000, format="WAV")
        out = tmp_path / "out"
        line = one_line_error(run("codec-export", name, "--preset", "tiny", "--len", 960, "--weights", path,
                                  "-o", out))
        assert str(path) in line and not out.exists()


def test_an_absurd_dac_config_is_refused_before_a_model_is_built(tmp_path):
    from codecport.codecs.dac.config import PRESETS

    kwargs = {**PRESETS["tiny"].to_kwargs(), "encoder_dim": 4096, "decoder_dim": 16384, "latent_dim": 16384}
    path = tmp_path / "huge.pth"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "metadata": {"kwargs": kwargs}}, path)
    line = one_line_error(run("codec-export", "dac", "--len", 600, "--weights", path, "-o", tmp_path / "o"))
    assert "G parameters, far past any DAC model" in line, line  # each dim within its own bound
    kwargs = {**PRESETS["tiny"].to_kwargs(), "encoder_rates": "abc"}
    torch.save({"state_dict": {"x": torch.zeros(1)}, "metadata": {"kwargs": kwargs}}, path)
    assert "not DAC's" in one_line_error(run("codec-export", "dac", "--len", 600, "--weights", path,
                                             "-o", tmp_path / "o"))


def test_an_absurd_mimi_config_is_refused_before_a_model_is_built(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "mimi", "hidden_size": 8192,
                                                    "num_hidden_layers": 128, "intermediate_size": 65536}))
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    line = one_line_error(run("codec-export", "mimi", "--len", 960, "--weights", folder,
                              "-o", tmp_path / "o"))
    assert "G parameters" in line


@pytest.mark.parametrize("name", NAMES)
def test_export_help_needs_no_torch(name):
    """--help is built from the registry and the torch-free config modules."""
    code = ("import sys\nsys.modules['torch'] = None\nsys.modules['onnx'] = None\n"
            f"from codecport.cli import export_cli\nexport_cli.main(['{name}', '--help'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "--preset" in proc.stdout and all(p in proc.stdout for p in registry.get(name).presets)
    assert export_cli.commands[name].name == name


def test_info_on_damaged_metadata_is_one_error_line(smoke_exports, tmp_path):
    """A graph whose metadata says something impossible: `codec-run info` says which value, in
    one `error:` line (exit 1), not an internal error."""
    import onnx

    folder = tmp_path / "model"
    shutil.copytree(smoke_exports["dac"], folder)
    model = onnx.load(str(folder / "decoder.onnx"))
    for p in model.metadata_props:
        if p.key == "sample_rate":
            p.value = "forty-four k"
    onnx.save(model, str(folder / "decoder.onnx"))
    result = CliRunner().invoke(run_cli, ["info", str(folder)])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1].startswith("error: ") and "sample_rate" in result.output


def test_sigterm_midway_through_a_decode_leaves_no_partial_file(tiny_export, tmp_path):
    """SIGTERM while `codec-run decode` writes its output piece by piece unwinds it as Ctrl-C
    does: exit 143, one line, and the hidden temporary file beside `-o` is gone (the default
    action killed it, leaving `.o.wav.*.part`); nothing at `-o`."""
    import os
    import signal
    import time

    import codecport

    codec = codecport.load(tiny_export)
    codes = np.random.default_rng(0).integers(0, codec.codebook_size, (1, codec.n_codebooks, 456 * 1000))
    np.save(tmp_path / "c.npy", codes)
    out = tmp_path / "o.wav"
    proc = subprocess.Popen([sys.executable, "-c", "from codecport.cli import run_cli; run_cli()", "decode",
                             str(tmp_path / "c.npy"), "-m", str(tiny_export), "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TQDM_DISABLE": "1"})
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".o.wav.*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, f"the decode ended before its temporary file was seen: {proc.communicate()}"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and \
        err.strip().splitlines()[-1] == "error: terminated (SIGTERM)", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy"]
