"""codecport: neural audio codecs as fixed-length ONNX graphs, run on any ONNX Runtime provider."""

__version__ = "0.1.0"
