"""Every file the runtime reads, checked before it is used: codes files (.npy, .npz, .dac),
archives that would inflate, headers that lie, graph metadata; property tests for the parsers
(any bytes give codes or one `CodesError`, nothing else).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from codecport.errors import CodesError, ModelFileError
from codecport.runtime.codes import Codes, load_codes
from codecport.runtime.graph import Graph
from codecport.runtime.npyfile import read_npy, read_npz

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def valid_codes(**kw) -> Codes:
    rng = np.random.default_rng(0)
    fields = {"codec": "dac", "sample_rate": 16000, "num_samples": 600, "loudness_db": -20.0,
              "mode": "fixed", "preset": "tiny", "export_id": "abc"}
    return Codes((rng.integers(0, 64, (2, 4, 100)),), **{**fields, **kw})


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, bytes]:
    """The bytes of one valid codes file per format."""
    root = tmp_path_factory.mktemp("codes")
    out = {}
    for suffix in (".npy", ".npz", ".dac"):
        valid_codes().save(root / f"c{suffix}")
        out[suffix] = (root / f"c{suffix}").read_bytes()
    return out


# ---- round trips ---------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".npy", ".npz", ".dac"])
def test_round_trip(tmp_path, suffix):
    codes = valid_codes()
    codes.save(tmp_path / f"c{suffix}")
    got = load_codes(str(tmp_path / f"c{suffix}"))  # str paths work as Paths do
    np.testing.assert_array_equal(got.data, codes.data)
    if suffix == ".npz":
        assert got == codes.replace(arrays=got.arrays)  # every field comes back
    if suffix == ".dac":  # the official format: no export id or variant, loudness as float32
        assert (got.codec, got.num_samples, got.sample_rate, got.mode) == ("dac", 600, 16000, "fixed")
        assert got.loudness_db == pytest.approx(-20.0) and got.export_id is None
    assert [p.name for p in tmp_path.iterdir()] == [f"c{suffix}"]  # no temp file left


def test_multi_scale_codes_fit_the_same_type(tmp_path):
    """Levels at different frame rates (a multi-scale codec): one array each, coarse to fine."""
    arrays = tuple(np.arange(n, dtype=np.int64).reshape(1, 1, n) % 7 for n in (3, 6, 12))
    codes = Codes(arrays, codec="x", sample_rate=24000, num_samples=6000)
    assert codes.n_frames == (3, 6, 12) and codes.n_codebooks == 3 and codes.channels == 1
    codes.save(tmp_path / "c.npz")
    got = load_codes(tmp_path / "c.npz")
    assert [a.tolist() for a in got.arrays] == [a.tolist() for a in arrays]
    with pytest.raises(CodesError, match="3 time scales"):
        _ = got.data
    with pytest.raises(CodesError, match="3 time scales"):
        got.save(tmp_path / "c.npy")  # bare .npy holds one array


def test_old_npz_layout_still_loads(tmp_path):
    path = tmp_path / "old.npz"
    np.savez(path, codes=np.zeros((1, 4, 3), np.int64), length=np.int64(72),
             sample_rate=np.int64(24000), codec=np.array("mimi"))
    got = load_codes(path)
    assert (got.codec, got.num_samples, got.sample_rate, got.n_frames) == ("mimi", 72, 24000, (3,))


# ---- lying and hostile files ---------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    ({"sample_rate": 0}, "sample rate 0"),
    ({"num_samples": -5}, "original length -5"),
    ({"num_samples": 10 ** 15}, "impossible"),
    ({"loudness_db": float("nan")}, "loudness_db must be a finite number"),
    ({"loudness_db": 1e9}, "loudness 1000000000.0 dB"),
    ({"mode": "sideways"}, "mode 'sideways'"),
    ({"chunk_frames": 0}, "chunk length 0"),
    ({"sample_rate": None}, "both the original sample rate and length"),
])
def test_npz_fields_are_checked(tmp_path, kw, match):
    fields = {"codes_0": np.zeros((1, 4, 3), np.int64), "codec": np.array("mimi"),
              "sample_rate": np.int64(24000), "num_samples": np.int64(72)}
    for k, v in kw.items():
        if v is None:
            del fields[k]
        else:
            fields[k] = np.array(v)
    np.savez(tmp_path / "c.npz", **fields)
    with pytest.raises(CodesError, match=match):
        load_codes(tmp_path / "c.npz")


@pytest.mark.parametrize("meta, match", [
    ({"channels": 3}, "code rows for 3 channels"),
    ({"chunk_length": 7}, "chunk_length 7"),
    ({"input_db": np.array([np.nan], np.float32)}, "loudness nan"),
    ({"sample_rate": 5}, "sample rate 5"),
    ({"original_length": 0}, "original length 0"),
])
def test_dac_fields_are_checked(tmp_path, meta, match):
    good = {"input_db": np.array([-20.0], np.float32), "original_length": 600, "sample_rate": 16000,
            "chunk_length": 100, "channels": 1, "padding": True, "dac_version": "1.0.0"}
    with open(tmp_path / "c.dac", "wb") as f:
        np.save(f, {"codes": np.zeros((1, 4, 100), np.uint16), "metadata": {**good, **meta}},
                allow_pickle=True)
    with pytest.raises(CodesError, match=match):
        load_codes(tmp_path / "c.dac")


class _Uninitialised:
    """Pickles as `numpy.ndarray(shape, dtype)`: numpy allocates the shape it is told."""

    def __reduce__(self):
        return np.ndarray, ((1, 4, 2**33), np.dtype(np.uint16))


def test_a_dac_whose_pickle_calls_ndarray_allocates_nothing(tmp_path):
    """`numpy.ndarray` is what an np.save'd array's pickle names (as `_reconstruct`'s argument),
    but called itself it allocates any shape a file asks for: a 500-byte file asking for 64 GB is
    refused before numpy sees the shape (no MemoryError, no out-of-memory kill)."""
    meta = {"input_db": np.array([-20.0], np.float32), "original_length": 600, "sample_rate": 16000,
            "chunk_length": 2**33, "channels": 1, "padding": True, "dac_version": "1.0.0"}
    with open(tmp_path / "c.dac", "wb") as f:
        np.save(f, np.array({"codes": _Uninitialised(), "metadata": meta}, dtype=object), allow_pickle=True)
    assert (tmp_path / "c.dac").stat().st_size < 1000
    with pytest.raises(CodesError, match="not a readable .dac file"):
        load_codes(tmp_path / "c.dac")


def test_npy_header_that_promises_terabytes(tmp_path):
    path = tmp_path / "c.npy"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False,
                                                  "shape": (1, 4, 10 ** 12)})
    path.write_bytes(header.getvalue() + b"\x00" * 64)
    with pytest.raises(CodesError, match="more than codecport reads"):
        read_npy(path, CodesError)
    path.write_bytes(header.getvalue()[:40])
    with pytest.raises(CodesError, match="not a readable .npy"):
        load_codes(path)


def test_npy_truncated_and_padded(tmp_path, saved):
    path = tmp_path / "c.npy"
    for data in (saved[".npy"][:-3], saved[".npy"] + b"\x00" * 8):
        path.write_bytes(data)
        with pytest.raises(CodesError, match="truncated or damaged"):
            load_codes(path)
    path.write_bytes(b"")
    with pytest.raises(CodesError, match="empty"):
        load_codes(path)


def test_pickled_arrays_are_refused(tmp_path):
    path = tmp_path / "c.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CodesError, match="Python objects"):
        load_codes(path)


def _zip_bomb(path: Path, inflated: int) -> None:
    """A .npz whose one member deflates `inflated` bytes of zeros behind a valid header."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False,
                                                  "shape": (1, 1, (inflated - 128) // 8)})
    head = header.getvalue()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, \
            z.open("codes_0.npy", "w", force_zip64=True) as f:
        f.write(head)
        zeros = bytes(1 << 24)
        left = (inflated - 128) // 8 * 8
        while left:
            f.write(zeros[:min(left, len(zeros))])
            left -= min(left, len(zeros))


def test_zip_bomb_is_refused_before_it_inflates(tmp_path):
    """300 MB of zeros in a 300 kB file: refused from the archive's own sizes, in a process
    that could not even allocate the inflated member."""
    path = tmp_path / "bomb.npz"
    _zip_bomb(path, 300 << 20)
    assert path.stat().st_size < 2 << 20
    code = ("import resource, sys\n"
            "from codecport.runtime.codes import load_codes\n"
            "from codecport.errors import CodesError\n"
            "soft, hard = resource.getrlimit(resource.RLIMIT_AS)\n"
            "resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), hard))\n"
            "try:\n    load_codes(sys.argv[1])\n"
            "except CodesError as e:\n    print('refused:', e)\n")
    # Room for the interpreter and numpy, not for the 300 MB member.
    base = _vm_size_of_python_with_codecport()
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(base + (150 << 20))],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "zip bomb" in proc.stdout


def _vm_size_of_python_with_codecport() -> int:
    code = ("import codecport.runtime.codes\n"
            "print([l for l in open('/proc/self/status') if l.startswith('VmPeak')][0].split()[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return int(out.stdout.strip()) * 1024


def test_npz_member_that_lies_about_its_size(tmp_path, saved):
    """A member whose .npy header disagrees with the archive's declared size."""
    path = tmp_path / "c.npz"
    with zipfile.ZipFile(path, "w") as z:
        buf = io.BytesIO()
        np.save(buf, np.zeros((1, 4, 3), np.int64))
        z.writestr("codes_0.npy", buf.getvalue()[:-8])
        z.writestr("codec.npy", _npy(np.array("mimi")))
    with pytest.raises(CodesError, match="truncated or damaged"):
        load_codes(path)


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


# ---- property tests ------------------------------------------------------------------------
@FAST
@given(data=st.binary(max_size=3000))
def test_any_bytes_are_codes_or_one_codes_error(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("fuzz")
    for suffix in (".npy", ".npz", ".dac"):
        path = root / f"c{suffix}"
        path.write_bytes(data)
        try:
            load_codes(path)
        except CodesError as e:
            assert "\n" not in str(e)


@FAST
@given(data=st.data())
def test_damaged_valid_files_are_codes_or_one_codes_error(tmp_path_factory, saved, data):
    """Valid files with bytes flipped, cut or appended: a `CodesError`, or codes that pass every
    check (a flip inside the code values leaves a valid file)."""
    root = tmp_path_factory.mktemp("damaged")
    suffix = data.draw(st.sampled_from(sorted(saved)))
    raw = bytearray(saved[suffix])
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    path = root / f"c{suffix}"
    path.write_bytes(bytes(raw[:cut]) + data.draw(st.binary(max_size=16)))
    try:
        codes = load_codes(path)
    except CodesError:
        return
    assert all(a.ndim == 3 and a.dtype == np.int64 for a in codes.arrays)


@pytest.mark.parametrize("arrays, kw, match", [
    ((-np.ones((1, 4, 100), np.int64),), {}, "do not fit the .dac format"),
    ((np.full((1, 4, 100), 70000),), {}, "do not fit the .dac format"),
    (None, {"mode": "chunked"}, "need the chunk length"),  # chunked, but which chunks?
    (None, {"mode": "chunked", "chunk_frames": 30}, "need the chunk length"),  # 30 does not divide 100
])
def test_codes_that_do_not_fit_a_dac_file_are_refused(tmp_path, arrays, kw, match):
    """Codes made by hand, saved as `.dac`: refused in one error, nothing written (uint16 would
    wrap a negative code into another code)."""
    codes = valid_codes(**kw)
    with pytest.raises(CodesError, match=match):
        (codes.replace(arrays=arrays) if arrays else codes).save(tmp_path / "c.dac")
    assert not list(tmp_path.iterdir())


@FAST
@given(shape=st.lists(st.integers(0, 5), min_size=0, max_size=5),
       dtype=st.sampled_from(["int64", "int8", "uint16", "float32", "bool", "complex64"]))
def test_codes_checks(shape, dtype):
    a = np.zeros(shape, dtype)
    try:
        codes = Codes((a,))
    except CodesError:
        assert a.ndim not in (2, 3) or 0 in a.shape or a.dtype.kind not in "ui"
        return
    assert codes.data.ndim == 3 and codes.data.dtype == np.int64


@FAST
@given(key=st.sampled_from(["sample_rate", "frames", "n_codebooks", "codebook_size", "delay"]),
       value=st.one_of(st.text(max_size=12), st.integers(-(1 << 70), 1 << 70).map(str)))
def test_graph_metadata_is_parsed_and_bounded(key, value):
    g = Graph(Path("x.onnx"), None, {key: value})
    try:
        got = g.int(key)
    except ModelFileError as e:
        assert "x.onnx" in str(e) and "\n" not in str(e)
        return
    assert str(got) == value.strip().lstrip("+") or int(value) == got
    with pytest.raises(ModelFileError, match="has no 'absent'"):
        g.int("absent")


def test_npz_reader_limits_members(tmp_path):
    path = tmp_path / "many.npz"
    np.savez(path, **{f"a{i}": np.zeros(1) for i in range(300)})
    with pytest.raises(CodesError, match="300 members"):
        read_npz(path, CodesError)
    assert os.path.getsize(path) > 0


# ---- audio out -----------------------------------------------------------------------------
def test_a_wav_past_4_gib_is_written_as_rf64(tmp_path):
    from codecport.errors import AudioError
    from codecport.runtime.audio import audio_format, write_audio_pieces

    assert audio_format(tmp_path / "a.wav", 2, 10 * 60 * 48000) == "WAV"
    assert audio_format(tmp_path / "a.wav", 2, 600_000_000) == "RF64"  # 4.8 GB of float samples
    assert audio_format(tmp_path / "a.flac", 2, 600_000_000) == "FLAC"
    with pytest.raises(AudioError, match="not an audio format"):
        audio_format(tmp_path / "a.txt")
    # What the writer does with a total that large (told, not written: the test stays small).
    import soundfile as sf

    pieces = [np.full((2, 1000), 0.25, np.float32), np.full((2, 500), -0.5, np.float32)]
    assert write_audio_pieces(tmp_path / "big.wav", iter(pieces), 16000, frames=600_000_000) == (2, 1500)
    info = sf.info(tmp_path / "big.wav")
    assert info.format == "RF64" and info.frames == 1500 and info.subtype == "FLOAT"
    y, _ = sf.read(tmp_path / "big.wav", dtype="float32", always_2d=True)
    np.testing.assert_array_equal(y.T, np.concatenate(pieces, axis=1))


# ---- checkpoint configs --------------------------------------------------------------------
JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 40), 1 << 40)
                       | st.floats(allow_nan=True) | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=4), max_leaves=6)


