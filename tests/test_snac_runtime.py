"""The SNAC runtime (ONNX window graphs + numpy RVQ) against the official `snac` package: the
whole clip's codes and audio for any length, the stream decoder, the noise, the Orpheus layout."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch
from shared_exports import SNAC_TINY_LEN
from support import noise

from codecport.codecs.snac.codesfile import from_orpheus, to_orpheus
from codecport.codecs.snac.runtime import SnacCodec
from codecport.runtime.codes import Codes
from codecport.runtime.plan import overlap_windows as windows

SR = 16000  # the tiny preset's rate
HOP = 6


@pytest.fixture(scope="module")
def codec(tiny_snac_export) -> SnacCodec:
    return SnacCodec(tiny_snac_export)


def _official_codes(official, x: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        return [c.numpy() for c in official.encode(torch.from_numpy(x)[:, None])]


def _official_audio(official, codes: list[np.ndarray], seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The official decode under a torch seed, and the noise it drew (its blocks draw in order)."""
    t = [torch.from_numpy(c) for c in codes]
    torch.manual_seed(seed)
    with torch.no_grad():
        audio = official.decode(t)[:, 0].numpy()
    torch.manual_seed(seed)
    n, drawn = codes[-1].shape[-1] * official.vq_strides[-1], []
    for s in official.decoder_rates:
        n *= s
        drawn.append(torch.randn(codes[0].shape[0], 1, n)[:, 0].numpy())
    return audio, drawn


def test_windows_cover_the_clip_once_with_their_margins():
    for n in (4, 100, 120, 121 * 4, 1000):
        plan = list(windows(n, 120, 28))
        kept = [f for _, lo, hi in plan for f in range(lo, hi)]
        assert kept == list(range(n))
        for start, lo, hi in plan:
            assert start >= 0 and (lo == 0 or lo - start == 28) and (hi == n or start + 120 - hi == 28)
        if n >= 120:  # a graph that cannot mask: the last window ends at the clip
            aligned = list(windows(n, 120, 28, end_aligned=True))
            assert [p[1:] for p in aligned] == [p[1:] for p in plan]
            start, lo, hi = aligned[-1]
            assert start + 120 == n and (lo == 0 or lo - start >= 28)


@pytest.mark.parametrize("seconds", [0.01, SNAC_TINY_LEN / SR, 0.2, 0.61])
def test_codes_equal_the_official_encode_of_the_whole_clip(codec, tiny_snac_official, seconds):
    """Shorter than the window, exactly it, and many windows long (0.61 s: 26 windows, each
    keeping 64 of its 120 frames): every code of every time scale is the official whole-clip code."""
    x = noise(int(seconds * SR) + 3, seed=int(seconds * 1000))
    codes = codec.encode(x, SR)
    want = _official_codes(tiny_snac_official, x)
    assert codes.mode == "whole" and len(codes.arrays) == 3
    for got, w in zip(codes.arrays, want, strict=True):
        assert got.shape == (1, 1, w.shape[-1])
        np.testing.assert_array_equal(got[:, 0], w)


def test_stereo_is_each_channel_on_its_own(codec, tiny_snac_official):
    x = noise(3000, channels=2, seed=4)
    codes = codec.encode(x, SR)
    for c in range(2):
        for got, w in zip(codes.arrays, _official_codes(tiny_snac_official, x[c:c + 1]), strict=True):
            np.testing.assert_array_equal(got[c:c + 1, 0], w)


def test_a_file_read_block_by_block_gives_the_same_codes(codec, tmp_path):
    x = noise(SR * 2 + 5, seed=6)  # soundfile hands it over in many blocks
    sf.write(tmp_path / "a.flac", x[0], SR)
    read, _ = sf.read(tmp_path / "a.flac", dtype="float32")
    a, b = codec.encode_file(tmp_path / "a.flac"), codec.encode(read, SR)
    for x1, x2 in zip(a.arrays, b.arrays, strict=True):
        np.testing.assert_array_equal(x1, x2)


@pytest.mark.parametrize("mode", ["whole", "step"])
def test_audio_equals_the_official_decode_with_the_same_noise(codec, tiny_snac_official, mode):
    x = noise(int(0.3 * SR), channels=2, seed=7)
    want = _official_codes(tiny_snac_official, x)
    audio, drawn = _official_audio(tiny_snac_official, want, seed=11)
    got, sr = codec.decode(tuple(w[:, None] for w in want), mode=mode, noise=drawn)
    assert sr == codec.sample_rate and got.shape == audio.shape
    assert float(np.abs(got - audio).max()) <= 1e-5


def test_the_noise_is_seeded_random_or_zero(codec, tiny_snac):
    codes = codec.encode(noise(2000, seed=8), SR).replace(sample_rate=None, num_samples=None)
    a, b = codec.decode(codes, noise=5)[0], codec.decode(codes, noise=5)[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, codec.decode(codes, noise=6)[0])
    assert not np.array_equal(codec.decode(codes)[0], codec.decode(codes)[0])  # fresh, as the official
    silent = codec.decode(codes, noise="zero")[0]
    with torch.no_grad():
        t = [torch.from_numpy(a[:, 0]) for a in codes.arrays]
        n = t[-1].shape[-1]
        want = tiny_snac.decode(t, [torch.zeros(s) for s in tiny_snac.noise_shapes(n)])[:, 0].numpy()
    assert float(np.abs(silent - want).max()) <= 1e-5
    # The seeded noise is a property of the positions: the stream graph's windows see the same.
    np.testing.assert_allclose(codec.decode(codes, noise=5, mode="step")[0], a, atol=1e-5)


