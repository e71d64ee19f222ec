"""The one stream protocol (runtime/stream.py), for every registered codec and every stream it
has: any split of the input gives the output of the whole; output never runs later than the
stated latency; `reset()` starts over; the state taken out mid-stream and put into a fresh
stream continues it exactly; a codec without a stream says so in one line."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import codecport
from codecport import registry
from codecport.errors import CodecportError
from codecport.runtime.codes import Codes
from codecport.runtime.stream import DecoderStream, EncoderStream, StreamState

SIDES = [(c.name, side) for c in registry.codecs() for side in c.runtime.streams]
SOME = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def codecs(smoke_exports) -> dict:
    return {name: codecport.load(folder) for name, folder in smoke_exports.items()}


def _open(codec, side: str, seed: int = 0):
    if side == "encoder":
        return codec.encoder_stream()
    return codec.decoder_stream(**({"noise": seed} if codec.draws_noise else {}))


def _input(codec, side: str, frames: int) -> tuple[np.ndarray | Codes, int]:
    """(input of `frames` coarse frames, samples per coarse frame): PCM for an encoder, the
    codes of such PCM for a decoder."""
    per = codec.strides[0] * codec.frame_size
    rng = np.random.default_rng(frames)
    pcm = (0.3 * rng.standard_normal(frames * per)).astype(np.float32)
    if side == "encoder":
        return pcm, per
    codes = codec.encode(pcm[None], codec.sample_rate)
    return codes.replace(sample_rate=None, num_samples=None, loudness_db=None, mode=None), per


def _pieces(x, cuts: list[int]):
    """`x` cut at `cuts` (sample or coarse-frame positions, any order, repeats: empty pieces)."""
    n = len(x) if isinstance(x, np.ndarray) else x.n_frames[0]
    bounds = [0, *sorted(c % (n + 1) for c in cuts), n]
    for a, b in itertools.pairwise(bounds):
        if isinstance(x, np.ndarray):
            yield x[a:b]
        elif b > a:
            yield x.frames(a, b)


def _join(parts: list[np.ndarray], side: str) -> np.ndarray:
    return np.concatenate(parts, axis=1 if side == "encoder" else 0)


def _run(stream, pieces, side: str) -> np.ndarray:
    return _join([*(stream.push(p) for p in pieces), stream.flush()], side)


# The stream sides of each codec, from its design: DAC is not causal (whole clips only); Mimi
# steps both ways; SNAC steps its decoder; NeuCodec and XCodec2 decode in windows.
STREAMS = {"dac": (), "mimi": ("encoder", "decoder"), "snac": ("decoder",), "neucodec": ("decoder",),
           "xcodec2": ("decoder",), "qwen3tts": ("decoder",)}


def test_every_codec_states_its_streams(codecs):
    assert set(STREAMS) == set(registry.names())  # a new codec states its streams here
    for name, codec in codecs.items():
        spec = registry.get(name)
        assert codec.streams == STREAMS[name], name
        for side, make in (("encoder", codec.encoder_stream), ("decoder", codec.decoder_stream)):
            if side in codec.streams:
                s = make()
                assert isinstance(s, EncoderStream if side == "encoder" else DecoderStream)
                assert s.latency.frames >= 0 and s.latency.samples >= 0 and s.step_frames >= 1
            else:
                with pytest.raises(CodecportError, match=f"{spec.label} has no {side} stream"):
                    make()


@pytest.mark.parametrize("name,side", SIDES)
@SOME
@given(cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_any_split_gives_the_output_of_the_whole(codecs, name, side, cuts):
    codec = codecs[name]
    x, _ = _input(codec, side, 12)
    whole = _run(_open(codec, side), [x], side)
    np.testing.assert_array_equal(_run(_open(codec, side), list(_pieces(x, cuts)), side), whole)


@pytest.mark.parametrize("name,side", SIDES)
def test_output_never_runs_later_than_the_stated_latency(codecs, name, side):
    codec = codecs[name]
    x, per = _input(codec, side, 16)
    stream = _open(codec, side)
    out = 0
    step = per if side == "encoder" else 1
    for pushed, piece in enumerate(_pieces(x, [k * step for k in range(1, 16)]), 1):  # a coarse frame a push
        got = stream.push(piece)
        out += got.shape[1] if side == "encoder" else len(got) / per
        assert pushed - stream.latency.frames - 1e-9 <= out <= pushed, (pushed, out, stream.latency)


@pytest.mark.parametrize("name,side", SIDES)
def test_state_moves_between_streams_and_reset_starts_over(codecs, name, side):
    codec = codecs[name]
    x, _ = _input(codec, side, 12)
    pieces = list(_pieces(x, [5, 9, 13, 3]))
    whole = _run(_open(codec, side), pieces, side)
    first = _open(codec, side)
    head = [first.push(p) for p in pieces[:2]]
    state = first.state
    assert isinstance(state, StreamState) and all(not a.flags.writeable for a in state.arrays.values())
    first.push(pieces[2])  # the first stream goes on; the state taken out does not move with it
    moved = _open(codec, side)
    moved.state = state
    np.testing.assert_array_equal(_join([*head, *(moved.push(p) for p in pieces[2:]), moved.flush()], side),
                                  whole)
    first.reset()
    np.testing.assert_array_equal(_run(first, pieces, side), whole)
    others = [o for o in SIDES if o != (name, side)]
    for other_name, other_side in others[:1]:
        with pytest.raises(CodecportError, match="belongs to another stream"):
            _open(codecs[other_name], other_side).state = state


@pytest.mark.parametrize("name,side", SIDES)
def test_a_state_whose_buffered_input_push_would_refuse_is_refused(codecs, name, side):
    """A state's buffered input (codes, or audio for an encoder) is checked as `push` checks it:
    codes past the codebook, or audio that is not, never reach a graph."""
    codec = codecs[name]
    x, _ = _input(codec, side, 3)
    stream = _open(codec, side)
    stream.push(next(_pieces(x, [1])))  # a coarse frame: less than a step or window, so some waits
    state = stream.state
    buffered = [k for k, a in state.arrays.items() if not k.endswith("_in")  # a graph's own state
                and (a.dtype.kind in "iu" if side == "decoder" else k == "pcm")]
    assert buffered, sorted(state.arrays)
    for k in buffered:
        a = state.arrays[k]
        bad = (np.full((*a.shape[:-1], 1), codec.codebook_size, a.dtype) if side == "decoder"
               else np.full(a.shape[:-1] + (1,), np.nan, a.dtype))
        with pytest.raises(CodecportError, match="codes must be in|NaN"):
            _open(codec, side).state = StreamState(state.kind, {**state.arrays, k: bad}, state.values)


@pytest.mark.parametrize("name", [n for n, side in SIDES if side == "encoder"])
@pytest.mark.parametrize("pcm, match", [
    (np.zeros((2, 480), np.float32), "takes one channel"),  # stereo would be interleaved
    (np.zeros(480, np.int16), "not floats"),  # PCM not scaled to [-1, 1]
    (np.full(480, np.nan, np.float32), "NaN"),
    ("abc", "not floats"),
])
def test_an_encoder_stream_refuses_what_it_cannot_take(codecs, name, pcm, match):
    from codecport.errors import AudioError

    stream = codecs[name].encoder_stream()
    with pytest.raises(AudioError, match=match):
        stream.push(pcm)
    assert stream.push(np.zeros((1, 0), np.float32)).shape[1] == 0  # and goes on


def test_a_bare_duplex_has_no_attributes_rather_than_a_key_error():
    """copy and pickle look up hooks on an object before its __init__ ran: a plain
    AttributeError tells them there are none."""
    import copy

    from codecport.runtime.stream import Duplex

    bare = Duplex.__new__(Duplex)
    assert not hasattr(bare, "step_frames")
    assert copy.copy(bare) is not bare
