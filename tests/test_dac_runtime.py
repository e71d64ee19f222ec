"""Runtime (ONNX + numpy RVQ) against the torch reference: exact graphs, chunked mode, .dac files."""

from __future__ import annotations

import threading

import numpy as np
import pyloudnorm
import pytest
import torch
from shared_exports import TINY_CHUNK, TINY_LEN
from support import noise

from codecport.codecs.dac.export import rvq_of
from codecport.codecs.dac.runtime import DacCodec
from codecport.errors import ProviderError
from codecport.runtime import folder as folder_module
from codecport.runtime import providers
from codecport.runtime.codes import load_codes


@pytest.fixture(scope="module")
def codec(tiny_export):
    return DacCodec(tiny_export)


def _torch_chunked_codes(model, audio: np.ndarray, window: int) -> np.ndarray:
    """The official chunked `compress` loop, written out in torch (no ONNX, no runtime code)."""
    model.set_padding(False)
    try:
        step, delay = model.output_length(window), model.delay()
        x = torch.from_numpy(audio)[:, None]
        x = torch.nn.functional.pad(x, (delay, delay))
        codes = []
        with torch.no_grad():
            for i in range(0, audio.shape[1], step):
                chunk = x[..., i:i + window]
                chunk = torch.nn.functional.pad(chunk, (0, window - chunk.shape[-1]))
                codes.append(model.encode(chunk))
        return torch.cat(codes, dim=-1).numpy()
    finally:
        model.set_padding(True)


def _torch_chunked_audio(model, codes: np.ndarray, chunk: int) -> np.ndarray:
    model.set_padding(False)
    try:
        with torch.no_grad():
            parts = [model.decode(torch.from_numpy(codes[..., i:i + chunk]))
                     for i in range(0, codes.shape[-1], chunk)]
        return torch.cat(parts, dim=-1)[:, 0].numpy()
    finally:
        model.set_padding(True)


