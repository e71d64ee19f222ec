"""Cross-check codecport against the official descript-audio-codec code, outside the test suite.

The official package pins old protobuf/torch through descript-audiotools, so it is never a
dependency. This script loads only its model files (dac/nn/layers.py, quantize.py,
model/base.py, model/dac.py) from an unpacked wheel, stubbing the audiotools imports they do
not use for encode/decode, and needs `einops`:

    pip download --no-deps -d /tmp/dac descript-audio-codec && unzip -q /tmp/dac/*.whl -d /tmp/dac
    python scripts/check_official_dac.py --src /tmp/dac [--preset tiny|44khz|24khz|16khz]

It builds the official model with seeded random weight-normed weights, saves it exactly as the
official package does (`state_dict` + `metadata.kwargs`), exports it with codecport, and compares
codes and audio: the fixed-length graph vs the official `encode`/`decode`, and the chunked
graphs vs the official `compress` loop with padding off (delay and hop from the official
`get_delay`/`get_output_length`). Exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch


def load_official(src: Path):
    """The official `dac.model.dac` module, imported from its files with audiotools stubbed."""
    audiotools = types.ModuleType("audiotools")
    audiotools.AudioSignal = object
    audiotools.ml = types.ModuleType("audiotools.ml")
    audiotools.ml.BaseModel = torch.nn.Module
    sys.modules.update({"audiotools": audiotools, "audiotools.ml": audiotools.ml})
    for pkg in ("dac", "dac.nn", "dac.model"):
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(src / pkg.replace(".", "/"))]
        sys.modules[pkg] = mod
    for name in ("dac.nn.layers", "dac.nn.quantize", "dac.model.base", "dac.model.dac"):
        spec = importlib.util.spec_from_file_location(name, src / (name.replace(".", "/") + ".py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules["dac.model.dac"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True, help="unpacked descript-audio-codec wheel")
    ap.add_argument("--preset", default="tiny")
    args = ap.parse_args()

    import codecport
    from codecport.codecs.dac.export import export_dac
    from codecport.codecs.dac.model import DAC, PRESETS, init_random
    from codecport.codecs.dac.weights import load_dac

    official_mod = load_official(args.src)
    kwargs = PRESETS[args.preset].to_kwargs()
    official = official_mod.DAC(**kwargs).eval()
    # Informative weights (the official init makes the output near constant): take codecport's
    # seeded init and store it weight-normed, v = 2w and g = |w|, as the official modules hold it.
    plain = init_random(DAC(PRESETS[args.preset]), seed=1).state_dict()
    with torch.no_grad():
        for name, p in official.named_parameters():
            if name.endswith("weight_v"):
                p.copy_(2 * plain[name[:-2]])
            elif name.endswith("weight_g"):
                p.copy_(plain[name[:-2]].flatten(1).norm(dim=1).reshape(p.shape))
            else:
                p.copy_(plain[name])
    official.delay = official.get_delay()

    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "weights.pth"
        torch.save({"state_dict": official.state_dict(), "metadata": {"kwargs": kwargs}}, ckpt)
        ours, sha = load_dac(str(ckpt))
        sr, hop = ours.cfg.sample_rate, ours.cfg.hop_length
        length, window = hop * 50, sr
        export_dac(ours, Path(tmp) / "m", length, window, preset=args.preset,
                   weights=str(ckpt), weights_sha256=sha)
        codec = codecport.load(Path(tmp) / "m")
        rng = np.random.default_rng(2)

        # Peaks under 1: the runtime scales louder audio down first, as the official compress
        # does and its encode does not.
        x = np.clip(0.3 * rng.standard_normal((1, length)), -0.99, 0.99).astype(np.float32)
        with torch.no_grad():
            _, want, *_ = official.encode(official.preprocess(torch.from_numpy(x)[None], sr))
            want_audio = official.decode(official.quantizer.from_codes(want)[0])[:, 0].numpy()
        got = codec.encode(x, sr, mode="fixed").data
        err = np.abs(codec.decode(want.numpy(), mode="fixed")[0] - want_audio).max()
        same = np.array_equal(got, want.numpy())
        print(f"exact graph vs official encode: codes {'identical' if same else 'DIFFER'}; "
              f"decode max abs err {err:.2e}")
        ok &= same and err <= 1e-4

        geo = codec.graph("encoder_chunked").meta
        official.padding = False
        n_samples = math.ceil(window / hop) * hop
        step = official.get_output_length(n_samples)
        print(f"chunked geometry: official delay {official.delay} hop {step}; codecport "
              f"delay {geo['delay']} step {geo['chunk_step']}")
        ok &= (official.delay, step) == (int(geo["delay"]), int(geo["chunk_step"]))
        long = np.clip(0.3 * rng.standard_normal((1, 3 * step + 17)), -0.99, 0.99).astype(np.float32)
        sig = torch.nn.functional.pad(torch.from_numpy(long)[None], (official.delay, official.delay))
        chunks = []
        with torch.no_grad():
            for i in range(0, long.shape[1], step):  # the official compress loop
                w = sig[..., i:i + n_samples]
                w = torch.nn.functional.pad(w, (0, n_samples - w.shape[-1]))
                chunks.append(official.encode(official.preprocess(w, sr))[1])
        want = torch.cat(chunks, -1).numpy()
        got = codec.encode(long, sr, mode="chunked").data
        same = np.array_equal(got, want)
        print(f"chunked graphs vs official compress loop: codes {'identical' if same else 'DIFFER'} "
              f"{list(got.shape)}")
        ok &= same
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
