"""The public Python API, the same for every registered codec: `codecport.load`, the codec's
surface, `Codes` and its files, streaming where the codec streams, re-exports, and the CLI
writing what the API writes."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from cli_support import invoke
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_exports import copy_folder, shared
from support import noise

import codecport
from codecport import registry
from codecport.bench.facts import facts_of
from codecport.errors import AudioError, CodecportError, CodesError, ExportError

NAMES = registry.names()
# Codecs that stream audio in (an encoder stream); every stream of every codec: test_streams.py.
STREAMING = [n for n in NAMES if "encoder" in registry.get(n).runtime.streams]
BIN = Path(sys.executable).parent
# Code frames a second of each smoke export's tiny preset: sample rate over the samples of a frame
# (DAC and SNAC: strides 2 * 3 at 16 kHz; Mimi: 4 * 3, then 2, at 24 kHz; NeuCodec and XCodec2:
# 50 Hz, 160 samples at the 8 kHz they decode to).
FRAME_RATES = {"dac": 16000 / 6, "mimi": 24000 / 24, "neucodec": 50.0, "snac": 16000 / 6, "xcodec2": 50.0,
               "qwen3tts": 24000 / 24}

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def codecs(smoke_exports) -> dict:
    return {name: codecport.load(str(folder)) for name, folder in smoke_exports.items()}


def test_all_is_the_api():
    assert set(codecport.__all__) >= {"load", "load_codes", "Codes", "Codec", "available_codecs",
                                      "read_audio", "write_audio", "__version__"}
    for name in codecport.__all__:
        assert getattr(codecport, name) is not None
    assert codecport.available_codecs() == NAMES
    assert codecport.load.__doc__ and codecport.Codes.__doc__ and codecport.Codec.encode.__doc__


@pytest.mark.parametrize("name", NAMES)
def test_load_gives_the_codec_and_its_facts(codecs, smoke_exports, name):
    codec = codecs[name]
    manifest = json.loads((smoke_exports[name] / "manifest.json").read_text())
    assert isinstance(codec, codecport.Codec) and type(codec) is registry.get(name).runtime
    assert (codec.name, codec.variant, codec.export_id) == (name, manifest["preset"], manifest["export_id"])
    assert codec.sample_rate == int(manifest["sample_rate"]) and codec.provider == "CPUExecutionProvider"
    assert codec.frame_rate == pytest.approx(FRAME_RATES[name])
    assert codec.n_codebooks == manifest["n_codebooks"] and \
        codec.codebook_size == int(manifest["codebook_size"])
    assert facts_of(registry.get(name)).fixed_mode in codec.modes and len(codec.modes) >= 2


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("channels, rate", [(None, 22050), (2, None)])
def test_encode_and_decode_any_shape_and_rate(codecs, name, channels, rate):
    codec = codecs[name]
    rate = rate or codec.sample_rate
    n = int(0.05 * rate) + 7
    audio = noise(n, channels=channels or 1, seed=3)
    codes = codec.encode(audio[0] if channels is None else audio, rate)
    assert (codes.codec, codes.sample_rate, codes.num_samples, codes.channels) == \
        (name, rate, n, channels or 1)
    assert codes.export_id == codec.export_id and codes.mode in codec.modes
    assert len(codes.arrays) == codec.levels and codes.n_codebooks == codec.codebooks(None)
    assert all(a.dtype == np.int64 for a in codes.arrays)
    out, sr = codec.decode(codes)
    assert sr == rate and out.shape == (channels or 1, n) and out.dtype == np.float32
    assert np.isfinite(out).all()
    # Bare arrays: the model's rate, every frame's samples (which cover the clip, but for a codec
    # that drops a last partial frame as its official encode does: NeuCodec's `n // hop` frames).
    bare, sr = codec.decode(codes.data if codec.levels == 1 else codes.arrays)
    assert sr == codec.sample_rate
    covered = codec.expected_frames(round(n * codec.input_rate / rate), codes.mode)
    assert covered is None or codes.n_frames[0] == covered
    frames_cover = np.inf if covered is None else covered * codec.strides[0] * codec.frame_size
    assert bare.shape[1] >= min(n * codec.sample_rate / rate - 1, frames_cover)


@pytest.mark.parametrize("name", NAMES)
def test_every_suffix_round_trips(codecs, tmp_path, name):
    codec = codecs[name]
    seeded = {"noise": 0} if codec.draws_noise else {}  # the same noise for both decodes
    codes = codec.encode(noise(3000, seed=5), 16000)
    want, sr = codec.decode(codes, **seeded)
    for suffix in registry.get(name).suffixes:
        path = tmp_path / f"codes{suffix}"
        if suffix == ".npy" and codec.levels > 1:  # one array: several time scales need .npz
            with pytest.raises(CodesError, match="do not fit one .npy; write .npz"):
                codes.save(path)
            assert not path.exists()
            continue
        codes.save(path)
        got = codecport.load_codes(path)
        assert len(got.arrays) == len(codes.arrays)
        for a, b in zip(got.arrays, codes.arrays):
            np.testing.assert_array_equal(a, b)
        audio, got_sr = codec.decode(got, **seeded)
        if suffix == ".npy":  # bare codes: no length or rate
            assert got_sr == codec.sample_rate and got.num_samples is None
        else:
            assert got_sr == sr and audio.shape == want.shape
            np.testing.assert_allclose(audio, want, atol=1e-5)  # .dac keeps the loudness as float32


@pytest.mark.parametrize("name", NAMES)
def test_cli_writes_what_the_api_writes(codecs, smoke_exports, tmp_path, name):
    """`codec-run encode` (a file read block by block) and `Codec.encode` (an array) give the same
    codes and fields, resampled or not; `codec-run decode` writes `decode_to_file`'s samples."""
    codec = codecs[name]
    seeded = {"noise": 0} if codec.draws_noise else {}
    for rate in (codec.sample_rate, 44100):
        wav = tmp_path / f"in{rate}.wav"
        sf.write(wav, noise(int(0.6 * rate), channels=2, seed=rate).T, rate, subtype="FLOAT")
        out = tmp_path / f"cli{rate}.npz"
        proc = invoke("codec-run", "encode", wav, "-m", smoke_exports[name], "-o", out)
        assert proc.returncode == 0, proc.stderr
        cli_codes = codecport.load_codes(out)
        api = codec.encode(*codecport.read_audio(wav))
        assert cli_codes == api.replace(arrays=cli_codes.arrays)
        for a, b, c in zip(cli_codes.arrays, api.arrays, codec.encode_file(wav).arrays, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(c, b)
        decoded = tmp_path / f"cli{rate}.wav"
        proc = invoke("codec-run", "decode", out, "-m", smoke_exports[name], "-o", decoded,
                      *(["--noise-seed", "0"] if seeded else []))
        assert proc.returncode == 0, proc.stderr
        y, sr = sf.read(decoded, dtype="float32", always_2d=True)
        audio, want_sr = codec.decode(api, **seeded)
        assert sr == want_sr == rate
        np.testing.assert_array_equal(y.T, np.clip(audio, -1, 1))


@pytest.mark.parametrize("name", NAMES)
def test_stream_where_the_codec_streams(codecs, name):
    codec = codecs[name]
    if name not in STREAMING:
        with pytest.raises(CodecportError, match="has no encoder stream"):
            codec.stream()
        return
    x = noise(20 * codec.frame_size + 5, seed=8)
    stream = codec.stream()
    codes = np.concatenate([stream.encode_step(x[0]), stream.flush_encoder()], axis=1)
    np.testing.assert_array_equal(codes, codec.encode(x, codec.sample_rate, mode="step").data[0])
    audio = np.concatenate([stream.decode_step(codes), stream.flush_decoder()])
    np.testing.assert_array_equal(audio, codec.decode(codes, mode="step")[0][0])


@pytest.mark.parametrize("name", STREAMING)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(0, 400), max_size=8))
def test_any_split_into_pushes_gives_the_same_codes(codecs, name, cuts):
    """Audio pushed into a stream in pieces of any sizes (empty ones too): the same codes and
    audio as one push, and nothing comes out before its step is complete."""
    codec = codecs[name]
    x = noise(12 * codec.frame_size + 11, seed=9)[0]
    whole = codec.stream()
    want = np.concatenate([whole.encode_step(x), whole.flush_encoder()], axis=1)
    stream, got, fed = codec.stream(), [], 0
    for cut in [*sorted(cuts), len(x)]:
        piece = x[fed:max(fed, min(cut, len(x)))]
        got.append(stream.encode_step(piece))
        fed += len(piece)
        assert sum(g.shape[1] for g in got) == fed // stream.step_samples * stream.step_frames
    got.append(stream.flush_encoder())
    np.testing.assert_array_equal(np.concatenate(got, axis=1), want)
    bounds = [0, *sorted(c % (want.shape[1] + 1) for c in cuts), want.shape[1]]
    out = [stream.decode_step(want[:, a:b]) for a, b in itertools.pairwise(bounds) if b > a]
    audio = np.concatenate([*out, stream.flush_decoder()])
    np.testing.assert_array_equal(audio, codec.decode(want, mode="step")[0][0])


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_through_the_api(codecs, name):
    codec = codecs[name]
    good = noise(500)
    for audio, rate, match in [
        (np.full((1, 500), np.nan, np.float32), 16000, "NaN"),
        ((good * 32768).astype(np.int16), 16000, "not floats"),
        (good[None], 16000, "must be"),
        (np.zeros((1, 0), np.float32), 16000, "no samples"),
        (good, 0, "sample rate 0"),
        (good, 16000.5, "sample rate 16000.5"),
    ]:
        with pytest.raises(AudioError, match=match):
            codec.encode(audio, rate)
    codes = codec.encode(good, 16000)
    for bad, match in [
        (codes.replace(arrays=tuple(a + codec.codebook_size for a in codes.arrays)),
         r"codes must be in \[0,"),
        (codes.arrays[0].astype(np.float32), "integers"),
        (codes.replace(codec="other"), "these are other codes"),
        (codes.replace(preset="another"), "made by"),
        (codes.replace(num_samples=codes.num_samples * 1000), "cannot be"),
    ]:
        with pytest.raises(CodesError, match=match):
            codec.decode(bad)
    with pytest.raises(CodecportError, match="no sideways mode"):
        codec.encode(good, 16000, mode="sideways")


