"""Mimi runtime (ONNX step/fixed graphs + numpy split RVQ) against the torch reference model."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch
from shared_exports import MIMI_TINY_FRAMES, MIMI_TINY_STEP
from support import noise

from codecport.codecs.mimi.export import export_mimi, rvq_of
from codecport.codecs.mimi.runtime import MimiCodec
from codecport.errors import AudioError, CodesError, ModelFileError
from codecport.runtime.audio import resample
from codecport.runtime.codes import Codes, load_codes

FRAME = 24  # samples per code frame of the tiny config
LONG = 160 * FRAME - 5  # 160 frames: 320 transformer positions, past the 250-position window


@pytest.fixture(scope="module")
def codec(tiny_mimi_export):
    return MimiCodec(tiny_mimi_export)


def _copy(src, dst, names):
    dst.mkdir()
    for name in names:
        shutil.copy(src / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_mimi_export):
    """The export split into a fixed-only and a step-only folder."""
    root = tmp_path_factory.mktemp("mimi_split")
    return {
        "fixed": _copy(tiny_mimi_export, root / "fixed", ["encoder.onnx", "decoder.onnx", "rvq.npz"]),
        "step": _copy(tiny_mimi_export, root / "step", ["encoder_step.onnx", "decoder_step.onnx",
                                                        "rvq.npz"]),
    }


def _torch_codes(model, audio: np.ndarray, k: int | None = None) -> np.ndarray:
    """moshi's procedure: zero-pad `[C, N]` to whole frames, encode each channel."""
    with torch.no_grad():
        return model.encode(model.pad(torch.from_numpy(audio)[:, None]), k).numpy()


