"""w2v-BERT 2.0's input features in numpy: transformers' `SeamlessM4TFeatureExtractor`, torch-free.

NeuCodec and XCodec2 feed their semantic encoder (the first 16 layers of w2v-BERT 2.0) with
Kaldi-style log-mel filter banks of 16 kHz audio: 25 ms frames every 10 ms, the signal scaled to
16-bit range, DC offset removed, pre-emphasis 0.97, a Povey window, a 512-point FFT, 80 mel bins
(Kaldi's mel scale, triangles in mel space, 20 Hz to 8 kHz), the log of their power floored at
float32's epsilon; then each bin normalized over the clip (sample variance), the frames padded
with zeros to an even count and stacked in pairs: `[frames // 2, 160]`. The arithmetic follows
transformers' numpy code step by step, its float32 and complex64 roundings included.
"""

from __future__ import annotations

import numpy as np

from ...errors import CodesError

RATE = 16000
FRAME, HOP, FFT, MELS, STRIDE = 400, 160, 512, 80, 2
FEATURES = MELS * STRIDE  # the width of a feature row
MEL_FLOOR = 1.192092955078125e-07


def _mel(f):
    return 1127.0 * np.log(1.0 + np.asarray(f, np.float64) / 700.0)  # Kaldi's mel scale


def mel_filters() -> np.ndarray:
    """`[FFT/2 + 1, MELS]` triangles in mel space between 20 Hz and 8 kHz (no normalisation)."""
    centres = np.linspace(_mel(20), _mel(RATE // 2), MELS + 2)
    bins = _mel(RATE / FFT * np.arange(FFT // 2 + 1))
    slopes = centres[None, :] - bins[:, None]
    diff = np.diff(centres)
    down, up = -slopes[:, :-2] / diff[:-1], slopes[:, 2:] / diff[1:]
    return np.maximum(0.0, np.minimum(down, up)).astype(np.float32)


class Fbank:
    """`features(audio)`: 16 kHz mono float audio `[n]` -> `[frames // 2, 160]` float32."""

    def __init__(self):
        self.window = np.power(np.hanning(FRAME), 0.85)  # Povey's, float64 as transformers'
        self.filters = mel_filters()

    @staticmethod
    def frames(n: int) -> int:
        """Feature rows (stacked pairs) for `n` samples."""
        return -(-(1 + (n - FRAME) // HOP) // STRIDE) if n >= FRAME + HOP else 0

    def windowed(self, frames: np.ndarray) -> np.ndarray:
        """Frames `[n, FRAME]` (float64, 16-bit range) as the FFT takes them: DC offset removed,
        pre-emphasis, the Povey window. Linear in the frame (codecs/neucodec/ingraph.py folds it, with the
        FFT, into one matrix)."""
        buf = frames - frames.mean(axis=1, keepdims=True)
        buf[:, 1:] = buf[:, 1:] - 0.97 * buf[:, :-1]
        buf[:, 0] *= 1 - 0.97
        return buf * self.window

    def log_mel(self, audio: np.ndarray) -> np.ndarray:
        """`[frames, MELS]` float32, before normalisation."""
        x = np.asarray(audio, np.float32).reshape(-1) * np.float32(1 << 15)  # Kaldi's 16-bit range
        if x.size < FRAME + HOP:  # one frame has no variance to normalise by (NaN officially)
            raise CodesError(f"{x.size} samples are fewer than two 25 ms frames ({FRAME + HOP} at 16 kHz)")
        n = 1 + (x.size - FRAME) // HOP
        buf = np.lib.stride_tricks.sliding_window_view(x, FRAME)[::HOP][:n].astype(np.float64)
        spec = np.fft.rfft(self.windowed(buf), FFT).astype(np.complex64)
        power = np.abs(spec, dtype=np.float64) ** 2
        mel = np.maximum(MEL_FLOOR, np.dot(self.filters.T, power.T))
        return np.log(mel).T.astype(np.float32)

    def features(self, audio: np.ndarray) -> np.ndarray:
        x = self.log_mel(audio)
        x = (x - x.mean(0)[None]) / np.sqrt(x.var(0, ddof=1)[None] + 1e-7)
        if len(x) % STRIDE:
            x = np.concatenate([x, np.zeros((STRIDE - len(x) % STRIDE, MELS), x.dtype)])
        return x.reshape(len(x) // STRIDE, MELS * STRIDE)


def raw_values(audio: np.ndarray, pad: int, normalize: bool) -> np.ndarray:
    """The distilled NeuCodec's semantic input: transformers' `Wav2Vec2FeatureExtractor` on 16 kHz
    audio `[n]` with `pad` zeros each side (as the official encode pads it), `[1, n + 2 pad]`
    float32; with `normalize` (its `do_normalize`), zero mean and unit variance over all of it,
    in float32 as transformers computes them."""
    x = np.pad(np.asarray(audio, np.float32).reshape(1, -1), ((0, 0), (pad, pad)))
    return (x - x.mean()) / np.sqrt(x.var() + 1e-7) if normalize else x
