"""Bounds every codec config is checked against before a model is built from it."""

from __future__ import annotations

from ..errors import ConfigError

MAX_PARAMS = 2_000_000_000  # 8 GB of fp32 weights: every released codec is under 0.2 G


def check_int(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"config {name}={value!r} is outside [{lo}, {hi}]; is this config right?")


def check_ints(name: str, values, lo: int, hi: int, most: int) -> None:
    if not isinstance(values, tuple) or not 1 <= len(values) <= most:
        raise ConfigError(f"config {name}={values!r} must list 1 to {most} values")
    for v in values:
        check_int(name, v, lo, hi)


def check_float(name: str, value, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ConfigError(f"config {name}={value!r} is outside [{lo}, {hi}]; is this config right?")
