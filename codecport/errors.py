"""Typed errors. Each message is one line that says what went wrong and what to do."""


class CodecportError(Exception):
    """Base class: the CLI prints these as one line and exits non-zero."""


class CheckpointError(CodecportError):
    """A checkpoint that cannot be loaded: unsafe, malformed, or not matching the model."""


class ConfigError(CheckpointError):
    """A model config outside what any real model of the codec has."""


class DownloadError(CodecportError):
    """Weights could not be fetched."""


class ExportError(CodecportError):
    """A graph that failed a static check."""


class ValidationError(ExportError):
    """ONNX Runtime output disagrees with torch beyond tolerance."""


class AudioError(CodecportError):
    """Unreadable, empty or non-finite audio."""


class CodesError(CodecportError):
    """Codes of the wrong shape, dtype or range for the model."""


class ModelFileError(CodecportError):
    """An ONNX file or model folder that is missing, corrupt, or of another codec/length."""


class ProviderError(CodecportError):
    """A requested ONNX Runtime execution provider is not available."""


class OutputError(CodecportError):
    """An output path that cannot be written (a folder, under a file, not writable)."""