@FAST
@given(conf=st.dictionaries(st.sampled_from(
    ["sampling_rate", "upsampling_ratios", "hidden_size", "num_filters", "num_hidden_layers", "_frame_rate",
     "intermediate_size", "num_attention_heads", "sliding_window", "codebook_size", "num_quantizers",
     "rope_parameters", "vector_quantization_hidden_dimension", "kernel_size", "compress"]),
    JSONISH, max_size=6))
# Found by this test: the ratios' product, taken before they were checked, repeated the inner list
# 88 billion times (a test process was killed for memory at 22 GB).
@example(conf={"upsampling_ratios": [[88061255015, True], 88061255015, None, None], "hidden_size": True})
def test_any_mimi_config_json_is_a_config_or_one_checkpoint_error(conf):
    from codecport.codecs.mimi.weights import config_from_transformers
    from codecport.errors import CheckpointError

    try:
        cfg = config_from_transformers(conf, "config.json")
    except CheckpointError as e:
        assert "\n" not in str(e)
        return
    assert cfg.approx_params() <= 2_000_000_000


@FAST
@given(kwargs=st.dictionaries(st.sampled_from(
    ["sample_rate", "encoder_dim", "encoder_rates", "latent_dim", "decoder_dim", "decoder_rates",
     "n_codebooks", "codebook_size", "codebook_dim"]), JSONISH, max_size=6))