def _torch_audio(model, codes: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.decode(torch.from_numpy(codes))[:, 0].numpy()


def test_tiny_config_is_what_the_tests_assume(tiny_mimi, codec):
    assert tiny_mimi.cfg.frame_size == codec.frame_size == FRAME
    assert codec.graph("encoder").int("frames") == MIMI_TINY_FRAMES
    assert codec.graph("encoder_step").int("frames") == MIMI_TINY_STEP
    assert 2 * math.ceil(LONG / FRAME) > tiny_mimi.cfg.context


def test_numpy_rvq_equals_torch_quantizer(tiny_mimi):
    rvq = rvq_of(tiny_mimi)
    z = torch.randn(1, tiny_mimi.cfg.dimension, 200, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = tiny_mimi.quantizer.encode(z, 4)[0].numpy()
        latent = tiny_mimi.quantizer.decode(torch.from_numpy(want)[None])[0].numpy()
    np.testing.assert_array_equal(rvq.encode(z[0].numpy()), want)
    np.testing.assert_array_equal(rvq.encode(z[0].numpy(), 2), want[:2])
    assert np.abs(rvq.decode(want) - latent).max() <= 1e-5


# ---- streaming equals the whole clip ------------------------------------------------------
def test_streaming_long_clip_equals_whole_clip(codec, tiny_mimi):
    """Past the attention window, the step graphs' carried state still gives moshi's codes."""
    audio = noise(LONG, channels=2, seed=1)
    codes = codec.encode(audio, 24000, mode="step").data
    want = _torch_codes(tiny_mimi, audio)
    assert codes.shape == want.shape == (2, 4, 160)
    np.testing.assert_array_equal(codes, want)
    assert len(np.unique(codes)) > 20  # spread-out codes: the comparison means something
    out, _ = codec.decode(codes, mode="step")
    ref = _torch_audio(tiny_mimi, codes)
    assert out.shape == ref.shape == (2, 160 * FRAME)
    assert np.abs(out - ref).max() <= 1e-4
    assert np.abs(ref).max() > 1e-2  # audio-scale output, not near-silence


def test_fixed_and_step_graphs_agree(folders, tiny_mimi):
    """A clip that fits: the fixed graph and the step graphs both give torch's result."""
    audio = noise(MIMI_TINY_FRAMES * FRAME - 13, seed=2)
    fixed, step = MimiCodec(folders["fixed"]), MimiCodec(folders["step"])
    want = _torch_codes(tiny_mimi, audio)
    codes = fixed.encode(audio, 24000).data
    np.testing.assert_array_equal(codes, want)
    np.testing.assert_array_equal(step.encode(audio, 24000).data, want)
    ref = _torch_audio(tiny_mimi, codes)
    a, b = fixed.decode(codes)[0], step.decode(codes)[0]
    assert a.shape == b.shape == ref.shape == (1, MIMI_TINY_FRAMES * FRAME)
    assert np.abs(a - ref).max() <= 1e-4 and np.abs(b - ref).max() <= 1e-4
    assert np.abs(a - b).max() <= 1e-4


@pytest.mark.parametrize("n", [1, 23, 24, 25, 959, 960, 961, 5000])
def test_any_length(codec, tiny_mimi, n):
    audio = noise(n, seed=n)
    frames = math.ceil(n / FRAME)
    codes = codec.encode(audio, 24000).data
    assert codes.shape == (1, 4, frames) and codes.dtype == np.int64
    np.testing.assert_array_equal(codes, _torch_codes(tiny_mimi, audio))
    out, _ = codec.decode(codes)
    assert out.shape == (1, frames * FRAME)
    assert np.abs(out - _torch_audio(tiny_mimi, codes)).max() <= 1e-4


# ---- stream() (the encoder and decoder streams in one) ----------------------------------------
def _feed_audio(stream, audio: np.ndarray, chunk: int) -> np.ndarray:
    pieces, fed = [], 0
    for i in range(0, len(audio), chunk):
        pieces.append(stream.encode_step(audio[i:i + chunk]))
        fed += len(audio[i:i + chunk])
        # Codes come out as soon as a step is complete, never before.
        done = sum(p.shape[1] for p in pieces)
        assert done == fed // stream.step_samples * stream.step_frames
    return np.concatenate([*pieces, stream.flush_encoder()], axis=1)


def _feed_codes(stream, codes: np.ndarray, chunk: int) -> np.ndarray:
    pieces, fed = [], 0
    for i in range(0, codes.shape[1], chunk):
        pieces.append(stream.decode_step(codes[:, i:i + chunk]))
        fed += codes[:, i:i + chunk].shape[1]
        assert sum(len(p) for p in pieces) == fed // stream.step_frames * stream.step_samples
    return np.concatenate([*pieces, stream.flush_decoder()])


@pytest.mark.parametrize("chunk", [1, 17, 100])
def test_stream_encode_in_odd_chunks(codec, tiny_mimi, chunk):
    audio = noise(1001, seed=chunk)[0]
    codes = _feed_audio(codec.stream(), audio, chunk)
    np.testing.assert_array_equal(codes, _torch_codes(tiny_mimi, audio[None])[0])
    np.testing.assert_array_equal(codes, codec.encode(audio[None], 24000).data[0])


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_stream_decode_in_odd_chunks(codec, tiny_mimi, chunk):
    codes = codec.encode(noise(43 * FRAME, seed=20 + chunk), 24000).data[0]
    out = _feed_codes(codec.stream(), codes, chunk)
    assert out.shape == (43 * FRAME,)
    np.testing.assert_array_equal(out, codec.decode(codes, mode="step")[0][0])
    assert np.abs(out - _torch_audio(tiny_mimi, codes[None])[0]).max() <= 1e-4


def test_stream_reset_restarts(codec):
    audio = noise(700, seed=30)[0]
    codes = codec.encode(audio[None], 24000).data[0]
    stream = codec.stream()
    first_codes = _feed_audio(stream, audio, 50)
    first_audio = _feed_codes(stream, codes, 5)
    # Leave both sides mid-stream (state advanced, samples and frames buffered), then reset.
    assert stream.encode_step(audio[:100]).shape[1] > 0
    assert len(stream.decode_step(codes[:, :3])) > 0
    stream.reset()
    np.testing.assert_array_equal(_feed_audio(stream, audio, 50), first_codes)
    np.testing.assert_array_equal(_feed_codes(stream, codes, 5), first_audio)
    np.testing.assert_array_equal(first_codes, codes)


def test_fewer_codebooks_are_a_prefix(codec, tiny_mimi):
    audio = noise(1500, seed=40)
    full = codec.encode(audio, 24000).data
    np.testing.assert_array_equal(codec.encode(audio, 24000, 2).data, full[:, :2])
    np.testing.assert_array_equal(codec.encode(audio, 24000, 2, mode="step").data, full[:, :2])
    np.testing.assert_array_equal(_feed_audio(codec.stream(2), audio[0], 37), full[0, :2])
    # Decoding the first K levels is torch's decode of those K levels.
    for k in (1, 2):
        ref = _torch_audio(tiny_mimi, full[:, :k])
        assert np.abs(codec.decode(full[:, :k])[0] - ref).max() <= 1e-4
        assert np.abs(_feed_codes(codec.stream(), full[0, :k], 3) - ref[0]).max() <= 1e-4


def test_resampled_input(codec, tiny_mimi):
    audio = noise(3001, seed=50)
    at24 = resample(audio, 16000, 24000)
    assert at24.shape[1] == pytest.approx(3001 * 1.5, abs=1)
    codes = codec.encode(audio, 16000).data
    assert codes.shape == (1, 4, math.ceil(at24.shape[1] / FRAME))
    np.testing.assert_array_equal(codes, codec.encode(at24, 24000).data)
    np.testing.assert_array_equal(codes, _torch_codes(tiny_mimi, at24))


# ---- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize("codes, match", [
    (np.full((1, 4, 3), 64), r"codes must be in \[0, 64\)"),
    (np.full((1, 4, 3), -1), r"codes must be in \[0, 64\)"),
    (np.zeros(5, np.int64), "codes must be"),
    (np.zeros((1, 1, 4, 3), np.int64), "codes must be"),
    (np.zeros((1, 5, 3), np.int64), "codebooks<=4"),
    (np.zeros((1, 4, 0), np.int64), "codes must be"),
    (np.zeros((1, 4, 3), np.float32), "integers"),
])
def test_bad_codes(codec, codes, match):
    with pytest.raises(CodesError, match=match):
        codec.decode(codes)
    if codes.shape[-1] == 0:
        return  # a stream takes no frames at all as nothing new (an encoder's push may give none)
    with pytest.raises(CodesError, match=match):
        codec.stream().decode_step(codes[0] if codes.ndim == 3 else codes)


