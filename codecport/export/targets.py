"""Where an export's graphs will run (`--target`) and in what precision (`--precision`): the
table `codec-export` takes its choices from. No onnx here: the CLI's `--help` reads it."""

from __future__ import annotations

from dataclasses import dataclass

PRECISIONS = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class Target:
    layout_2d: bool = False  # 1-D convs carried as 2-D
    ort_format: bool = False  # .ort files + required_operators_and_types.config
    mlpackage: bool = False  # CoreML .mlpackage per graph
    web: bool = False  # quantizer in the graphs, graph facts in the manifest (export/web.py)
    precisions: tuple[str, ...] = PRECISIONS


TARGETS = {
    "cpu": Target(),
    "cuda": Target(),
    # DirectML's int8 story is QDQ-on-GPU with its own caveats; we only claim what the rule table
    # checks (fp32/fp16 tensors).
    "dml": Target(precisions=("fp32", "fp16")),
    # coremltools quantizes its own way (ct.optimize), not from ONNX QDQ, and ORT's ML Program
    # partitioner takes no Q/DQ: no int8 here.
    "coreml": Target(mlpackage=True, precisions=("fp32", "fp16")),
    "nnapi": Target(layout_2d=True),
    "mobile": Target(layout_2d=True, ort_format=True),
    # onnxruntime-web's wasm is the CPU EP, so every precision runs there; which ones pay on
    # WebGPU is measured (docs/web.md), not assumed (fp16 breaks on some GPUs, onnxruntime #29807).
    "web": Target(web=True),
}
