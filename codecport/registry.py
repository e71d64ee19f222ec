"""The codec registry: every codec is declared once, here, and the CLI, the bench, the demo, the
export builds and the GPU check iterate over it instead of naming codecs.

A declaration (`CodecSpec`) states what the front ends need before any model is loaded (its
name, default preset, the options of `codec-export CODEC`...) and names the codec's layers by
module path, one file per layer: `models/<name>_config.py` (the config class and presets, no
torch), `models/<name>.py` (the torch reference), `models/<name>_weights.py` (checkpoint
loaders), `export/<name>.py` (the exporter), `runtime/<name>.py` (the `Codec` subclass) and
`bench/<name>.py` (its bench, demo and GPU-check facts). A layer is imported when it is first
asked for, so reading the registry imports nothing of the runtime (no onnxruntime) nor torch:
`codec-run --help` and `codec-export --help` stay light. Adding a codec is its layer files plus
one entry in `BUILTIN` (or a `register()` call, for a codec that lives in another package).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .errors import CodecportError, ModelFileError

LAYERS = {"config": "models.{}_config", "model": "models.{}", "weights": "models.{}_weights",
          "export": "export.{}", "runtime": "runtime.{}", "bench": "bench.{}"}


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
    export_options: tuple[Option, ...] = ()
    web: bool = False  # codecport.mjs runs it in the browser (`codec-export --target web`)
    smoke: tuple[str, ...] = ()  # codec-export arguments for a small export with every graph
    package: str = "codecport"  # the package its layer modules live in (see `LAYERS`)

    def path(self, layer: str) -> str:
        """The module path of the codec's `layer` (a key of `LAYERS`)."""
        return f"{self.package}.{LAYERS[layer].format(self.name)}"

    def module(self, layer: str) -> ModuleType:
        """The codec's module for `layer`, imported on first use."""
        return importlib.import_module(self.path(layer))

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
        """Released weights by name (models/<name>_config.py)."""
        return self.module("config").RELEASES

    @property
    def bench(self):
        """Its `BenchFacts` (bench/<name>.py): what the bench, the demo and the GPU check need."""
        return self.module("bench").FACTS

    @property
    def suffixes(self) -> tuple[str, ...]:
        """Codes files this codec writes: bare `.npy`, `.npz`, and its own formats."""
        from .runtime import codefile

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

BUILTIN = (
    CodecSpec(
        "dac", "DacCodec", default_preset="44khz", web=True,
        export_options=(
            Option("--chunk-len", int, None, "Samples of the chunked graphs' window, for long audio "
                                             "[default: --len].", minimum=1),
        ),
        # 2 s at 16 kHz: the tiny preset's hop is 6 samples, so each call of a 10 s graph (as this was
        # until 2026-12-03) ran 26 667 frames, and every DAC test paid for it.
        smoke=("--preset", "tiny", "--len", "32000")),
    CodecSpec(
        "mimi", "MimiCodec", default_preset="mimi", web=True,
        export_options=(
            Option("--step-frames", int, 1, "Code frames per call of the step graphs (80 ms each for "
                                            "the released Mimi).", minimum=1, aliases=("--frames",)),
            Option("--attention", ("whole-clip", "moshi-stream", "rustymimi"), "whole-clip",
                   "Attention past 250 frames (10 s): equal to the whole clip (moshi's encode), "
                   "moshi's streaming mode (step graphs), whose ring cache drops a step's oldest keys, "
                   "or Kyutai's Rust Mimi (fixed and step graphs), which sees one key more.",
                   aliases=("--window",)),
            SLOTS,
        ),
        # 0.1 s: the tiny preset's attention masks are constants of frames squared, so a short
        # fixed pair keeps the folder small (1.7 MiB at 0.2 s); the step graphs take any length.
        smoke=("--preset", "tiny", "--len", "2400")),
    CodecSpec(
        "snac", "SnacCodec", default_preset="24khz",
        export_options=(
            Option("--step-frames", int, 1, "Window units the step decoder (decoder_step.onnx) gives audio "
                                            "for per call: a unit is a coarse frame at 24 kHz, four (one "
                                            "attention window) at 32 and 44 kHz.", minimum=1,
                   aliases=("--stream-frames",)),
            SLOTS,
        ),
        smoke=("--preset", "tiny", "--len", "4800")),
    CodecSpec(
        "neucodec", "NeuCodecCodec", default_preset="neucodec", export_options=(BUCKETS,), web=True,
        smoke=("--preset", "tiny", "--len", "4000")),  # 0.5 s: 25 frames at the tiny preset's 8 kHz
    CodecSpec(
        "xcodec2", "XCodec2Codec", default_preset="xcodec2", export_options=(BUCKETS,), web=True,
        # NeuCodec's model: its tiny preset, lined up as XCodec2
        smoke=("--preset", "tiny", "--len", "4000")),
)

_CODECS: dict[str, CodecSpec] = {spec.name: spec for spec in BUILTIN}


def register(spec: CodecSpec) -> CodecSpec:
    """Add a codec that lives outside codecport (its `package` holds its layers)."""
    if spec.name in _CODECS and _CODECS[spec.name] != spec:
        raise ValueError(f"codec {spec.name!r} is registered twice")
    _CODECS[spec.name] = spec
    return spec


def codecs() -> list[CodecSpec]:
    """Every registered codec, by name."""
    return [_CODECS[n] for n in sorted(_CODECS)]


def names() -> list[str]:
    return sorted(_CODECS)


def get(name: str) -> CodecSpec:
    if name not in _CODECS:
        raise CodecportError(f"no codec named {name!r}; codecport has {', '.join(names())}")
    return _CODECS[name]


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
