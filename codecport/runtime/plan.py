"""How a clip goes through a codec's graphs, as data: the plans the runtime and its applications
share.

- `WindowPlan`: a clip's encode as independent windows through one encoder graph, and how their
  codes make the clip's `Codes`. `Codec.encode_source` runs a plan one window at a time; the
  corpus tokenizer fills batched graphs with the windows of many clips (tokenize/batch.py).
- `overlap_windows`: windows that overlap by a graph's receptive field, which give the official
  whole-clip result of a non-causal codec (DAC, SNAC) from fixed-length graphs, whatever the
  length. Each window keeps only the frames `margin` or more inside its edges, where every input
  the result depends on lies inside the window; at the clip's own edges it keeps everything,
  since there the window's edge is the clip's. The margin is computed from the config at export
  (models/geometry.py) and stored in each graph's metadata. What it costs: a window of `window`
  frames keeps `window - 2 * margin` of them, so long audio computes `window / (window - 2 *
  margin)` times the frames of one call over the whole clip.
- `crossfaded`: windows that overlap by a fixed span, joined by a linear cross-fade over it: the
  windowed mode of a codec whose every output depends on the whole clip (NeuCodec's attention),
  which has no exact windowed form.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .codes import Codes


@dataclass
class WindowPlan:
    """How one clip is encoded through encoder graph `graph`: its `windows` (each `[samples]`, or
    `[channels, samples]` for a model coding channels together, or the feeds of one call (batch
    1) of a graph with several inputs (`call_input`); float32, in order, read lazily) give codes
    `[k, frames]` each, and `finish` turns the list of them, in order, into the clip's `Codes`."""

    graph: str
    windows: Iterator[np.ndarray | dict[str, np.ndarray]]
    k: int
    finish: Callable[[list[np.ndarray]], Codes]
    # The codes of window `i`'s output row `y` (`codes(y, i)`), where the codec's `latent_codes(y,
    # k)` is not what `finish` takes (SNAC's: each time scale's codes of the frames it keeps).
    codes: Callable[[np.ndarray, int], object] | None = None

    def codes_of(self, codec, y: np.ndarray, i: int):
        """What `finish` takes of window `i`'s output row `y`."""
        return codec.latent_codes(y, self.k) if self.codes is None else self.codes(y, i)


def call_input(window: np.ndarray | dict[str, np.ndarray]) -> np.ndarray | dict[str, np.ndarray]:
    """A window (`[samples]`, or `[channels, samples]` for a model coding several channels at
    once) as one encoder call's input `[1, channels, samples]`; feeds as they are."""
    if isinstance(window, dict):
        return window
    return window.reshape(1, -1, window.shape[-1])


def stack_calls(calls: list, batch: int) -> np.ndarray | dict[str, np.ndarray]:
    """The input of one call of a graph with batch dimension `batch` from the `call_input`s of
    up to `batch` windows, the rows left over filled with copies of the first (rows are
    independent, checked at export, so a copy is a valid input whose result is dropped)."""
    calls = calls + [calls[0]] * (batch - len(calls))
    if isinstance(calls[0], dict):
        return {k: np.concatenate([c[k] for c in calls]) for k in calls[0]}
    return np.concatenate(calls)


def overlap_windows(n: int, window: int, margin: int,
                    end_aligned: bool = False) -> Iterator[tuple[int, int, int]]:
    """(start, keep_from, keep_to) in frames for the windows over a clip of `n` frames: the
    first window starts at the clip, each next one `margin` before the frames still to do.

    A graph that masks what lies past the clip (SNAC's) takes a last window running past the
    end; with `end_aligned` (a graph whose edge must be the clip's, DAC's) the last window is
    moved back to end at the clip, which needs `n >= window`."""
    pos = 0
    while pos < n:
        start = 0 if pos == 0 else pos - margin
        end = start + window
        if end >= n:
            yield (max(0, n - window) if end_aligned else start), pos, n
            return
        yield start, pos, end - margin
        pos = end - margin


def crossfade(tail: np.ndarray | None, p: np.ndarray, overlap: int) -> tuple[np.ndarray, np.ndarray]:
    """(the audio now final, the new tail) when window `p` `[channels, n]` follows a window whose
    last `overlap` samples, not yet returned, are `tail` (None for the first window): over the
    overlap the earlier window fades out linearly as `p` fades in (the two are decodes of the
    same frames, so they agree closely, and equal gains sum to one)."""
    if tail is not None:
        if p.shape[1] < overlap:
            raise ValueError(f"a window of {p.shape[1]} samples is shorter than the overlap {overlap}")
        fade = ((np.arange(overlap) + 0.5) / overlap).astype(np.float32)
        p = np.concatenate([tail * (1 - fade) + p[:, :overlap] * fade, p[:, overlap:]], axis=1)
    return p[:, :p.shape[1] - overlap], p[:, p.shape[1] - overlap:]


def crossfaded(pieces: Iterator[np.ndarray], overlap: int) -> Iterator[np.ndarray]:
    """Audio windows `[channels, n]` that each begin `overlap` samples before the previous one
    ends, as one signal (`crossfade`). Yields the finished audio as it goes; holds one overlap."""
    tail = None
    for p in pieces:
        out, tail = crossfade(tail, p, overlap)
        yield out
    if tail is not None:
        yield tail
