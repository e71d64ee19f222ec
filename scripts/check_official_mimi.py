"""Cross-check codecport's Mimi against the official moshi code, outside the test suite.

moshi pins torch<2.10 and numpy<2.3, so it is never a dependency. This script imports its
source from an unpacked wheel (sentencepiece, which only the text tokenizer needs, is stubbed):

    pip download --no-deps -d /tmp/moshi moshi==0.2.13 && unzip -q /tmp/moshi/*.whl -d /tmp/moshi
    python scripts/check_official_mimi.py --src /tmp/moshi [--preset tiny|mimi] [--seconds S]

It saves seeded random weights in moshi's checkpoint format (moshi's key names), builds moshi's
model with `loaders.get_mimi` from that file, exports the same file with codecport (fixed-length
and step graphs), and compares on one clip: moshi's whole-clip `encode`/`decode` against the
ONNX fixed graphs and the default step graphs; moshi's own streaming mode (`with
mimi.streaming(1)`, one frame per call) against its whole-clip mode; and moshi's streaming mode
against step graphs exported with `attention="moshi-stream"`. Exits 1 on any codecport difference.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, required=True, help="unpacked moshi wheel")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--seconds", type=float, default=None,
                    help="clip length [default: enough for 300 attention positions]")
    args = ap.parse_args()

    from safetensors.torch import save_file

    import codecport
    from codecport.codecs.mimi.export import export_mimi
    from codecport.codecs.mimi.model import PRESETS, MimiModel, init_random
    from codecport.codecs.mimi.weights import moshi_config

    sentencepiece = types.ModuleType("sentencepiece")
    sentencepiece.SentencePieceProcessor = object
    sys.modules["sentencepiece"] = sentencepiece
    sys.path.insert(0, str(args.src))
    from moshi.models import loaders

    cfg = PRESETS[args.preset]
    ours = init_random(MimiModel(cfg), seed=0).eval()
    frames = math.ceil(args.seconds * cfg.frame_rate) if args.seconds else 150
    k = cfg.n_codebooks
    rng = np.random.default_rng(1)
    clip = (0.2 * rng.standard_normal((1, 1, frames * cfg.frame_size - 7))).astype(np.float32)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.safetensors"
        save_file({n: t.contiguous() for n, t in ours.state_dict().items()}, str(path))
        moshi = loaders.get_mimi(str(path), moshi_config(cfg), num_codebooks=k).eval()
        x = torch.from_numpy(clip)
        with torch.no_grad():
            want = moshi.encode(x).numpy()
            want_audio = moshi.decode(torch.from_numpy(want)).numpy()
            streamed, streamed_audio = [], []
            padded = torch.nn.functional.pad(x, (0, -x.shape[-1] % cfg.frame_size))
            with moshi.streaming(1):
                for i in range(0, padded.shape[-1], cfg.frame_size):
                    streamed.append(moshi.encode(padded[..., i:i + cfg.frame_size]))
            streamed = torch.cat(streamed, -1).numpy()
            with moshi.streaming(1):
                for i in range(want.shape[-1]):
                    streamed_audio.append(moshi.decode(torch.from_numpy(want[..., i:i + 1])))
            streamed_audio = torch.cat(streamed_audio, -1).numpy()
        print(f"{args.preset}: {frames} frames ({2 * frames} attention positions, context {cfg.context})")
        diff = np.argwhere(streamed != want)
        print(f"  moshi streaming vs moshi whole clip: {len(diff)} of {want.size} codes differ"
              + (f" (first at frame {diff[0][-1]})" if len(diff) else ""))

        out = Path(tmp) / "onnx"
        export_mimi(ours, out, clip.shape[-1], 1, preset=args.preset, weights=str(path),
                    weights_sha256="none")
        codec = codecport.load(out)
        for label, mode in (("fixed graph", "fixed"), ("step graphs", "step")):
            codes = codec.encode(clip[0], cfg.sample_rate, k, mode=mode).data
            audio = codec.decode(codes, mode=mode)[0][None]
            same = np.array_equal(codes, want)
            err = float(np.abs(audio - want_audio).max())
            failed |= not same or err > 1e-4
            print(f"  codecport {label} vs moshi whole clip: codes {'identical' if same else 'DIFFER'}, "
                  f"audio max abs error {err:.2e}")

        ring = Path(tmp) / "ring"
        export_mimi(ours, ring, None, 1, preset=args.preset, weights=str(path),
                    weights_sha256="none", attention="moshi-stream")
        codec = codecport.load(ring)
        codes = codec.encode(clip[0], cfg.sample_rate, k, mode="step").data
        audio = codec.decode(want[0], mode="step")[0][None]
        same = np.array_equal(codes, streamed)
        err = float(np.abs(audio - streamed_audio).max())
        failed |= not same or err > 1e-4
        print(f"  codecport step graphs (attention moshi-stream) vs moshi streaming: codes "
              f"{'identical' if same else 'DIFFER'}, audio max abs error {err:.2e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
