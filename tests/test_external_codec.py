"""A codec that lives in another package (tests/plugin/toycodec, declared by its distribution's
`codecport.codecs` entry point) goes through every command and the front door as a built-in one:
codec-export, codec-run encode / decode / info, codecport.load and codec-serve, with no file of
codecport/ naming it. Its numbers are checked against its own torch reference."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from serve_support import in_thread, serving

from codecport import registry

PLUGIN = Path(__file__).parent / "plugin"
BIN = Path(sys.executable).parent
PY = str(BIN / "python")


def run(*args, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    """A command in a fresh process that sees the plugin's distribution on its path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy codec exported by codec-export (random weights, seed 3), a clip and the folder."""
    work = tmp_path_factory.mktemp("toy")
    proc = run(BIN / "codec-export", "toy", "--random-init", "--seed", "3", "--len", "4000", "-o", "model",
               cwd=work)
    assert "decoder_step.onnx        validated vs torch" in proc.stdout, proc.stdout
    clip = (np.random.default_rng(5).standard_normal(9000) * 0.2).astype(np.float32)  # past one call
    sf.write(work / "clip.wav", clip, 8000, subtype="FLOAT")
    return work


def reference(work: Path, script: str) -> dict:
    """What the plugin's torch reference gives for the clip, computed in a process of its own."""
    code = ("import json, sys, numpy as np, soundfile as sf, torch\n"
            "from toycodec.model import MODEL, init_random\nfrom toycodec.config import PRESETS\n"
            "m = init_random(MODEL(PRESETS['toy']), 3).eval()\n"
            "x, _ = sf.read('clip.wav', dtype='float32')\n" + script)
    return json.loads(run(PY, "-c", code, cwd=work).stdout)


def test_codecport_itself_does_not_know_the_toy_codec():
    """The plugin is found through its distribution's metadata only: this process, without it on
    the path, has the built-in codecs alone; nothing under codecport/ names it."""
    assert "toy" not in registry.names()
    root = Path(registry.__file__).parents[1]
    assert not [p for p in root.rglob("*.py") if "toycodec" in p.read_text()]


def test_codec_export_lists_it(toy):
    proc = run(BIN / "codec-export", "--help", cwd=toy)
    assert "toy" in proc.stdout.split("Commands:")[1]


def test_encode_and_decode_through_codec_run_match_its_torch_reference(toy):
    run(BIN / "codec-run", "encode", "clip.wav", "-m", "model", "-o", "codes.npz", cwd=toy)
    run(BIN / "codec-run", "decode", "codes.npz", "-m", "model", "-o", "back.wav", cwd=toy)
    want = reference(toy, "n = -(-len(x) // 80) * 80\n"
                          "a = torch.from_numpy(np.pad(x, (0, n - len(x))))[None, None]\n"
                          "with torch.no_grad():\n    c = m.encode(a)\n    y = m.decode(c)[0, 0, :len(x)]\n"
                          "print(json.dumps({'codes': c[0].tolist(), 'audio': y.tolist()}))")
    codes = np.load(toy / "codes.npz")
    assert str(codes["codec"]) == "toy" and codes["codes_0"].shape == (1, 2, 113)
    np.testing.assert_array_equal(codes["codes_0"][0], np.array(want["codes"]))
    audio, sr = sf.read(toy / "back.wav", dtype="float32")
    assert sr == 8000 and audio.shape == (9000,)
    # The WAV is 16-bit PCM: a quantization step of 2^-15 apart from torch's float decode.
    assert np.abs(audio - np.array(want["audio"], np.float32)).max() < 1e-4 + 2 ** -15
    info = run(BIN / "codec-run", "info", "model", "--json", cwd=toy)
    assert json.loads(info.stdout)["manifest"]["codec"] == "toy"


def test_codecport_load_streams_it_exactly(toy):
    """codecport.load in a program that has the plugin installed: the decoder stream, pushed any
    split, gives the whole decode."""
    code = ("import json, numpy as np, codecport\n"
            "c = codecport.load('model')\n"
            "codes = np.random.default_rng(1).integers(0, 64, (2, 30))\n"
            "whole = c.decode(codes[None])[0][0]\n"
            "s = c.decoder_stream()\n"
            "parts = [s.push(codes[:, a:b]) for a, b in ((0, 1), (1, 8), (8, 8), (8, 30))] + [s.flush()]\n"
            "print(json.dumps({'label': c.label, 'err': float(np.abs(np.concatenate(parts) - whole).max()),"
            " 'n': len(np.concatenate(parts))}))")
    out = json.loads(run(PY, "-c", code, cwd=toy).stdout)
    assert out == {"label": "Toy", "err": 0.0, "n": 30 * 80}


def test_codec_serve_serves_it(toy, monkeypatch, tmp_path):
    """codec-serve started on the plugin's folder: a decode stream over the protocol gives what the
    codec's own decoder stream gives (computed in a process that has the plugin)."""
    from codecport.serve import decode

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")]))
    codes = np.random.default_rng(2).integers(0, 64, (2, 25))
    np.save(tmp_path / "codes.npy", codes)
    code = ("import json, numpy as np, codecport\n"
            f"codes = np.load({str(tmp_path / 'codes.npy')!r})\n"
            "s = codecport.load('model').decoder_stream()\n"
            "print(json.dumps((np.concatenate([s.push(codes), s.flush()])).tolist()))")
    want = np.array(json.loads(run(PY, "-c", code, cwd=toy).stdout), np.float32)
    with serving(toy / "model", tmp_path / "serve.log", "--slots", "2") as server:
        got = in_thread(asyncio.run, decode(server.url, [codes], chunk_frames=4))
        status, health = server.get("/health")
    assert status == 200 and "toy" in json.dumps(health)
    np.testing.assert_array_equal(np.asarray(got).reshape(-1), want)


