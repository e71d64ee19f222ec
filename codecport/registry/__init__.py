"""The codec registry: the codecs this codecport knows, each declared where it lives.

A codec is a package of modules named by role (registry/spec.py, docs/architecture.md) whose
`spec` module declares it (`SPEC = CodecSpec(...)`): what the front ends need before any model
is loaded (its name, default preset, the options of `codec-export CODEC`...). The built-in codecs
are the packages of codecport/codecs/, found by listing that folder; a codec in another package
is found through the `codecport.codecs` entry point group its distribution declares (a
`CodecSpec`), or added in a program with `register()`. Finding them imports their `spec` modules
and their codes formats, and of a plugin the modules every front end lists it from (its config,
runtime and facts: no onnxruntime, no torch): `codec-run --help` stays light, and a plugin one of
whose modules does not import is left out, said once, before it can break a command.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import pkgutil
import threading
from pathlib import Path

from ..errors import CodecportError, ModelFileError
from .spec import BUCKETS, ROLES, SLOTS, CodecSpec, Option

__all__ = ["BUCKETS", "ENTRY_POINTS", "ROLES", "SLOTS", "CodecSpec", "Option", "codec_of_folder", "codecs",
           "get", "names", "register"]

log = logging.getLogger(__name__)

ENTRY_POINTS = "codecport.codecs"  # the entry point group of codecs that live in other packages

_CODECS: dict[str, CodecSpec] = {}
_state: str | None = None  # None, "finding", "found"
_lock = threading.RLock()


def register(spec: CodecSpec) -> CodecSpec:
    """Add a codec that lives outside codecport (`spec.package` holds its role modules), with its
    own codes formats; refused whole (ValueError) when its name or a format of it is taken."""
    if not isinstance(spec, CodecSpec):
        raise TypeError(f"register() takes a CodecSpec, got {type(spec).__name__}")
    _find()  # the built-in codecs first: a plugin cannot take one's name before it is found
    _add(spec)
    return spec


def _add(spec: CodecSpec) -> None:
    with _lock:
        if _CODECS.get(spec.name, spec) != spec:
            raise ValueError(f"codec {spec.name!r} is registered twice ({_CODECS[spec.name].package} "
                             f"and {spec.package})")
        if spec.name in _CODECS:
            return
        if spec.codes_file:
            from ..runtime import codefile

            own = spec.module("codesfile")
            entries = [*getattr(own, "FORMATS", ()), *getattr(own, "LAYOUTS", ())]
            for entry in entries:  # all checked before any is added: a refused codec leaves none
                codefile.check_new(entry)
            for entry in entries:
                codefile.add(entry)
        _CODECS[spec.name] = spec


def _find() -> None:
    """Register the built-in codecs and those of installed packages, once (a plugin's module
    that calls `register` while it is imported finds it under way and adds itself)."""
    global _state
    with _lock:
        if _state is not None:
            return
        _state = "finding"
        try:
            here = Path(__file__).resolve().parents[1] / "codecs"
            for info in sorted(pkgutil.iter_modules([str(here)]), key=lambda i: i.name):
                if info.ispkg:
                    module = f"{__package__.rpartition('.')[0]}.codecs.{info.name}.spec"
                    _add(importlib.import_module(module).SPEC)
        except BaseException:
            _state = None  # a built-in that failed is tried again next time, not left out
            raise
        for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
            # One broken plugin must not take codecport's own codecs down with it: it is left out,
            # said once, and its name is refused like any unknown codec.
            try:
                spec = entry.load()
                if not isinstance(spec, CodecSpec):
                    raise TypeError(f"it names a {type(spec).__name__}, not a CodecSpec")
                _check_listed(spec)
                _add(spec)
            except Exception as e:  # whatever the plugin raises
                dist = getattr(entry.dist, "name", None)
                fix = f"reinstall {dist} with what it needs, or uninstall it" if dist else \
                    "fix or uninstall the package that declares it"
                log.warning("left out codec %r of the %s entry points (%s): %s; %s", entry.name, ENTRY_POINTS,
                            entry.value, _one_line(e), fix)
        _state = "found"


def _check_listed(spec: CodecSpec) -> None:
    """Import what the front ends read of every codec to list it, before any model is loaded
    (codec-export's presets and releases, codec-run's codebooks, codec-bench's contenders): a
    plugin whose module does not import is then left out of every listing instead of taking each
    command down. Its model, weights and export modules (torch) wait until the codec is used; its
    facts, the bench's, are imported here only to be checked. The error names the module."""
    for role, names in (("config", ("PRESETS", "RELEASES")), ("runtime", (spec.runtime_class,)),
                        ("facts", ("FACTS",))):
        try:
            module = spec.module(role)
        except Exception as e:
            raise ImportError(f"its {role} module {spec.path(role)} does not import "
                              f"({type(e).__name__}: {_one_line(e)})") from e
        missing = [name for name in names if not hasattr(module, name)]
        if missing:
            raise ImportError(f"its {role} module {spec.path(role)} has no {missing[0]}")


def _one_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def codecs() -> list[CodecSpec]:
    """Every registered codec, by name."""
    _find()
    return [_CODECS[n] for n in sorted(_CODECS)]


def names() -> list[str]:
    _find()
    return sorted(_CODECS)


def get(name: str) -> CodecSpec:
    _find()
    if name not in _CODECS:
        raise CodecportError(f"no codec named {name!r}; codecport has {', '.join(names())}")
    return _CODECS[name]


def codec_of_folder(folder: str | Path) -> CodecSpec:
    """The codec of an export folder, from its manifest (no model loaded) or else the metadata
    of its first graph; `ModelFileError` when it holds no codecport export."""
    from ..runtime.folder import read_manifest
    from ..runtime.graph import graph_files, read_metadata

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
