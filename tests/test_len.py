"""`codec-export CODEC --len N` holds a clip of N samples, at the rate `--len` is stated in (the
rate the codec decodes to), in the codec's fixed mode (`BenchFacts.fixed_mode`): for every
registered codec, the clip goes through one call of the fixed encoder, its codes have the frames
the runtime gives such a clip, and they decode through one call of the fixed decoder to the clip's
length. On the smoke exports (each registration's `--len`), which the suite shares."""

from __future__ import annotations

import pytest
from support import noise

import codecport
from codecport import registry
from codecport.bench.facts import facts_of
from codecport.errors import CodesError
from codecport.runtime.audio import resampled_length
from codecport.runtime.graph import Graph

NAMES = [spec.name for spec in registry.codecs()]


def _len(spec) -> int:
    """The `--len` of the codec's smoke export."""
    return int(spec.smoke[spec.smoke.index("--len") + 1])


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """The graphs run from now on, by name, in order."""
    seen: list[str] = []
    run = Graph.run
    monkeypatch.setattr(Graph, "run", lambda g, feeds: seen.append(g.path.stem) or run(g, feeds))
    return seen


@pytest.mark.parametrize("name", NAMES)
def test_len_holds_a_clip_of_that_many_samples_in_the_fixed_mode(name, smoke_exports, calls):
    spec = registry.get(name)
    mode, n = facts_of(spec).fixed_mode, _len(spec)
    codec = codecport.load(smoke_exports[name])
    rate = codec.sample_rate
    codes = codec.encode(noise(n, seed=n), rate, mode=mode)
    frames = codec.expected_frames(resampled_length(n, rate, codec.input_rate), mode)
    assert codes.mode == mode and codes.n_frames[0] == frames, (codes.mode, codes.n_frames, frames)
    assert [spec.runtime.graphs.get(g) for g in calls] == [("encoder", mode)], calls
    calls.clear()
    audio, sr = codec.decode(codes, mode=mode)
    assert [spec.runtime.graphs.get(g) for g in calls] == [("decoder", mode)], calls
    assert sr == rate and audio.shape == (1, n)


@pytest.mark.parametrize("name", NAMES)
def test_a_sample_past_len_is_held_or_refused_in_one_line(name, smoke_exports):
    """A clip a sample longer than `--len` (the same whole frames, for a length off the frame) in
    the fixed mode: through the graphs to its own length, or a `CodesError` that says what to do;
    never the graphs fed more than their input."""
    spec = registry.get(name)
    mode, n = facts_of(spec).fixed_mode, _len(spec) + 1
    codec = codecport.load(smoke_exports[name])
    try:
        codes = codec.encode(noise(n, seed=n), codec.sample_rate, mode=mode)
    except CodesError as e:
        assert "--len" in str(e) or "mode" in str(e), e
        return
    assert codes.mode == mode and codec.decode(codes, mode=mode)[0].shape == (1, n)
