"""Validation of exported graphs against torch: typed errors with the numbers, never warnings."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from ..errors import ValidationError

AUDIO_ATOL = 1e-4  # max abs error allowed on decoded audio in [-1, 1]


def session(model: onnx.ModelProto | bytes) -> ort.InferenceSession:
    """A CPU EP session of a model held in memory (or its serialized bytes, which a caller that
    also checks the model makes once: a released size takes a second or two each time)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    data = model if isinstance(model, bytes) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def run(model: onnx.ModelProto | bytes, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a model held in memory on the CPU EP."""
    return session(model).run(None, inputs)


def check_shape(name: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.shape != want.shape:
        raise ValidationError(f"{name}: ONNX output shape {list(got.shape)} != torch "
                              f"{list(want.shape)}")


def check_close(name: str, got: np.ndarray, want: np.ndarray, atol: float) -> float:
    """Max abs error, raising `ValidationError` past `atol`."""
    check_shape(name, got, want)
    err = float(np.max(np.abs(got.astype(np.float64) - want))) if got.size else 0.0
    if not err <= atol:  # also catches NaN
        raise ValidationError(f"{name}: max abs error {err:.3g} vs torch exceeds {atol:g}")
    return err


def check_codes(name: str, got: np.ndarray, want: np.ndarray) -> None:
    check_shape(name, got, want)
    bad = np.argwhere(got != want)
    if len(bad):
        k, t = bad[0][-2:]
        raise ValidationError(f"{name}: {len(bad)} of {got.size} codes differ from torch "
                              f"(first at codebook {k}, frame {t}: {got[tuple(bad[0])]} vs "
                              f"{want[tuple(bad[0])]})")