def test_any_dac_metadata_kwargs_are_a_config_or_one_config_error(kwargs):
    from codecport.codecs.dac.config import DacConfig
    from codecport.errors import ConfigError

    try:
        cfg = DacConfig.from_kwargs(kwargs)
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    assert cfg.approx_params() <= 2_000_000_000 and cfg.hop_length >= 1


def test_the_loudness_meter_holds_no_block_of_samples():
    """It keeps a running sum per gating-block edge, not the blocks it saw: an hour of audio
    leaves it a few hundred kB, whatever the block size."""
    from codecport.runtime.loudness import LoudnessMeter

    meter = LoudnessMeter(16000, 2)
    block = np.random.default_rng(0).standard_normal((2, 1 << 16)).astype(np.float32) * 0.1
    for _ in range(30):  # 2 minutes
        meter.push(block)
    held = sum(v.nbytes if v.base is None else v.base.nbytes for v in meter.at.values())
    assert len(meter.at) > 1000 and held < 100_000
    assert -30 < meter.result() < 0


@pytest.mark.parametrize("descr, shape", [("<i8", (-1, -1, 1)), ("|V0", (1, 1, 5))])
def test_npy_header_with_negative_dims_or_empty_items(tmp_path, descr, shape):
    path = tmp_path / "c.npy"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    path.write_bytes(header.getvalue() + b"\x00" * 8)
    with pytest.raises(CodesError, match="a damaged .npy header"):
        load_codes(path)