def _push_frames(stream, codes: Codes, per_push: int):
    """Coarse frames `per_push` at a time; returns the audio of each push, then of finish()."""
    coarse, out = codes.n_frames[0], []
    for j in range(0, coarse, per_push):
        k = min(per_push, coarse - j)
        out.append(stream.push([a[0, 0, j * 4 // s:(j + k) * 4 // s]
                                for a, s in zip(codes.arrays, (4, 2, 1))]))
    out.append(stream.finish())
    return out


@pytest.mark.parametrize("per_push", [1, 3])
def test_the_stream_decoder_gives_the_whole_decode(codec, per_push):
    codes = codec.encode(noise(int(0.15 * SR), seed=9), SR).replace(sample_rate=None, num_samples=None)
    whole = codec.decode(codes, noise=3)[0][0]
    stream = codec.decode_stream(noise=3)
    pieces = _push_frames(stream, codes, per_push)
    np.testing.assert_allclose(np.concatenate(pieces), whole, atol=1e-5)
    # Audio comes out as soon as the decoder's right context past it has arrived: after pushing
    # j coarse frames, exactly the samples that lie `latency.samples` before their end.
    out, lat = 0, stream.latency
    assert lat.samples == codec.graph("decoder_step").int("delay") > 0 and stream.step_frames == 1
    for i, piece in enumerate(pieces[:-1]):
        out += len(piece)
        pushed = min((i + 1) * per_push, codes.n_frames[0])
        assert out == max(0, pushed * 4 * HOP - lat.samples)
    assert len(pieces[-1]) > 0


def test_the_stream_keeps_only_what_it_needs(codec):
    """Nothing but the layers' state and less than a step of latent frames is kept: memory stays
    flat however long the stream runs."""
    stream, rng = codec.decode_stream(noise=1), np.random.default_rng(0)
    sizes = []
    for _ in range(400):
        stream.push([rng.integers(0, 64, 1), rng.integers(0, 64, 2), rng.integers(0, 64, 4)])
        sizes.append(sum(a.nbytes for a in stream.state.arrays.values()))
    assert stream.received == 1600 and max(sizes) == min(sizes)


def _redistribute(flat: list[int]) -> list[list[int]]:
    """Orpheus TTS's own unpacking of its 7-code groups (orpheus_tts decoder.py
    `redistribute_codes`, its token offsets taken out)."""
    l1, l2, l3 = [], [], []
    for i in range(len(flat) // 7):
        g = flat[7 * i:7 * i + 7]
        l1.append(g[0])
        l2.append(g[1])
        l3.extend([g[2], g[3]])
        l2.append(g[4])
        l3.extend([g[5], g[6]])
    return [l1, l2, l3]


def test_the_orpheus_layout_is_orpheus_order(codec):
    codes = codec.encode(noise(3000, seed=10), SR)
    flat = to_orpheus(codes.arrays)
    assert flat.shape == (1, 7 * codes.n_frames[0])
    for level, want in zip(codes.arrays, _redistribute(flat[0].tolist()), strict=True):
        assert level[0, 0].tolist() == want
    back = Codes(tuple(from_orpheus(flat[0])), codec="snac")
    for a, b in zip(back.arrays, codes.arrays, strict=True):
        np.testing.assert_array_equal(a, b)
    audio = codec.decode(back, noise=2)[0]
    np.testing.assert_array_equal(audio, codec.decode(codes.replace(sample_rate=None, num_samples=None),
                                                      noise=2)[0])


def test_windows_side_by_side_give_the_same_bits(tiny_snac_export):
    """Long audio runs two windows at once on the CPU (each on its share of the cores, a session
    of its own beside the one single calls use); one at a time gives the same codes and audio."""
    x = noise(int(0.3 * SR), channels=2, seed=14)
    one, two = (SnacCodec(tiny_snac_export, options={"parallel": "1"}),
                SnacCodec(tiny_snac_export, options={"parallel": "2"}))
    a, b = one.encode(x, SR), two.encode(x, SR)
    for p, q in zip(a.arrays, b.arrays, strict=True):
        np.testing.assert_array_equal(p, q)
    np.testing.assert_array_equal(one.decode(a, noise=1)[0], two.decode(a, noise=1)[0])
    assert "encoder@parallel" in two._graphs and "decoder@parallel" in two._graphs
    assert two._graphs["encoder@parallel"].session is not two.graph("encoder").session
    assert "encoder@parallel" not in one._graphs


def test_a_clip_of_one_window_is_one_call(tiny_snac_export):
    """Audio exactly as long as the window graph goes through it once, on every core (the
    reader looks past the window's end before calling it the last)."""
    codec = SnacCodec(tiny_snac_export, options={"parallel": "2"})
    g = codec.graph("encoder")
    calls, run = [], g.run
    g.run = lambda feeds: calls.append(1) or run(feeds)
    codec.encode(noise(g.int("samples"), seed=15), SR)
    assert len(calls) == 1
    codec.encode(noise(g.int("samples") + 1, seed=15), SR)
    assert len(calls) == 1  # two windows: through the side-by-side session, not this one
    assert "encoder@parallel" in codec._graphs
