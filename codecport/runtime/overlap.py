"""Windows that overlap by a graph's receptive field: the official whole-clip result of a
non-causal codec (DAC, SNAC) from fixed-length graphs, whatever the length.

Each window keeps only the frames `margin` or more inside its edges, where every input the
result depends on lies inside the window; at the clip's own edges it keeps everything, since
there the window's edge is the clip's. The margin is computed from the config at export
(models/geometry.py) and stored in each graph's metadata. What it costs: a window of `window`
frames keeps `window - 2 * margin` of them, so long audio computes `window / (window - 2 *
margin)` times the frames of one call over the whole clip.
"""

from __future__ import annotations

from collections.abc import Iterator


def windows(n: int, window: int, margin: int, end_aligned: bool = False) -> Iterator[tuple[int, int, int]]:
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


def overlap_cost(window: int, margin: int) -> float:
    """Frames computed per frame kept, on long audio."""
    return window / (window - 2 * margin)
