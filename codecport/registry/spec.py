"""What a codec declares before anything of it is loaded (`CodecSpec`), and the options of
`codec-export CODEC` that several codecs share.

A codec is a package of modules named by role (docs/architecture.md, "Adding a codec"): `spec`
(its `SPEC`, this declaration), `config`, `model`, `weights`, `export`, `runtime`, `facts` and,
where it has a codes file of its own, `codesfile`. `CodecSpec.module(role)` imports one when it is
first asked for; that call is an arrow of the house like an import statement, and
tests/test_layout.py reads it as one: the engine asks only for `runtime`, `config` and
`codesfile`, the applications and front ends for the rest.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

# The roles a codec's package has: a module each, `codesfile` only where it has a codes format.
ROLES = ("spec", "config", "model", "weights", "export", "runtime", "facts", "codesfile")


@dataclass(frozen=True)
class Option:
    """A codec's own option of `codec-export CODEC`: `flag` ("--chunk-len"), its type (`int`,
    `str`, or a tuple of choices), default and help; `minimum` for integers; `aliases`, older
    names still taken (hidden from `--help`)."""

    flag: str
    type: type | tuple[str, ...]
    default: object
    help: str
    minimum: int | None = None
    aliases: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class CodecSpec:
    name: str  # the registry name, the `codec` of its metadata and codes files
    runtime_class: str  # the `Codec` subclass in its runtime module; its `label` names the codec
    default_preset: str  # the preset used when none is named
    package: str  # the package holding its role modules (`__package__` in its spec.py)
    export_options: tuple[Option, ...] = ()
    web: bool = False  # codecport.mjs runs it in the browser (`codec-export --target web`)
    smoke: tuple[str, ...] = ()  # codec-export arguments for a small export with every graph
    codes_file: bool = False  # it has a codes format or layout of its own (its `codesfile` module)

    def path(self, role: str) -> str:
        """The module path of the codec's `role` (one of `ROLES`)."""
        if role not in ROLES:
            raise ValueError(f"{role!r} is not a codec role ({', '.join(ROLES)})")
        return f"{self.package}.{role}"

    def module(self, role: str) -> ModuleType:
        """The codec's module for `role`, imported on first use."""
        return importlib.import_module(self.path(role))

    @property
    def has_step_graphs(self) -> bool:
        """Its export writes step graphs, `--step-frames` code frames a call."""
        return any(o.dest == "step_frames" for o in self.export_options)

    @property
    def runtime(self) -> type:
        """The `Codec` subclass: `spec.runtime(folder, provider, ...)` opens an export."""
        return getattr(self.module("runtime"), self.runtime_class)

    @property
    def label(self) -> str:
        """The codec's name in messages ("DAC")."""
        return self.runtime.label

    @property
    def presets(self) -> dict:
        return self.module("config").PRESETS

    @property
    def releases(self) -> dict:
        """Released weights by name (its config module's `RELEASES`)."""
        return self.module("config").RELEASES

    @property
    def suffixes(self) -> tuple[str, ...]:
        """Codes files this codec writes: bare `.npy`, `.npz`, and its own formats."""
        from ..runtime import codefile

        return codefile.suffixes(self.name)


# Codecs with step graphs can write them again for several streams a call (codec-serve's batches).
SLOTS = Option("--slots", int, None, "Also write step graphs that step this many independent streams a "
                                     "call (<side>_slots.onnx), and each power of two below it "
                                     "(<side>_slots_s<B>.onnx; from one where they keep attention as "
                                     "rings), for codec-serve.",
               minimum=2)

# Fixed-length codecs whose model attends to the whole clip can write shorter graphs beside the main pair.
BUCKETS = Option("--buckets", str, None, "Shorter fixed lengths also written, samples at the output rate, "
                                         "comma-separated (e.g. 48000,96000): a clip runs through the "
                                         "shortest graphs that hold it, with the same result, sooner.")