def test_a_broken_plugin_is_left_out_and_said(tmp_path):
    """A distribution whose entry point does not import takes no built-in codec down with it: the
    commands run, say once which plugin was left out, and refuse its name as unknown."""
    dist = tmp_path / "broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[codecport.codecs]\nbroken = no_such_module.spec:SPEC\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([str(BIN / "codec-export"), "broken", "--help"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "no_such_module" in proc.stderr, proc.stderr
    listed = subprocess.run([str(BIN / "codec-export"), "--help"], env=env, capture_output=True, text=True,
                            timeout=120)
    assert listed.returncode == 0 and "mimi" in listed.stdout and "broken" not in listed.stdout


def _broken_toy(tmp_path: Path, role: str) -> dict:
    """The toy plugin installed beside this run, its `role` module needing a package that is not
    there (its spec imports): the environment of a process that sees it."""
    import shutil

    shutil.copytree(PLUGIN, tmp_path / "plugin")
    module = tmp_path / "plugin" / "toycodec" / f"{role}.py"
    module.write_text(module.read_text() + "\nimport no_such_dependency  # what its author forgot\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path / "plugin")}


@pytest.mark.parametrize("role", ["config", "runtime", "facts"])
def test_a_plugin_whose_other_module_does_not_import_is_left_out(tmp_path, role):
    """The front ends build their help from every codec's config, runtime and facts: a plugin
    whose spec imports but one of those does not is left out of each, said in one line that names
    it and what to do, and every command still lists the built-in codecs."""
    env = _broken_toy(tmp_path, role)
    # Where each lists the codecs: codec-run's --codebooks help by label, the others' commands.
    for tool, args, built_in, plugin in [("codec-run", ("encode", "--help"), r"\bMimi \d", r"\bToy\b"),
                                         ("codec-export", ("--help",), r"^  mimi ", r"^  toy "),
                                         ("codec-bench", ("--help",), r"^  mimi ", r"^  toy ")]:
        proc = subprocess.run([str(BIN / tool), *args], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        said = [line for line in proc.stderr.splitlines() if "toy" in line]
        assert len(said) == 1 and f"toycodec.{role}" in said[0] and "no_such_dependency" in said[0] \
            and "reinstall toycodec" in said[0], proc.stderr
        assert re.search(built_in, proc.stdout, re.M), proc.stdout
        assert not re.search(plugin, proc.stdout, re.M), proc.stdout


def test_a_broken_plugin_costs_a_built_in_decode_nothing(tmp_path, smoke_exports):
    """codec-run decode of a built-in codec's folder, with a plugin whose runtime does not import
    installed: it decodes, the plugin said once."""
    folder = smoke_exports["mimi"]
    codec = registry.codec_of_folder(folder).runtime(folder, sessions=False)
    codes = np.random.default_rng(0).integers(0, codec.codebook_size, (1, codec.n_codebooks, 6))
    np.save(tmp_path / "codes.npy", codes)
    proc = subprocess.run([str(BIN / "codec-run"), "decode", tmp_path / "codes.npy", "-m", folder, "-o",
                           tmp_path / "out.wav"], env=_broken_toy(tmp_path, "runtime"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sum("left out codec 'toy'" in line for line in proc.stderr.splitlines()) == 1, proc.stderr
    assert sf.info(tmp_path / "out.wav").frames == 6 * codec.frame_size


def test_register_adds_a_codec_in_one_program(monkeypatch):
    """Without the entry point, a program adds the codec itself (`registry.register`); a second
    codec of the same name is refused."""
    import dataclasses

    monkeypatch.syspath_prepend(str(PLUGIN))
    from toycodec.spec import SPEC

    monkeypatch.setattr(registry, "_CODECS", dict(registry._CODECS))
    assert registry.register(SPEC) is SPEC and registry.get("toy").runtime.label == "Toy"
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(dataclasses.replace(SPEC, package="elsewhere"))


def test_a_codec_whose_format_is_taken_is_refused_whole(monkeypatch, tmp_path):
    """A plugin declaring `.dac` beside a format of its own adds neither (nor its name)."""
    from codecport.registry import CodecSpec
    from codecport.runtime import codefile

    pkg = tmp_path / "clashing"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "codesfile.py").write_text(
        "from codecport.runtime.codefile import Format\n"
        "def read(path):\n    raise NotImplementedError\n"
        "def write(path, arrays, fields):\n    raise NotImplementedError\n"
        "FORMATS = (Format('.clash', 'clashing', read, write), Format('.dac', 'clashing', read, write))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_CODECS", dict(registry._CODECS))
    spec = CodecSpec("clashing", "Nothing", default_preset="x", package="clashing", codes_file=True)
    with pytest.raises(ValueError, match=r"\.dac is declared twice \(dac and clashing\)"):
        registry.register(spec)
    assert ".clash" not in codefile.FORMATS and "clashing" not in registry.names()
    assert codefile.FORMATS[".dac"].codec == "dac"
