"""descript-audio-codec, the official DAC package, as a codec-bench contender.

    OTHER_ENV/bin/python path/to/codecs/dac/official.py '<json job>'   -> prints one JSON line

Run by its path with the interpreter of an environment of its own (`codec-bench
--official-python`): descript-audio-codec cannot share one with codecport, because its
descript-audiotools pins protobuf<3.20 where onnx and onnxruntime need a newer one. So this file
imports nothing of codecport but the bench's `measure.py` (bench/), which needs numpy alone. It reads the
bench's weights in the official checkpoint layout (`weights-official.pth`: `state_dict` with
weight norm, `metadata.kwargs`), builds the official `DAC` from them, and times `encode` and
codes -> audio (`quantizer.from_codes`, then `decode`) on the bench's clip, as the official
`compress`/`decompress` call them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

# Run by path, this folder is first on sys.path, and its modules (config.py, model.py...) would
# shadow modules of the official package's own imports.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def _measure():
    spec = importlib.util.spec_from_file_location("codec_bench_measure",
                                                  Path(__file__).parents[2] / "bench" / "measure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(job: dict) -> dict:
    try:  # before torch's import (seconds): a package that is not there is found at once
        from dac.model.dac import DAC
    except ImportError as e:
        return {"skipped": f"descript-audio-codec does not import with {sys.executable} ({e})"}
    import torch  # (the package imports it)
    m = _measure()
    folder = Path(job["dir"])
    ckpt = torch.load(folder / "weights-official.pth", map_location="cpu", weights_only=True)
    model = DAC(**ckpt["metadata"]["kwargs"])
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    meta = json.loads((folder / "model" / "manifest.json").read_text())
    x = torch.from_numpy(m.clip(int(meta["geometry"]["samples"])))[:, None]
    with torch.no_grad():  # as the official compress/decompress
        x = model.preprocess(x, model.sample_rate)
        codes, enc = m.timed(lambda: model.encode(x)[1], job["runs"])
        dec = m.timings(lambda: model.decode(model.quantizer.from_codes(codes)[0]), job["runs"])
    try:
        release = version("descript-audio-codec")
    except PackageNotFoundError:  # its model code on the path, not an installed distribution
        import dac

        release = getattr(dac, "__version__", "unknown")
    return {"encode": m.summary(enc, job["seconds"]), "decode": m.summary(dec, job["seconds"]),
            "threads": torch.get_num_threads(), "version": release, "python": sys.executable,
            "codes": codes.numpy().tolist(), "peak_rss_mb": m.peak_rss_mb()}


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
