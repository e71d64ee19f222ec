"""IO binding for the Mimi step graphs: the same bits as numpy state, and the option that turns it off."""

from __future__ import annotations

import numpy as np
import pytest
from shared_exports import MIMI_TINY_STEP
from support import noise

from codecport.codecs.mimi.runtime import MimiCodec
from codecport.errors import ProviderError
from codecport.runtime.providers import provider_options
from codecport.runtime.step import StepRunner

FRAME = 24  # samples per code frame of the tiny config
STEP = MIMI_TINY_STEP * FRAME
N_STEPS = 150  # 300 frames: past the 250-position attention window of the tiny config


@pytest.fixture(scope="module")
def codec(tiny_mimi_export):
    return MimiCodec(tiny_mimi_export)


def _stream(stream, audio: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Encode then decode `audio` step by step, interleaved as a live stream does; every
    step's codes and audio as returned (kept, so a later step overwriting one would show)."""
    codes, pcm = [], []

    def encoded():  # lazily: each step's codes are decoded before the next step is encoded
        yield from (stream.encode_step(audio[i:i + STEP]) for i in range(0, len(audio), STEP))
        yield stream.flush_encoder()

    for c in encoded():
        codes.append(c)
        if c.shape[1]:  # decode_step refuses zero frames
            pcm.append(stream.decode_step(c[None]))
    pcm.append(stream.flush_decoder())
    return codes, pcm


def _assert_same(a, b):
    assert len(a[0]) == len(b[0]) and len(a[1]) == len(b[1])
    for x, y in zip(a[0] + a[1], b[0] + b[1], strict=True):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


def test_default_is_on_and_option_turns_it_off(tiny_mimi_export, codec):
    assert codec.io_binding and codec.stream().io_binding
    assert all(s.runner.io_binding for s in (codec.stream().encoder, codec.stream().decoder))
    off = MimiCodec(tiny_mimi_export, options={"io_binding": "0"})
    assert not off.io_binding and not off.stream().io_binding
    assert off.stream(io_binding=True).io_binding  # the stream's own argument wins
    with pytest.raises(ProviderError, match="io_binding must be 0 or 1"):
        MimiCodec(tiny_mimi_export, options={"io_binding": "maybe"})


def test_option_never_reaches_ort():
    cuda = provider_options("CUDAExecutionProvider", {"io_binding": "0", "device_id": "1"})
    assert cuda == {"cudnn_conv_algo_search": "EXHAUSTIVE", "device_id": "1"}
    assert provider_options("CPUExecutionProvider", {"io_binding": "1"}) == {}


def test_device_of_cpu_session(codec):
    assert codec.graph("encoder_step").device == ("cpu", 0)


def test_bound_stream_equals_numpy_stream_bit_for_bit(codec):
    audio = noise(N_STEPS * STEP - 7, seed=3)[0]  # a partial last step: the flush goes through too
    bound, plain = codec.stream(io_binding=True), codec.stream(io_binding=False)
    got, want = _stream(bound, audio), _stream(plain, audio)
    assert sum(c.shape[1] for c in got[0]) == N_STEPS * MIMI_TINY_STEP
    _assert_same(got, want)


def test_codec_paths_agree(tiny_mimi_export, codec):
    """encode/decode through the codec: binding on (default) and off give the same bits."""
    off = MimiCodec(tiny_mimi_export, options={"io_binding": "0"})
    audio = noise(N_STEPS * STEP + 5, channels=2, seed=4)
    codes = codec.encode(audio, 24000, mode="step").data
    np.testing.assert_array_equal(codes, off.encode(audio, 24000, mode="step").data)
    np.testing.assert_array_equal(codec.decode(codes, mode="step")[0], off.decode(codes, mode="step")[0])


def test_reset_restarts_the_bound_state(codec):
    audio = noise(40 * STEP, seed=5)[0]
    stream = codec.stream()
    first = _stream(stream, audio)
    stream.encode_step(noise(3 * STEP + 5, seed=6)[0])  # leave state and buffers mid-stream
    stream.decode_step(np.ones((1, 4, 3), np.int64))
    stream.reset()
    _assert_same(_stream(stream, audio), first)
    _assert_same(_stream(codec.stream(), audio), first)


def test_step_runner_returns_arrays_the_caller_owns(codec):
    """Each step's output is a fresh host array: later steps never write into it."""
    g = codec.graph("encoder_step")
    bound, plain = StepRunner(g, io_binding=True), StepRunner(g, io_binding=False)
    x = noise(4 * STEP, seed=7)[0].reshape(4, 1, 1, STEP)
    got = [bound(xi) for xi in x]
    want = [plain(xi) for xi in x]
    for a, b in zip(got, want, strict=True):
        assert isinstance(a, np.ndarray) and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert len({id(a) for a in got}) == len(got)
