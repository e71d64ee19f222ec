"""The codec registry: each codec is declared once, beside its runtime class, and everything
else (the CLI, the bench, the demo, the export variants, the GPU check) iterates over it.

A declaration is a `CodecSpec` passed to `register()` at the bottom of `runtime/<codec>.py`.
It names the codec's other layers by module path (by default the layout's own names), so
reading the registry needs neither torch nor onnx: `models/<codec>_config.py` (the config class
and presets, torch-free), `models/<codec>.py` (the torch reference), `models/<codec>_weights.py`
(checkpoint loaders), `export/<codec>.py` (the exporter), `bench/<codec>.py` (its bench and demo
hooks). Adding a codec is those files plus its `register()` call; the registry finds it by
importing every module of `codecport.runtime`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .errors import CodecportError, ModelFileError


@dataclass(frozen=True)
class Option:
    """A codec's own option of `codec-export CODEC`: `flag` ("--chunk-len"), its type (`int`,
    `str`, or a tuple of choices), default and help; `minimum` for integers."""

    flag: str
    type: type | tuple[str, ...]
    default: object
    help: str
    minimum: int | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class CodeFormat:
    """A codes file format of the codec's own, by suffix (DAC: `.dac`)."""

    suffix: str
    load: Callable  # (path) -> Codes
    save: Callable  # (codes, path) -> None


@dataclass(frozen=True)
class Layout:
    """Another arrangement of a codec's codes in a file (`codec-run encode/decode --layout
    NAME`), e.g. the flat sequence a TTS model's tokens follow."""

    name: str
    suffix: str
    load: Callable  # (path) -> Codes
    save: Callable  # (codes, path) -> None
    help: str = ""


@dataclass(frozen=True)
class CodecSpec:
    runtime: type  # the `Codec` subclass; its `name` and `label` name the codec
    default_variant: str  # the preset used when none is named
    export_options: tuple[Option, ...] = ()
    formats: tuple[CodeFormat, ...] = ()
    layouts: tuple[Layout, ...] = ()
    level_arrays: bool = False  # one codebook per time scale: `.npz` holds each as [channels, frames]
    web: bool = False  # codecport.mjs runs it in the browser (`codec-export --target web`)
    smoke: tuple[str, ...] = ()  # codec-export arguments for a small export with every graph
    # The codec's other layers, by module path; left empty, the layout's own names for `name`:
    config: str = ""  # models/<name>_config.py: `PRESETS` (name -> config), `CONFIG` (the config
    # class), `RELEASES` (released weights by name); no torch
    model: str = ""  # models/<name>.py: `MODEL` (the torch reference class), `init_random(model, seed)`
    weights: str = ""  # models/<name>_weights.py: `load(weights, variant, revision) -> (model, sha256)`
    export: str = ""  # export/<name>.py: `export(model, out_dir, length, options=..., ...) -> report`,
    # `describe(report)` (the CLI's lines) and `hooks(manifest)` (how the variants run it)
    bench: str = ""  # bench/<name>.py: the codec's bench and demo hooks (see bench/cli.py)

    def __post_init__(self):
        name = self.runtime.name
        for layer, path in (("config", f"models.{name}_config"), ("model", f"models.{name}"),
                            ("weights", f"models.{name}_weights"), ("export", f"export.{name}"),
                            ("bench", f"bench.{name}")):
            if not getattr(self, layer):
                object.__setattr__(self, layer, f"codecport.{path}")

    @property
    def name(self) -> str:
        return self.runtime.name

    @property
    def label(self) -> str:
        return self.runtime.label

    def module(self, layer: str) -> ModuleType:
        """The codec's module for `layer` ("config", "model", "weights", "export", "bench")."""
        return importlib.import_module(getattr(self, layer))

    @property
    def presets(self) -> dict:
        return self.module("config").PRESETS

    @property
    def suffixes(self) -> tuple[str, ...]:
        """Codes files this codec writes: bare `.npy`, `.npz`, and its own formats."""
        return (".npy", ".npz", *(f.suffix for f in self.formats))


_CODECS: dict[str, CodecSpec] = {}
_discovered = False


def register(spec: CodecSpec) -> CodecSpec:
    """Add a codec (called at import of its runtime module)."""
    if spec.name in _CODECS and _CODECS[spec.name] is not spec:
        raise ValueError(f"codec {spec.name!r} is registered twice")
    _CODECS[spec.name] = spec
    spec.runtime.spec = spec
    return spec


def _discover() -> None:
    global _discovered
    if not _discovered:
        from . import runtime

        for info in pkgutil.iter_modules(runtime.__path__):
            importlib.import_module(f"{runtime.__name__}.{info.name}")
        _discovered = True


def codecs() -> list[CodecSpec]:
    """Every registered codec, by name."""
    _discover()
    return [_CODECS[n] for n in sorted(_CODECS)]


def names() -> list[str]:
    return [c.name for c in codecs()]


def get(name: str) -> CodecSpec:
    _discover()
    if name not in _CODECS:
        raise CodecportError(f"no codec named {name!r}; codecport has {', '.join(names())}")
    return _CODECS[name]


def code_format(suffix: str, codec: str | None) -> CodeFormat | None:
    """The codec-declared format for `suffix`, of `codec` (any codec when None)."""
    return next((f for c in codecs() if codec in (None, c.name) for f in c.formats if f.suffix == suffix),
                None)


def layout(name: str, codec: str) -> Layout:
    """`codec`'s layout `name`, or `CodesError` naming the codecs that have it."""
    from .errors import CodesError

    spec = get(codec)
    found = next((lay for lay in spec.layouts if lay.name == name), None)
    if found is None:
        have = [c.name for c in codecs() if any(lay.name == name for lay in c.layouts)]
        raise CodesError(f"the {name} layout is for {', '.join(have) or 'no codec'} codes; this "
                         f"folder holds {spec.label}")
    return found


def layout_names() -> list[str]:
    return sorted({lay.name for c in codecs() for lay in c.layouts})


def code_suffixes() -> list[str]:
    return [f.suffix for c in codecs() for f in c.formats]


def codec_of_folder(folder: str | Path) -> CodecSpec:
    """The codec of an export folder, from its manifest (no model loaded) or else the metadata
    of its first graph; `ModelFileError` when it holds no codecport export."""
    from .runtime.folder import read_manifest
    from .runtime.graph import graph_files, read_metadata

    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFileError(f"{folder}: no such model folder; run codec-export first")
    manifest = read_manifest(folder)
    if manifest is not None:
        name = manifest["codec"]
    else:
        files = graph_files(folder)
        if not files:
            raise ModelFileError(f"{folder}: no exported graphs here; run codec-export first")
        name = read_metadata(files[0]).get("codec", "")
    try:
        return get(name)
    except CodecportError:
        raise ModelFileError(f"{folder}: holds a {name!r} export, which this codecport does not "
                             f"know ({', '.join(names())}); upgrade codecport or re-export") from None
