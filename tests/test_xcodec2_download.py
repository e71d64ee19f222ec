"""XCodec2's weights (codecs/xcodec2/weights.py, NeuCodec's loader with XCodec2's facts): the
official `model.safetensors` of HKUSTAudio/xcodec2 (transformers' `save_pretrained` of
`XCodec2Model`: w2v-BERT inside, weight norm as torch's parametrization, SnakeBeta's beta named
`bias`) by released name from a local server that answers as the Hub does, and from a folder.
The tiny preset stands in for the released one."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save as save_safetensors
from test_mimi_download import hub
from test_neucodec_download import env  # noqa: F401 (a fixture)

from codecport.codecs.xcodec2.config import PRESETS, RELEASES, WEIGHTS_FILE
from codecport.codecs.xcodec2.model import MODEL, init_random
from codecport.codecs.xcodec2.weights import XCODEC2, load
from codecport.errors import CheckpointError

REPO = RELEASES["xcodec2"]
LOAD = """
import json, sys, torch
from codecport.errors import CodecportError
from codecport.codecs.xcodec2.config import PRESETS
from codecport.codecs.xcodec2.weights import load
try:
    model, sha = load(sys.argv[1])
except CodecportError as e:
    print(json.dumps({"error": str(e)}))
else:
    torch.save(model.state_dict(), sys.argv[2])
    print(json.dumps({"sha": sha, "preset": [n for n, c in PRESETS.items() if c == model.cfg]}))
"""


@pytest.fixture(scope="module")
def tiny():
    return init_random(MODEL(PRESETS["tiny"]), seed=0).eval()


def official(model) -> dict[str, torch.Tensor]:
    """The official checkpoint's state dict of `model`: the acoustic encoder's convs as torch's
    weight-norm parametrization, SnakeBeta's beta as `bias`, the ISTFT window, and w2v-BERT with
    a layer more than XCodec2 reads."""
    out = {}
    for k, v in model.state_dict().items():
        if k.startswith("CodecEnc.") and k.endswith(".weight") and v.dim() == 3:
            stem = k[: -len(".weight")]
            out[f"{stem}.parametrizations.weight.original0"] = \
                v.flatten(1).norm(dim=1).reshape(-1, 1, 1).clone()
            out[f"{stem}.parametrizations.weight.original1"] = v.clone()
        else:
            out[k] = v.clone()
    out = XCODEC2.to_official(out)
    assert any(k.endswith(".act.bias") for k in out) and not any(k.endswith(".act.beta") for k in out)
    out["generator.head.istft.window"] = torch.hann_window(4 * model.cfg.hop)
    last = f"semantic_model.encoder.layers.{model.cfg.semantic.layers}."
    out.update({k.replace("semantic_model.encoder.layers.0.", last): v + 1 for k, v in out.items()
                if k.startswith("semantic_model.encoder.layers.0.")})
    return out


def assert_same(got: dict[str, torch.Tensor], model) -> None:
    want = model.state_dict()
    assert set(got) == set(want)
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=1e-6, atol=1e-7, msg=k)


def test_release_by_name_reads_one_file(tiny, env, tmp_path):  # noqa: F811 (the fixture)
    data = save_safetensors(official(tiny))
    with hub({"main": {WEIGHTS_FILE: data}}, repo=REPO) as h:
        proc = subprocess.run([sys.executable, "-c", LOAD, "xcodec2", str(tmp_path / "sd.pt")],
                              capture_output=True, text=True, env={**env, "HF_ENDPOINT": h.url},
                              timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"sha": hashlib.sha256(data).hexdigest(), "preset": ["tiny"]}
    assert h.gets == [f"/{REPO}/resolve/main/{WEIGHTS_FILE}"]  # w2v-BERT is inside: no second repo
    assert_same(torch.load(tmp_path / "sd.pt"), tiny)


def test_a_folder_and_what_it_refuses(tiny, tmp_path):
    (tmp_path / WEIGHTS_FILE).write_bytes(save_safetensors(official(tiny)))
    model, _ = load(str(tmp_path))
    assert_same(model.state_dict(), tiny)
    # A checkpoint that lacks one of SnakeBeta's betas is refused, naming it.
    sd = official(tiny)
    gone = next(k for k in sd if k.endswith(".act.bias"))
    del sd[gone]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / WEIGHTS_FILE).write_bytes(save_safetensors(sd))
    with pytest.raises(CheckpointError, match=gone.replace(".act.bias", ".act.beta").replace(".", r"\.")):
        load(str(tmp_path / "bad"))