@pytest.mark.parametrize("k", [0, 5])
def test_bad_codebook_count(codec, k):
    with pytest.raises(CodesError, match="--codebooks must be between 1 and 4"):
        codec.encode(noise(100), 24000, k)
    with pytest.raises(CodesError, match="--codebooks must be between 1 and 4"):
        codec.stream(k)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_audio(codec, bad):
    audio = noise(2000)
    audio[0, 1500] = bad
    for mode in (None, "step"):
        with pytest.raises(AudioError, match="NaN or infinite"):
            codec.encode(audio, 24000, mode=mode)
    with pytest.raises(AudioError, match="NaN or infinite"):
        codec.stream().encode_step(audio[0])


def test_empty_audio(codec):
    with pytest.raises(AudioError, match="no samples"):
        codec.encode(np.zeros((1, 0), np.float32), 24000)


def test_stream_decode_changing_codebook_count(codec):
    stream = codec.stream()
    stream.decode_step(np.zeros((4, 1), np.int64))  # one frame buffered
    with pytest.raises(CodesError, match="decoding 4 codebooks, got 2"):
        stream.decode_step(np.zeros((2, 1), np.int64))


def test_mixed_exports_are_refused(tmp_path, tiny_mimi, tiny_mimi_export):
    """A graph copied in from another export is refused once it meets the folder's graphs."""
    other = tmp_path / "other"
    export_mimi(tiny_mimi, other, 20 * FRAME, None, preset="tiny", weights="random-init seed 0",
                weights_sha256="none")
    mixed = _copy(tiny_mimi_export, tmp_path / "mixed", ["encoder.onnx", "encoder_step.onnx",
                                                          "decoder_step.onnx", "rvq.npz"])
    shutil.copy(other / "decoder.onnx", mixed / "decoder.onnx")
    codec = MimiCodec(mixed)
    codes = codec.encode(noise(100), 24000)
    with pytest.raises(ModelFileError, match="export_id"):
        codec.decode(codes)


def test_graph_and_rvq_swapped_together_are_refused(tmp_path, tiny_mimi, tiny_mimi_export):
    """An encoder and rvq.npz copied in together agree with each other; manifest.json catches them
    before anything is encoded, as the graphs are opened lazily."""
    other = tmp_path / "other"
    export_mimi(tiny_mimi, other, 20 * FRAME, None, preset="tiny", weights="random-init seed 0",
                weights_sha256="none")
    mixed = _copy(tiny_mimi_export, tmp_path / "mixed", ["decoder.onnx", "encoder_step.onnx",
                                                          "decoder_step.onnx", "manifest.json"])
    for name in ("encoder.onnx", "rvq.npz"):
        shutil.copy(other / name, mixed / name)
    with pytest.raises(ModelFileError, match="manifest.json"):
        MimiCodec(mixed)


def test_folder_without_graphs(tmp_path):
    with pytest.raises(ModelFileError, match="holds no Mimi graphs"):
        MimiCodec(tmp_path)
    with pytest.raises(ModelFileError, match="no such model folder"):
        MimiCodec(tmp_path / "missing")


