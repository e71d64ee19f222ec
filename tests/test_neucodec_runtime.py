"""NeuCodec on ONNX Runtime (codecs/neucodec/runtime.py) against its torch reference on the same weights
(the smoke export's seeded tiny model): a clip that fits the graphs gives the reference's codes
and audio on the clip alone, whatever its length below the window; a longer one goes through
cross-faded windows, each window as a clip alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import noise

import codecport
from codecport.codecs.neucodec.facts import torch_codes
from codecport.codecs.neucodec.model import PRESETS, NeuCodec, init_random
from codecport.errors import CodesError
from codecport.runtime.plan import crossfaded


@pytest.fixture(scope="module")
def codec(smoke_exports):
    return codecport.load(smoke_exports["neucodec"])


@pytest.fixture(scope="module")
def reference():
    return init_random(NeuCodec(PRESETS["tiny"]), seed=0).eval()  # what `--random-init` exports


def _decode(model, codes: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.decode(torch.from_numpy(codes)).numpy()[:, 0]


@pytest.mark.parametrize("samples", [320, 3333, 8000 - 1])  # one frame, a few, the window's 25 (16 kHz)
def test_a_clip_that_fits_is_the_reference_on_the_clip_alone(codec, reference, samples):
    x = noise(samples, channels=2, seed=samples)
    codes = codec.encode(x, 16000)
    want = np.concatenate([torch_codes(reference, torch.from_numpy(row)[None, None], 1)[0] for row in x])
    assert codes.mode == "fixed" and codes.data.shape == (2, 1, samples // 320)
    np.testing.assert_array_equal(codes.data, want)
    audio, sr = codec.decode(codes.data)  # bare codes: the model's rate, every frame
    assert sr == codec.sample_rate == 8000
    ref = _decode(reference, codes.data)
    assert audio.shape == ref.shape == (2, samples // 320 * 160) and np.abs(ref).max() > 1e-3
    np.testing.assert_allclose(audio, ref, atol=1e-5)


def test_a_longer_clip_goes_through_windows_each_a_clip_alone(codec, reference):
    window, overlap, hop = codec.frames, codec.overlap, 320
    step = window - overlap
    x = noise(3 * window * hop + 77, seed=9)[0]
    with pytest.raises(CodesError, match=r"75 frames \(1.50 s\) are more than .* re-export with "
                                         r"--len 12000 or more, or pass the windowed mode"):
        codec.encode(x, 16000, mode="fixed")
    codes = codec.encode(x, 16000)
    assert codes.mode == "windowed" and codes.data.shape == (1, 1, x.size // hop)
    # Window k encodes its audio alone and keeps its frames from the middle of each overlap.
    for k, start in enumerate(range(0, x.size // hop - overlap, step)):
        alone = torch_codes(reference,
                            torch.from_numpy(x[start * hop:(start + window) * hop])[None, None], 1)[0]
        lo = 0 if k == 0 else overlap // 2
        hi = min(step + overlap // 2, x.size // hop - start)
        np.testing.assert_array_equal(codes.data[..., start + lo:start + hi], alone[..., lo:hi])
    # Decoding: the windows' audio alone, cross-faded over the overlaps.
    audio, _ = codec.decode(codes.data)
    n = codes.data.shape[-1]
    pieces = [_decode(reference, codes.data[..., s:s + window]) for s in range(0, n - overlap, step)]
    want = np.concatenate(list(crossfaded(iter(pieces), overlap * 160)), axis=1)
    assert audio.shape == want.shape == (1, n * 160)
    np.testing.assert_allclose(audio, want, atol=1e-5)
    with pytest.raises(CodesError, match="more than this export's graphs hold"):
        codec.decode(codes.data, mode="fixed")


@pytest.mark.parametrize("frames", [3, 25, 26, 44, 62])  # within a window, one, past it, several
def test_the_stream_gives_decode_a_code_at_a_time(codec, frames):
    """Codes pushed one at a time (as an LLM emits them) through the windows: the audio `decode`
    gives for the whole sequence, each frame's audio no later than the stated latency."""
    codes = np.random.default_rng(frames).integers(0, 64, (1, 1, frames))
    want = codec.decode(codes)[0][0]
    stream, out, hop = codec.decoder_stream(), [], codec.frame_size
    assert stream.latency.frames == codec.frames - 1
    for i in range(frames):
        out.append(stream.push(codes[0, :, i:i + 1]))
        done = sum(len(a) for a in out) // hop
        assert i + 1 - stream.latency.frames <= done <= i + 1
    got = np.concatenate([*out, stream.flush()])
    np.testing.assert_array_equal(got, want)


def test_crossfade_keeps_a_signal_both_windows_agree_on():
    x = np.random.default_rng(0).standard_normal((2, 1000)).astype(np.float32)
    pieces = [x[:, s:s + 300] for s in (0, 250, 500, 750)]  # overlapping by 50
    got = np.concatenate(list(crossfaded(iter(pieces), 50)), axis=1)
    np.testing.assert_allclose(got, x, atol=1e-6)
    with pytest.raises(ValueError, match="shorter than the overlap"):
        list(crossfaded(iter([x[:, :100], x[:, :20]]), 50))


def test_under_a_frame_is_refused(codec):
    with pytest.raises(codecport.CodecportError, match="under one NeuCodec frame"):
        codec.encode(np.zeros(319, np.float32), 16000)


def test_batched_in_graph_encoders_give_the_numpy_folders_codes(tmp_path_factory, codec):
    """`--in-graph-quantizer --batch 2` (features and FSQ in the graphs, a mask a row): clips of
    different lengths through the tokenizer's batches give, for a clip that fits, the codes the
    numpy folder encodes, and for a longer one (windows) the folder's own clip-by-clip encode."""
    from shared_exports import cli_export, shared

    from codecport.runtime.audio import ArraySource
    from codecport.tokenize.batch import Batcher

    folder = shared(tmp_path_factory, "neucodec-graph-b2", lambda f: cli_export(
        f, "neucodec", "--preset", "tiny", "--len", "2000", "--in-graph-quantizer", "--batch", "2"))
    batched = codecport.load(folder)
    assert batched.rvq is None and batched.batches == {"encoder": [2]} and batched.frames == 13
    clips = [noise(n, channels=c, seed=n) for n, c in ((3333, 2), (6000, 1), (640, 1))]
    batcher, done = Batcher(batched, 2), []
    for i, x in enumerate(clips):
        done += batcher.add(i, batched.window_plan(ArraySource(x, 16000), None))
    got = dict(done + batcher.flush())
    for i, x in enumerate(clips):
        want = (batched if x.shape[1] > 12 * 320 else codec).encode(x, 16000)
        assert got[i].mode == want.mode and np.array_equal(got[i].data, want.data), i
    assert got[1].mode == "windowed"