def test_npz_member_marked_encrypted(tmp_path):
    path = tmp_path / "c.npz"
    np.savez(path, codes_0=np.zeros((1, 1, 5), np.int64))
    data = bytearray(path.read_bytes())
    for sig, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local and central headers
        at = data.index(sig)
        data[at + flags_at] |= 1
    path.write_bytes(bytes(data))
    with pytest.raises(CodesError, match="encrypted"):
        load_codes(path)


def test_codes_a_codec_never_writes_are_refused(smoke_exports):
    """An extra time scale would be dropped without a word, and a loudness on codes of a codec
    that never measures one would set the output's gain: both refused."""
    from codecport import load

    codec = load(smoke_exports["neucodec"])
    codes = codec.encode(np.zeros((1, 3000), np.float32), codec.input_rate)
    with pytest.raises(CodesError, match="NeuCodec codes are 1 time scale; these hold 2"):
        codec.decode(Codes(codes.arrays * 2))
    with pytest.raises(CodesError, match="carry a loudness"):
        codec.decode(codes.replace(loudness_db=-20.0))
    codec.decode(codes)


@pytest.mark.parametrize("layout", ["codes", "codes_i", "arr_i"])
def test_a_npz_of_code_arrays_only_decodes_as_bare_codes(tmp_path, smoke_exports, layout):
    """Codes saved with np.savez as users of the official packages save them (`codes`, or one
    array per time scale as `codes_0`, `codes_1`, ..., or savez's own `arr_0`, ...) decode
    with the folder's codec, as a bare .npy does, saying so on stderr."""
    from click.testing import CliRunner

    from codecport import load
    from codecport.cli import run_cli

    name = "snac" if layout != "codes" else "dac"
    codec = load(smoke_exports[name])
    x = np.random.default_rng(1).standard_normal((1, 3000)).astype(np.float32) * 0.2
    codes = codec.encode(x, codec.sample_rate)
    # The official shapes: DAC's [B, K, T], SNAC's list of [B, T] per time scale.
    arrays = [codes.data] if name == "dac" else [a[:, 0] for a in codes.arrays]
    path = tmp_path / "official.npz"
    if layout == "codes":
        np.savez(path, codes=arrays[0])
    elif layout == "codes_i":
        np.savez(path, **{f"codes_{i}": a for i, a in enumerate(arrays)})
    else:
        np.savez(path, *arrays)
    got = load_codes(path)
    assert got.bare and [a.tolist() for a in got.arrays] == [a.tolist() for a in codes.arrays]
    out = tmp_path / "o.wav"
    noise = ["--no-noise"] if codec.draws_noise else []
    result = CliRunner().invoke(run_cli, ["decode", str(path), "-m", str(smoke_exports[name]),
                                          "-o", str(out), *noise])
    assert result.exit_code == 0, result.output
    assert f"names no codec: decoding it as bare {codec.label} codes" in result.output
    want, _ = codec.decode(codes.replace(sample_rate=None, num_samples=None, loudness_db=None),
                           **({"noise": "zero"} if codec.draws_noise else {}))
    import soundfile as sf

    audio, sr = sf.read(out, dtype="float32", always_2d=True)
    assert sr == codec.sample_rate and audio.shape[0] == want.shape[1]
    np.testing.assert_allclose(audio.T, np.clip(want, -1, 1), atol=1e-6)