def test_missing_or_corrupt_rvq(tmp_path, tiny_mimi_export):
    folder = _copy(tiny_mimi_export, tmp_path / "m", ["encoder.onnx", "decoder.onnx"])
    with pytest.raises(ModelFileError, match="rvq.npz"):
        MimiCodec(folder)
    (folder / "rvq.npz").write_bytes((tiny_mimi_export / "rvq.npz").read_bytes()[:500])
    with pytest.raises(ModelFileError, match="rvq.npz"):
        MimiCodec(folder)
    with open(folder / "rvq.npz", "wb") as f:  # a bare array, not the RVQ arrays
        np.save(f, np.zeros(3, np.float32))
    with pytest.raises(ModelFileError, match="rvq.npz"):
        MimiCodec(folder)


def test_corrupt_graph(tmp_path, tiny_mimi_export):
    folder = _copy(tiny_mimi_export, tmp_path / "m", ["rvq.npz"])
    (folder / "encoder.onnx").write_bytes((tiny_mimi_export / "encoder.onnx").read_bytes()[:1000])
    with pytest.raises(ModelFileError, match="encoder.onnx"):
        MimiCodec(folder)


def test_fixed_only_folder_refuses_long_input(folders):
    """A folder without step graphs (an export before they were always written) encodes what
    fits and says to re-export for the rest."""
    codec = MimiCodec(folders["fixed"])
    n = MIMI_TINY_FRAMES * FRAME
    assert codec.encode(noise(n), 24000).data.shape == (1, 4, MIMI_TINY_FRAMES)  # what fits still works
    with pytest.raises(ModelFileError, match="re-export it with codec-export mimi"):
        codec.encode(noise(n + 1), 24000)
    with pytest.raises(ModelFileError, match="re-export it with codec-export mimi"):
        codec.decode(np.zeros((1, 4, MIMI_TINY_FRAMES + 1), np.int64))
    with pytest.raises(ModelFileError, match="re-export it with codec-export mimi"):
        codec.stream()


# ---- codes files --------------------------------------------------------------------------
def test_codes_file_round_trip(codec, tmp_path):
    audio = noise(2345, channels=2, seed=60)
    codes = codec.encode(audio, 16000)
    path = tmp_path / "codes.npz"
    codes.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["codes.npz"]  # no .part file left
    got = load_codes(path)
    np.testing.assert_array_equal(got.data, codes.data)
    assert got.data.dtype == np.int64 and (got.num_samples, got.sample_rate) == (2345, 16000)
    assert (got.codec, got.preset, got.export_id, got.mode) == ("mimi", "tiny", codec.export_id, "step")
    np.testing.assert_array_equal(codec.decode(got)[0], codec.decode(codes)[0])
    assert codec.decode(got)[0].shape == (2, 2345)


def test_codes_of_another_codec_are_refused(codec, tmp_path):
    other = Codes((np.zeros((1, 4, 3), np.int64),), codec="dac", sample_rate=24000, num_samples=72)
    other.save(tmp_path / "dac.npz")
    with pytest.raises(CodesError, match="these are dac codes; this folder holds mimi"):
        codec.decode(load_codes(tmp_path / "dac.npz"))


def test_load_codes_refuses_other_files(tmp_path):
    codes = np.zeros((1, 4, 3), np.int64)
    good = tmp_path / "good.npz"
    Codes((codes,), codec="mimi", sample_rate=24000, num_samples=72).save(good)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:200])
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a codes file at all")
    pickled = tmp_path / "pickled.npz"
    with open(pickled, "wb") as f:
        np.save(f, np.array({"codes": codes}, dtype=object), allow_pickle=True)
    plain = tmp_path / "plain.npz"  # a bare array saved under the .npz name
    with open(plain, "wb") as f:
        np.save(f, codes)
    # (A .npz of code arrays with no codec named is bare codes: test_files.py.)
    for path in (truncated, garbage, pickled, plain):
        with pytest.raises(CodesError, match="not a codes file"):
            load_codes(path)
    with pytest.raises(CodesError, match="no such codes file"):
        load_codes(tmp_path / "missing.npz")


def test_a_flush_with_nothing_buffered_leaves_the_stream_as_it_was(codec):
    """Whole steps pushed, a flush of nothing, then more: the same as never flushing."""
    x = noise(20 * codec.frame_size, seed=4)[0]
    step = codec.encoder_stream().step_samples
    whole = codec.encoder_stream()
    want = np.concatenate([whole.push(x), whole.flush()], axis=1)
    s = codec.encoder_stream()
    head = s.push(x[:4 * step])
    assert s.flush().shape[1] == 0
    np.testing.assert_array_equal(np.concatenate([head, s.push(x[4 * step:]), s.flush()], axis=1), want)
