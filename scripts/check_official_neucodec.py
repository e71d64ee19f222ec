"""NeuCodec's decoder graph against the official `neucodec` package, at the released size: the
same audio, and the time of each, interleaved (outside the test suite: the full-size export
takes a minute and 3 GB).

    bash scripts/setup.sh export,dev      # installs neucodec --no-deps (scripts/official-neucodec.txt)
    .venv/bin/python scripts/check_official_neucodec.py [--frames 100] [--rounds 6]

Builds the official `CodecDecoderVocos(hop_length=480)` and `fc_post_a` with seeded random
weights, loads them into codecport's model, exports its decoder graph for `--frames` code frames
(50 a second), and decodes the same random codes with the official `NeuCodec.decode_code` (torch)
and the graph (ONNX Runtime, CPU, FSQ in numpy), in turn. Prints the max abs difference and the
median time of each, with the pairwise ratio. Exits 1 past 1e-4.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import official_neucodec

from codecport.codecs.neucodec.export import graph_specs
from codecport.codecs.neucodec.fsq import Fsq
from codecport.codecs.neucodec.model import PRESETS, NeuCodec
from codecport.export.graph import to_onnx


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    nc = official_neucodec()
    torch.manual_seed(0)
    official = types.SimpleNamespace(
        generator=nc.codec_decoder_vocos.CodecDecoderVocos(hop_length=480).eval(),
        fc_post_a=torch.nn.Linear(2048, 1024))
    ours = NeuCodec(PRESETS["neucodec"]).eval()
    sd = {f"generator.{k}": v for k, v in official.generator.state_dict().items()}
    sd.update({f"fc_post_a.{k}": v for k, v in official.fc_post_a.state_dict().items()})
    ours.load_state_dict(sd, strict=False)
    t0 = time.perf_counter()
    graph = to_onnx(graph_specs(ours, args.frames, {})[0])
    print(f"decoder graph for {args.frames} frames exported in {time.perf_counter() - t0:.1f} s")
    sess = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    del graph
    codes = np.random.default_rng(0).integers(0, 65536, (1, 1, args.frames))
    fsq = Fsq(PRESETS["neucodec"].levels)

    def theirs():
        with torch.no_grad():
            return nc.NeuCodec.decode_code(official, torch.from_numpy(codes)).numpy()

    def mine():
        return sess.run(None, {"levels": fsq.codes(codes[:, 0]),
                               "mask": np.ones((1, 1, args.frames), np.float32)})[0]

    err = float(np.abs(mine() - theirs()).max())
    t_off, t_ours = [], []
    for _ in range(args.rounds):
        for fn, acc in ((theirs, t_off), (mine, t_ours)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    sec = args.frames / 50
    print(f"max abs difference {err:.3g}")
    print(f"{sec:.1f} s of audio, {torch.get_num_threads()} torch threads: official decode_code "
          f"{1000 * np.median(t_off):.0f} ms (RTF {np.median(t_off) / sec:.3f}), ONNX fp32 "
          f"{1000 * np.median(t_ours):.0f} ms (RTF {np.median(t_ours) / sec:.3f}); official / ONNX, "
          f"median of pairs: {np.median(np.array(t_off) / np.array(t_ours)):.2f}")
    return 0 if err <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
