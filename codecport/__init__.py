"""codecport: neural audio codecs as fixed-length ONNX graphs, run on any ONNX Runtime provider.

    import codecport
    codec = codecport.load("dac44")                 # a folder written by codec-export
    codes = codec.encode(audio, sample_rate)         # audio [samples] or [channels, samples]
    audio, sr = codec.decode(codes)                  # [channels, samples] float32, original rate
    codes.save("speech.dac")                         # .npy, .npz, or the codec's own format
    codes = codecport.load_codes("speech.dac")

Nothing here imports torch: running exported folders needs only the base install.
"""

from __future__ import annotations

from pathlib import Path

from .version import __version__

__all__ = [
    "AudioError",
    "CheckpointError",
    "Codec",
    "CodecportError",
    "Codes",
    "CodesError",
    "DownloadError",
    "ExportError",
    "ModelFileError",
    "ProviderError",
    "__version__",
    "available_codecs",
    "load",
    "load_codes",
    "read_audio",
    "write_audio",
]

from .errors import (
    AudioError,
    CheckpointError,
    CodecportError,
    CodesError,
    DownloadError,
    ExportError,
    ModelFileError,
    ProviderError,
)


def load(path: str | Path, provider: str = "cpu", fallback: str | None = None,
         options: dict[str, str] | None = None):
    """The codec of an export folder (`codec-export ... -o path`), on ONNX Runtime `provider`
    (`cpu`, `cuda`, `dml`, `coreml` or `auto`). `fallback` ("cpu") is used when that provider is
    not installed; `options` override provider options (e.g. `{"MLComputeUnits": "ALL"}`) and
    codecport's own (`io_binding`, `parallel`). Returns a `Codec`."""
    from .registry import codec_of_folder

    return codec_of_folder(path).runtime(path, provider, fallback, options)


def load_codes(path: str | Path, layout: str | None = None):
    """`Codes` from a file written by `Codes.save` or `codec-run encode`, picked by suffix, or
    arranged in `layout` (e.g. "orpheus")."""
    from .registry import codecs
    from .runtime.codes import load_codes as _load

    codecs()  # the codecs' own formats and layouts, which the registry adds as it finds them

    return _load(path, layout)


def available_codecs() -> list[str]:
    """Names of the codecs this codecport knows (`codec-export NAME`)."""
    from .registry import names

    return names()


def read_audio(path: str | Path):
    """(`[channels, samples]` float32, sample rate) of an audio file soundfile reads."""
    from .runtime.audio import read_audio as _read

    return _read(path)


def write_audio(path: str | Path, audio, sample_rate: int) -> None:
    """Write `[channels, samples]` (or `[samples]`) to `path`, format by suffix, atomically."""
    import numpy as np

    from .runtime.audio import write_audio as _write

    audio = np.asarray(audio, np.float32)
    _write(Path(path), audio[None] if audio.ndim == 1 else audio, sample_rate)


def __getattr__(name: str):
    # The classes, imported on first use: `import codecport` stays light for the CLI's --help.
    if name == "Codec":
        from .runtime.codec import Codec

        return Codec
    if name == "Codes":
        from .registry import codecs
        from .runtime.codes import Codes

        codecs()  # `Codes.save`/`load` know the codecs' own formats once the registry found them

        return Codes
    raise AttributeError(f"module 'codecport' has no attribute {name!r}")
