"""What the bench, the demo and the GPU check need of one codec, as one typed value: each
codec's `codecs/<codec>/facts.py` declares a `FACTS = BenchFacts(...)` stating only what differs from the
defaults. Facts the runtime knows (frames of a length, its streams, its modes) are asked of the
runtime, not restated here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType


@dataclass(frozen=True)
class Official:
    """The codec's official package as a `--contender official`."""

    label: str  # its name in the report
    module: str | None  # the module that says it is installed (None: it runs elsewhere, see `script`)
    install: str  # what to do when it is not there
    script: Path | None = None  # run by path with `--official-python`, in an environment of its own


@dataclass(frozen=True)
class LongAudio:
    """How `codec-bench --long N` times audio of N windows."""

    mode: str  # the runtime's mode for it ("chunked", "whole", "step")
    graphs: tuple[str, str]  # the encoder and decoder graphs each window goes through
    label: str  # how the report says it
    torch: str  # how the torch reference runs the same audio
    # (manifest, windows) -> samples (at the encoder's rate) that take them
    samples: Callable[[dict, int], int]


def _seconds_of_frames(cfg, seconds: float) -> int:
    return round(seconds * cfg.sample_rate / cfg.frame_size) * cfg.frame_size


def _one_scale_decode(model, arrays):
    import torch

    return model.decode(torch.from_numpy(arrays[0]))[:, 0].numpy()


def _no_skip(contender: str, preset: str) -> str | None:
    return None


@dataclass(frozen=True)
class BenchFacts:
    demo_preset: str  # the preset the demo exports (small, for a quick offline run)
    demo_seconds: float  # audio per call of the demo's fixed graphs
    torch_encode: Callable  # (model, x [B, 1, T], k) -> what the torch reference's encode returns
    # (model, x, k) -> its codes as `Codes` arrays (None: torch_encode's, one scale)
    torch_codes: Callable | None = None
    # (model, arrays) -> audio [B, samples], noise as `compare_noise` asks
    torch_decode: Callable = _one_scale_decode
    transformers_model: Callable | None = None  # (config kwargs) -> (encode, decode) of transformers' port
    clip_samples: Callable = _seconds_of_frames  # (config, seconds) -> samples of one fixed call
    skip: Callable = _no_skip  # (contender, preset) -> why it cannot run, or None
    web_preset: str | None = None  # `codec-bench web`'s preset (None: codecport.mjs does not run it)
    web_codebooks: int | None = None  # codebooks in the web graphs (None: all)
    fixed_mode: str = "fixed"  # the mode of one call of the fixed graphs
    compare_noise: Mapping = field(default_factory=dict)  # decode settings that match torch's decode
    long: LongAudio | None = None  # None: no `--long` path
    torch_long: Callable | None = None  # (model, job, manifest) -> the torch timings of `long`
    official: Official | None = None
    # (bench folder, --official-python) -> the weights in the official layout
    prepare_official: Callable | None = None
    contenders: Mapping[str, Callable] = field(default_factory=dict)  # worker runners of its own
    # Parts of our graphs timed apart: label -> (graph, its torch module's path, "head.istft").
    parts: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self):
        if self.torch_codes is None:
            object.__setattr__(self, "torch_codes",
                               lambda model, x, k: [self.torch_encode(model, x, k).numpy()])
        object.__setattr__(self, "compare_noise", MappingProxyType(dict(self.compare_noise)))
        object.__setattr__(self, "contenders", MappingProxyType(dict(self.contenders)))
        object.__setattr__(self, "parts", MappingProxyType(dict(self.parts)))


def facts_of(spec) -> BenchFacts:
    """A registered codec's `BenchFacts`: the `FACTS` of its facts module."""
    return spec.module("facts").FACTS