def test_numpy_rvq_equals_torch_quantizer(tiny_dac):
    rvq = rvq_of(tiny_dac)
    z = torch.randn(1, tiny_dac.cfg.latent_dim, 300, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = tiny_dac.quantizer.encode(z)[0].numpy()
        latent = tiny_dac.quantizer.decode(torch.from_numpy(want)[None])[0].numpy()
    np.testing.assert_array_equal(rvq.encode(z[0].numpy()), want)
    assert np.abs(rvq.decode(want) - latent).max() <= 1e-5
    np.testing.assert_array_equal(rvq.encode(z[0].numpy(), 2), want[:2])


@pytest.mark.parametrize("n", [TINY_LEN, TINY_LEN - 5])
def test_exact_graph_equals_official_encode(codec, tiny_dac, n):
    """Audio that fills the fixed graph gives the codes and audio of the model's own encode/decode."""
    audio = noise(n, channels=2, seed=n)
    codes = codec.encode(audio, 16000, mode="fixed").data
    with torch.no_grad():
        want = tiny_dac.encode(torch.from_numpy(audio)[:, None])
        want_audio = tiny_dac.decode(want)[:, 0].numpy()
    np.testing.assert_array_equal(codes, want.numpy())
    assert np.abs(codec.decode(codes, mode="fixed")[0] - want_audio).max() <= 1e-4


def test_chunked_long_audio_equals_torch_procedure(codec, tiny_dac):
    audio = noise(7 * TINY_CHUNK + 123, channels=2, seed=9)
    codes = codec.encode(audio, 16000, mode="chunked").data
    want = _torch_chunked_codes(tiny_dac, audio, TINY_CHUNK)
    np.testing.assert_array_equal(codes, want)
    chunk = codec.graph("decoder_chunked").int("chunk_frames")
    got = codec.decode(codes, mode="chunked")[0]
    assert np.abs(got - _torch_chunked_audio(tiny_dac, codes, chunk)).max() <= 1e-4
    assert got.shape[1] >= audio.shape[1]  # every input sample has output


def test_fewer_codebooks_are_a_prefix(codec):
    audio = noise(4000, seed=5)
    full = codec.encode(audio, 16000, mode="chunked").data
    np.testing.assert_array_equal(codec.encode(audio, 16000, 2, mode="chunked").data, full[:, :2])


def test_dac_file_round_trip(codec, tmp_path):
    audio = noise(8000, channels=2, seed=11)
    f = codec.encode(audio, 16000)
    assert f.mode == "chunked" and f.chunk_frames == codec.graph("decoder_chunked").int("chunk_frames")
    meter = pyloudnorm.Meter(16000)
    assert f.loudness_db == pytest.approx(meter.integrated_loudness(audio.T.astype(np.float64)), abs=1e-6)
    f.save(tmp_path / "a.dac")
    # What the official DACFile.load reads: np.load(allow_pickle=True)[()] with these types.
    raw = np.load(tmp_path / "a.dac", allow_pickle=True)[()]
    assert set(raw) == {"codes", "metadata"}
    assert raw["codes"].dtype == np.uint16 and raw["metadata"]["input_db"].dtype == np.float32
    assert raw["metadata"]["dac_version"] == "1.0.0" and raw["metadata"]["padding"] is False
    assert raw["metadata"]["chunk_length"] == f.chunk_frames
    g = load_codes(tmp_path / "a.dac")
    np.testing.assert_array_equal(g.data, f.data)
    assert (g.num_samples, g.channels, g.sample_rate, g.mode) == (8000, 2, 16000, "chunked")
    out, sr = codec.decode(g)
    assert sr == 16000 and out.shape == (2, 8000) and np.isfinite(out).all()
    # Official decompress restores the input loudness on the decoded audio.
    assert meter.integrated_loudness(out.T.astype(np.float64)) == pytest.approx(f.loudness_db, abs=0.5)


def test_encode_of_exact_length_uses_the_fixed_graph(codec, tiny_dac):
    audio = noise(TINY_LEN, seed=12)
    f = codec.encode(audio, 16000)
    assert f.mode == "fixed" and f.chunk_frames is None
    with torch.no_grad():
        np.testing.assert_array_equal(f.data, tiny_dac.encode(torch.from_numpy(audio)[:, None]).numpy())


def test_loud_input_is_scaled_to_a_peak_of_one_first(codec, tiny_dac):
    """The official `ensure_max_of_audio`: a channel peaking above 1 is encoded scaled to 1."""
    audio = noise(TINY_LEN, channels=2, seed=14)
    loud = audio.copy()
    loud[1] *= 3 / np.abs(loud[1]).max()
    codes = codec.encode(loud, 16000).data
    np.testing.assert_array_equal(codes[0], codec.encode(audio[:1], 16000).data[0])
    gain = np.float32(1.0 / float(np.abs(loud[1]).max()))
    assert np.abs(loud[1:] * gain).max() <= 1
    np.testing.assert_array_equal(codes[1], codec.encode(loud[1:] * gain, 16000).data[0])
    with torch.no_grad():  # the control: unscaled, the model gives other codes
        unscaled = tiny_dac.encode(torch.from_numpy(loud[1:])[:, None]).numpy()[0]
    assert not np.array_equal(codes[1], unscaled)


def test_resampled_input_keeps_its_rate_and_length(codec):
    audio = noise(9000, seed=13)
    f = codec.encode(audio, 22050)
    assert (f.sample_rate, f.num_samples) == (22050, 9000)
    out, sr = codec.decode(f)
    assert sr == 22050 and out.shape == (1, 9000)


def test_decoder_only_folder(tmp_path, tiny_export):
    """An app may ship only the decoders: decoding works and equals the full folder's."""
    import shutil

    from codecport.errors import ModelFileError

    for name in ("decoder.onnx", "decoder_chunked.onnx", "rvq.npz", "manifest.json"):
        shutil.copy(tiny_export / name, tmp_path / name)
    full, dec_only = DacCodec(tiny_export), DacCodec(tmp_path)
    for frames in (full.fixed_frames(), 3 * full.graph("decoder_chunked").int("chunk_frames")):
        codes = np.random.default_rng(frames).integers(0, full.codebook_size, (1, full.n_codebooks, frames))
        np.testing.assert_array_equal(dec_only.decode(codes)[0], full.decode(codes)[0])
    with pytest.raises(ModelFileError, match="encoder"):
        dec_only.encode(noise(600), 16000)


# (windows at once, cores, intra-op threads of each sliding session: 0 is ORT's default)
@pytest.mark.parametrize("windows, cores, threads", [("1", 6, 0), ("3", 6, 2), ("3", 2, 1)])
def test_parallel_windows_give_the_same_bits(codec, tiny_export, monkeypatch, windows, cores, threads):
    """Windows of a long signal run at once (`parallel` option) give exactly the one-at-a-time
    results, in order; each sliding session gets its share of the cores (at least one)."""
    monkeypatch.setattr(folder_module, "cpu_cores", lambda: cores)
    other = DacCodec(tiny_export, options={"parallel": windows})
    assert other.parallel == int(windows)
    audio = noise(9 * TINY_CHUNK + 7, channels=2, seed=3)
    codes = codec.encode(audio, 16000, mode="chunked").data
    np.testing.assert_array_equal(other.encode(audio, 16000, mode="chunked").data, codes)
    np.testing.assert_array_equal(other.decode(codes, mode="chunked")[0],
                                  codec.decode(codes, mode="chunked")[0])
    assert other.graph("decoder_chunked").session.get_session_options().intra_op_num_threads == threads
    assert other.graph("decoder").session.get_session_options().intra_op_num_threads == 0


@pytest.mark.parametrize("cores, windows", [(1, 1), (2, 2), (16, 2)])
def test_auto_windows_follow_the_cores(tiny_export, monkeypatch, cores, windows):
    monkeypatch.setattr(providers, "cpu_cores", lambda: cores)
    assert DacCodec(tiny_export).parallel == windows


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_bad_windows_option_is_refused(tiny_export, value):
    with pytest.raises(ProviderError, match="option parallel must be auto or a whole number"):
        DacCodec(tiny_export, options={"parallel": value})


def test_map_windows_keeps_order_bounds_memory_and_raises(tiny_export):
    """Results come in the order of the items, though window 1 ends before window 0 (which waits
    for it); the items are drawn at most `parallel` ahead of the results taken (memory stays
    bounded); an error raises at its window."""
    codec = DacCodec(tiny_export, options={"parallel": "2"})
    drawn = []
    first_done = threading.Event()

    def items():
        for i in range(10):
            drawn.append(i)
            yield i

    def window(i):
        if i == 0:  # a later window ends first
            assert first_done.wait(60), "window 1 never ran beside window 0"
        if i == 1:
            first_done.set()
        if i == 7:
            raise ValueError("window 7")
        return i

    results = codec.map_windows(window, items())
    assert [next(results) for _ in range(5)] == [0, 1, 2, 3, 4]
    assert drawn == [0, 1, 2, 3, 4, 5, 6]  # the 5 taken and 2 running
    with pytest.raises(ValueError, match="window 7"):
        list(results)


@pytest.mark.parametrize("n", [TINY_LEN, TINY_LEN + 1, 5 * TINY_LEN + 3, 40 * TINY_LEN + 7])
def test_whole_mode_gives_the_official_encode_and_decode_of_the_whole_clip(codec, tiny_dac, n):
    """The fixed graphs in windows overlapping by their receptive field (metadata `margin`):
    a clip of up to 40 windows has the codes `DAC.encode` gives the whole clip at once, and
    decodes to its `DAC.decode`, the chunked mode's seams gone."""
    x = noise(n, seed=n)
    codes = codec.encode(x, 16000, mode="whole")
    with torch.no_grad():
        want = tiny_dac.encode(torch.from_numpy(x)[None]).numpy()
        want_audio = tiny_dac.decode(torch.from_numpy(want))[:, 0].numpy()
    assert codes.mode == "whole" and codes.data.shape == want.shape
    np.testing.assert_array_equal(codes.data, want)
    audio = codec.decode(codes.replace(loudness_db=None, sample_rate=None, num_samples=None))[0]
    assert audio.shape == want_audio.shape and float(np.abs(audio - want_audio).max()) <= 1e-5
    if n > 5 * TINY_LEN:  # the chunked mode cuts the clip: its codes are not these
        chunked = codec.encode(x, 16000, mode="chunked").data
        assert chunked.shape != want.shape or not np.array_equal(chunked, want)


def test_whole_codes_round_trip_through_npz_and_dac(codec, tmp_path):
    x = noise(7 * TINY_LEN, seed=3)
    codes = codec.encode(x, 16000, mode="whole")
    want = codec.decode(codes)[0]
    for suffix in (".npz", ".dac"):
        codes.save(tmp_path / f"c{suffix}")
        got = load_codes(tmp_path / f"c{suffix}")
        np.testing.assert_array_equal(got.data, codes.data)
        # A .dac holds them as the official one-call decode (padding on, one chunk of every frame).
        np.testing.assert_allclose(codec.decode(got)[0], want, atol=1e-5)


def test_whole_mode_says_what_it_needs(codec, tiny_export, tiny_dac, tmp_path):
    from codecport.codecs.dac.export import export_dac
    from codecport.errors import CodesError, ModelFileError

    with pytest.raises(CodesError, match="shorter than the fixed graph"):
        codec.encode(noise(TINY_LEN - 7), 16000, mode="whole")
    odd = tmp_path / "odd"
    export_dac(tiny_dac, odd, TINY_LEN + 1, TINY_CHUNK, preset="tiny", weights="r", weights_sha256="none")
    with pytest.raises(CodesError, match="--len a multiple of 6"):
        DacCodec(odd).encode(noise(3000), 16000, mode="whole")
    old = tmp_path / "old"
    import shutil

    import onnx

    shutil.copytree(tiny_export, old)
    for name in ("encoder", "decoder"):
        m = onnx.load(str(old / f"{name}.onnx"))
        keep = [p for p in m.metadata_props if p.key != "margin"]
        del m.metadata_props[:]
        m.metadata_props.extend(keep)
        onnx.save(m, str(old / f"{name}.onnx"))
    with pytest.raises(ModelFileError, match="exported before the whole mode"):
        DacCodec(old).encode(noise(3000), 16000, mode="whole")