# The folder's replacement is one mechanism (export/graph.export_folder) for every codec: run on
# the two whose smoke exports take seconds (DAC's and NeuCodec's took 16 s and 21 s more).
@pytest.mark.parametrize("name", ["mimi", "snac"])
def test_reexport_replaces_an_export_whole_and_nothing_else(smoke_exports, tmp_path, name):
    """`-o` over an earlier export replaces it whole (nothing of it left behind); over a folder
    holding anything its manifest does not list, or a manifest.json that is not codecport's (a
    web app's), it refuses in one line and touches nothing."""
    from click.testing import CliRunner

    from codecport.cli import export_cli
    from codecport.export.graph import export_folder

    spec = registry.get(name)
    folder = copy_folder(smoke_exports[name], tmp_path / "model")  # an earlier export
    export = lambda out, *extra: CliRunner().invoke(export_cli, [name, *spec.smoke, *extra, "--random-init",
                                                                 "-o", str(out)])
    # One whose files were named otherwise (as an older codecport's were): a graph renamed, in its
    # manifest too. The new export must leave none of its files behind.
    manifest = json.loads((folder / "manifest.json").read_text())
    role = next(r for r, f in manifest["files"].items() if f.endswith(".onnx"))
    old = "older_" + manifest["files"][role]
    (folder / manifest["files"][role]).rename(folder / old)
    manifest["files"][role] = old
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert codecport.load(folder).preset == "tiny"  # still an export that loads
    proc = export(folder)
    assert proc.exit_code == 0, proc.output
    listed = set(json.loads((folder / "manifest.json").read_text())["files"].values())
    assert {p.name for p in folder.iterdir()} == listed
    assert old not in listed  # the earlier export's own file went with the rest of it
    assert not list(tmp_path.glob(".*.part"))  # no staging folder left beside it

    (folder / "notes.txt").write_text("mine")  # the user's file inside an export folder
    state = {p.name: p.read_bytes() for p in folder.iterdir()}
    proc = export(folder)
    assert proc.exit_code == 1 and "holds notes.txt, which is not part of the codecport export" in proc.output
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == state

    app = tmp_path / "my-app"  # a web app: its own manifest.json, a page, its sources
    (app / "src").mkdir(parents=True)
    (app / "manifest.json").write_text(json.dumps({"name": "My App", "start_url": "/", "icons": []}))
    (app / "index.html").write_text("<!doctype html>")
    (app / "src" / "main.js").write_text("console.log(1)")
    proc = export(app)
    assert proc.exit_code == 1 and "not a codecport export" in proc.output
    assert sorted(str(p.relative_to(app)) for p in app.rglob("*")) == ["index.html", "manifest.json", "src",
                                                                       "src/main.js"]
    with pytest.raises(ExportError, match="not a codecport export"), export_folder(app):
        pass


