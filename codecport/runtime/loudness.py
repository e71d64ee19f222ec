"""Integrated loudness (ITU-R BS.1770) measured block by block, so a long signal never has to
be held whole: the same number as pyloudnorm's `Meter.integrated_loudness` on the whole array.

pyloudnorm supplies the K-weighting filters; they run here with their state carried from one
block to the next (`scipy.signal.lfilter` with `zi`, the same recursion as one call over the
whole signal). The 400 ms gating blocks overlap by 75 %, so each block's energy is the
difference of a running sum of squares taken at its two ends.
"""

from __future__ import annotations

import math

import numpy as np

MIN_LOUDNESS = -70.0  # dB LUFS; the BS.1770 absolute gate, so silence gets a finite level
_GAINS = (1.0, 1.0, 1.0, 1.41, 1.41)  # BS.1770 channel weights (L, R, C, Ls, Rs)


class LoudnessMeter:
    """Feed `[channels, n]` blocks with `push`, then read `result()` in dB LUFS (floored at -70).

    Clips shorter than one gating block are measured zero-padded to one block; more than five
    channels are measured as their downmix (BS.1770 weights five at most).
    """

    def __init__(self, sample_rate: int, channels: int):
        import pyloudnorm  # imports scipy.signal (0.8 s): only when something is measured

        meter = pyloudnorm.Meter(sample_rate)
        self.rate, self.block, self.step = sample_rate, meter.block_size, 1.0 - meter.overlap
        self.channels = 1 if channels > 5 else channels
        self.downmix = channels > 5
        self.stages = [(f.passband_gain, f.b, f.a) for f in meter._filters.values()]
        self.zi = [np.zeros((self.channels, max(len(a), len(b)) - 1)) for _, b, a in self.stages]
        self.n = 0  # samples pushed
        self.total = np.zeros(self.channels)  # running sum of squares of the filtered signal
        self.at: dict[int, np.ndarray] = {}  # sample index -> running sum there (block ends)
        self.next_j = 0  # blocks whose ends are still to come start here

    def _bounds(self, j: int) -> tuple[int, int]:
        """pyloudnorm's sample range of gating block j (the same float expressions)."""
        return (int(self.block * (j * self.step) * self.rate),
                int(self.block * (j * self.step + 1) * self.rate))

    def push(self, audio: np.ndarray) -> None:
        from scipy.signal import lfilter

        x = audio.astype(np.float64)
        if self.downmix:
            x = x.mean(axis=0, keepdims=True)
        for i, (gain, b, a) in enumerate(self.stages):
            x, self.zi[i] = lfilter(b, a, x, axis=-1, zi=self.zi[i])
            x = gain * x
        sums = np.cumsum(x ** 2, axis=-1) + self.total[:, None]
        end = self.n + x.shape[1]
        # Record the running sum at every block edge inside this block of samples. Blocks
        # overlap, so several may start here while the earliest has yet to end.
        j = self.next_j
        while (edges := self._bounds(j))[0] <= end:
            for edge in edges:
                if self.n < edge <= end:  # a copy: a view would keep this block's sums alive
                    self.at[edge] = sums[:, edge - self.n - 1].copy()
            if j == self.next_j and edges[1] <= end:
                self.next_j += 1
            j += 1
        if x.shape[1]:
            self.total = sums[:, -1]
        self.n = end

    def result(self) -> float:
        """Integrated loudness of everything pushed, in dB LUFS."""
        short = math.ceil(self.block * self.rate) + 1 - self.n
        if short > 0:  # as the whole-array measure pads a short clip before filtering
            self.push(np.zeros((self.channels, short)))
        self.at[0] = np.zeros(self.channels)
        length = self.n / self.rate
        blocks = int(np.round((length - self.block) / (self.block * self.step))) + 1
        z = np.empty((self.channels, blocks))
        for j in range(blocks):
            lo, hi = self._bounds(j)
            z[:, j] = ((self.at.get(min(hi, self.n), self.total) - self.at[min(lo, self.n)])
                       / (self.block * self.rate))
        g = np.array(_GAINS[:self.channels])[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            level = -0.691 + 10 * np.log10((g * z).sum(axis=0))
            gated = level >= -70.0
            if not gated.any():
                return MIN_LOUDNESS
            relative = -0.691 + 10 * np.log10((g[:, 0] * z[:, gated].mean(axis=1)).sum()) - 10.0
            keep = (level > relative) & (level > -70.0)
            if not keep.any():
                return MIN_LOUDNESS
            lufs = -0.691 + 10 * np.log10((g[:, 0] * z[:, keep].mean(axis=1)).sum())
        return max(float(lufs), MIN_LOUDNESS)


def loudness(audio: np.ndarray, sample_rate: int) -> float:
    """Integrated loudness of `[channels, samples]` in dB LUFS, floored at -70."""
    meter = LoudnessMeter(sample_rate, audio.shape[0])
    meter.push(audio)
    return meter.result()
