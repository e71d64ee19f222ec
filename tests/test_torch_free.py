"""The runtime needs no torch: an exported folder of every codec is encoded and decoded (and
tokenized), through the API and through `codec-run`, in a process where torch, onnx and the other export-only
packages cannot be imported at all."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from support import noise

import codecport
from codecport import registry

# The [export] extra and what the tests have besides: none of it may be needed to run a folder.
BLOCKED = ("torch", "onnx", "onnxscript", "onnxsim", "safetensors", "transformers", "coremltools",
           "huggingface_hub", "rustymimi")

SCRIPT = """
import importlib.abc, json, sys
BLOCKED = set(sys.argv[1].split(","))

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not installed here (blocked by the test)")
        return None

sys.meta_path.insert(0, Block())
import numpy as np
import codecport
from codecport.cli import run_cli

folder, wav, out = sys.argv[2:5]
codec = codecport.load(folder)
audio, sr = codecport.read_audio(wav)
codes = codec.encode(audio, sr)
codes.save(out + "/api.npz")
decoded, rate = codec.decode(codecport.load_codes(out + "/api.npz"))
for args in (["encode", wav, "-m", folder, "-o", out + "/cli.npz"],
             ["decode", out + "/cli.npz", "-m", folder, "-o", out + "/cli.wav"],
             ["info", folder, "--json"],
             ["tokenize", wav, "-m", folder, "-o", out + "/tokens", "--workers", "1"]):
    try:
        run_cli.main(args, standalone_mode=False)
    except SystemExit as e:
        assert not e.code, e.code
print(json.dumps({"frames": list(codes.n_frames), "shape": list(decoded.shape), "rate": rate,
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)}))
"""


@pytest.mark.parametrize("name", registry.names())
def test_a_folder_runs_without_torch(smoke_exports, tmp_path, name):
    wav = tmp_path / "in.wav"
    sf.write(wav, noise(9000, channels=2).T, 22050, subtype="FLOAT")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, ",".join(BLOCKED), str(smoke_exports[name]),
                           str(wav), str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    assert result["shape"] == [2, 9000] and result["rate"] == 22050 and result["frames"][0] > 0
    y, sr = sf.read(tmp_path / "cli.wav", dtype="float32", always_2d=True)
    assert sr == 22050 and y.shape == (9000, 2) and np.isfinite(y).all()
    import pyarrow.dataset as pads

    row = pads.dataset(tmp_path / "tokens", format="parquet").to_table().to_pylist()
    api = codecport.load_codes(tmp_path / "api.npz").arrays
    assert len(row) == 1 and all(np.array_equal(np.array(row[0]["codes" if i == 0 else f"codes_{i}"]), a)
                                 for i, a in enumerate(api))


def test_the_blocker_blocks(tmp_path):
    """The control: the same script fails where the runtime would import torch."""
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.argv[1:] = ['torch']\n"
                           + SCRIPT.split("import numpy as np")[0] + "import torch"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode != 0 and "blocked by the test" in proc.stderr