def test_sigterm_midway_leaves_no_staging_folder_and_no_temporary_files(tmp_path):
    """SIGTERM (a job scheduler's stop, `timeout`) while an fp16 build is made in a temporary
    folder (gigabytes at a released size) unwinds the export as Ctrl-C does: exit 143, one line,
    nothing left in the temporary folder, no hidden `.OUT.*.part` beside `-o`, no `-o` (the
    default action killed it at once, leaving them)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out, tmp = tmp_path / "out", tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "from codecport.cli import export_cli; export_cli()",
                             "dac", "--preset", "tiny", "--len", "32000", "--random-init",
                             "--precision", "fp16", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    deadline = time.monotonic() + 120
    while not list(tmp.glob("codecport-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the export ended before its build folder was seen"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and \
        err.strip().splitlines()[-1] == "error: terminated (SIGTERM)", err
    assert "Traceback" not in err
    # (`.ses`, a session id of a library's, is written by every export, finished or not)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"] and \
        [p.name for p in tmp.iterdir()] in ([], [".ses"])


def test_an_output_that_cannot_be_made_is_refused_before_the_export(tmp_path, monkeypatch):
    """An `-o` under a file, in a place no folder can be made (/proc), or that is the current
    folder (replaced whole, it would leave the shell in a folder that no longer exists) is one
    line before anything is traced; these were internal errors after the whole export. An `-o`
    that is a link to a folder fills the folder and keeps the link (the link was replaced)."""
    from click.testing import CliRunner

    from codecport.cli import export_cli

    (tmp_path / "afile").write_text("mine")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    cases = {str(tmp_path / "afile" / "sub"): "afile is a file, not a folder",
             "/proc/codecport-test": "cannot write /proc/codecport-test",
             ".": "is the current folder or one above it", "..": "is the current folder or one above it"}
    for out, said in cases.items():
        r = CliRunner().invoke(export_cli, ["dac", "--preset", "tiny", "--len", "32000", "--random-init",
                                            "-o", out])
        assert r.exit_code == 1 and said in r.output and "Traceback" not in r.output, (out, r.output)
        assert "exported" not in r.output  # refused before the trace
    assert (tmp_path / "afile").read_text() == "mine" and list((tmp_path / "here").iterdir()) == []

    # The default name (no -o) is checked before the export too: it was refused after the trace.
    (tmp_path / "here" / "dac-tiny-32000").mkdir()
    (tmp_path / "here" / "dac-tiny-32000" / "notes.txt").write_text("mine")
    exporter = registry.get("dac").module("export")
    monkeypatch.setattr(exporter, "export", lambda *a, **k: pytest.fail("traced before the -o check"))
    r = CliRunner().invoke(export_cli, ["dac", "--preset", "tiny", "--len", "32000", "--random-init"])
    assert r.exit_code == 1 and \
        "dac-tiny-32000 holds files that are not a codecport export" in r.output, r.output
    monkeypatch.undo()
    # A link to a folder: the export fills the folder, and the user's link stays a link.
    (tmp_path / "models").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "models")
    r = CliRunner().invoke(export_cli, ["dac", "--preset", "tiny", "--len", "32000", "--random-init",
                                        "-o", str(tmp_path / "link")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "link").is_symlink() and (tmp_path / "models" / "manifest.json").is_file()




OLD = Path(__file__).parent / "data" / "codecport-0.2"
# 0.2's SNAC step decoder re-ran a window: today's window decoder at its size computes the same.
OLD_WINDOWS = {"decoder_stream.onnx"}


# The codecs codecport 0.2 had (a later codec has no 0.2 folders to load).
OLD_NAMES = sorted(p.stem for p in OLD.glob("*.json"))


@pytest.mark.parametrize("name", OLD_NAMES)
def test_a_folder_codecport_0_2_wrote_still_loads(smoke_exports, tiny_snac, tmp_path, tmp_path_factory, name):
    """A folder as codecport 0.2 wrote it: its manifest and each graph's metadata, stored from a
    real 0.2 export (tests/data/codecport-0.2: `--variant tiny` and the registry's smoke length),
    put on today's graphs of the same export, which compute the same (SNAC's step decoder was a
    window graph: today's window decoder at that size). It loads under the old names (`variant`,
    Mimi's `attention_window`, SNAC's `stream_frames` and `decoder_stream.onnx`) and gives
    today's codes, audio and streams."""
    import onnx

    from codecport.codecs.snac.export import export_snac

    stored = json.loads((OLD / f"{name}.json").read_text())
    new = smoke_exports[name]
    samples = stored["manifest"].get("geometry", {}).get("samples")
    if samples is not None and \
            json.loads((new / "manifest.json").read_text())["geometry"]["samples"] != samples:
        # The smoke export is shorter now (DAC's): today's graphs at the length 0.2 exported
        # (`codec-export` in this process: the smoke exports' own command, at that length).
        def export(folder: Path) -> None:
            proc = invoke("codec-export", name, "--preset", "tiny", "--len", samples, "--random-init",
                          "-o", folder)
            assert proc.returncode == 0, proc.stderr

        new = shared(tmp_path_factory, f"{name}-0.2-length", export)
    export_id = json.loads((new / "manifest.json").read_text())["export_id"]  # rvq.npz carries it
    old = tmp_path / "old"
    old.mkdir()
    for file in stored["manifest"]["files"].values():
        if file in OLD_WINDOWS:
            frames = int(stored["graph_metadata"][file]["frames"])
            export_snac(tiny_snac, tmp_path / "window", frames * tiny_snac.cfg.hop_length, preset="tiny",
                        weights="random-init seed 0", weights_sha256="none")
            model = onnx.load(str(tmp_path / "window" / "decoder.onnx"))
            del model.metadata_props[:]
            onnx.helper.set_model_props(model, {**stored["graph_metadata"][file], "export_id": export_id})
            onnx.save(model, str(old / file))
        elif file.endswith(".onnx"):
            model = onnx.load(str(new / file))
            del model.metadata_props[:]
            onnx.helper.set_model_props(model, {**stored["graph_metadata"][file], "export_id": export_id})
            onnx.save(model, str(old / file))
        elif file != "manifest.json":
            (old / file).write_bytes((new / file).read_bytes())
    (old / "manifest.json").write_text(json.dumps({**stored["manifest"], "export_id": export_id}))
    assert "variant" in stored["manifest"] and "preset" not in stored["manifest"]

    was, now = codecport.load(old), codecport.load(new)
    assert was.preset == now.preset == "tiny" and type(was) is type(now)
    x = noise(4 * now.strides[0] * now.frame_size * 10, seed=5)
    codes = now.encode(x, now.sample_rate)
    assert all(np.array_equal(a, b)
               for a, b in zip(was.encode(x, was.sample_rate).arrays, codes.arrays, strict=True))
    extra = {"noise": 0} if now.draws_noise else {}
    np.testing.assert_array_equal(was.decode(codes, **extra)[0], now.decode(codes, **extra)[0])
    for side in now.streams:
        a, b = (getattr(c, f"{side}_stream")(**(extra if side == "decoder" else {})) for c in (was, now))
        assert a.step_frames == b.step_frames
        if side == "encoder":
            np.testing.assert_array_equal(np.concatenate([a.push(x[0]), a.flush()], axis=1),
                                          np.concatenate([b.push(x[0]), b.flush()], axis=1))
        else:  # SNAC's old stream re-runs windows, today's steps: the same audio, another latency
            one = codecport.Codes([arr[:1] for arr in codes.arrays])
            np.testing.assert_allclose(np.concatenate([a.push(one), a.flush()]),
                                       np.concatenate([b.push(one), b.flush()]), atol=1e-5)
    info = invoke("codec-run", "info", old)
    assert info.returncode == 0 and "tiny" in info.stdout, info.stderr
