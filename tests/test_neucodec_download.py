"""NeuCodec's weights (codecs/neucodec/weights.py): the official layout by released name through
huggingface_hub (`pytorch_model.bin` from neuphonic/neucodec, the semantic model from
facebook/w2v-bert-2.0's `model.safetensors`, both from a local server that answers as the Hub
does), a folder or file, and the checkpoints it refuses. The tiny preset stands in for the
released one; the loader infers it from the shapes. Loads through the Hub run in a process of
their own (huggingface_hub reads its environment when imported), local ones in this process."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
import torch
from safetensors.torch import save as save_safetensors
from test_mimi_download import COMMITS, Hub, hub

from codecport.codecs.neucodec.config import RELEASES, SEMANTIC_FILE, SEMANTIC_REPO, WEIGHTS_FILE
from codecport.codecs.neucodec.model import PRESETS, NeuCodec, init_random
from codecport.codecs.neucodec.weights import load
from codecport.errors import CheckpointError
from codecport.models.checkpoint import unfold_weight_norm

REPO = RELEASES["neucodec"]
PREFIX = "semantic_model."


@contextmanager
def hubs(repos: dict[str, dict]) -> Iterator[tuple[str, dict[str, Hub]]]:
    """One endpoint serving several repos: test_mimi_download's `hub` answers for one repo, so each
    repo gets its own and a front server relays each request to the one its path names."""
    with ExitStack() as stack:
        backs = {repo: stack.enter_context(hub(files, repo=repo)) for repo, files in repos.items()}

        class Front(BaseHTTPRequestHandler):
            def _relay(self, method: str) -> None:
                back = next((h for r, h in backs.items() if self.path.startswith(f"/{r}/")), None)
                if back is None:
                    self.send_response(404)
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(back.url.removeprefix("http://"), timeout=30)
                conn.request(method, self.path,
                             headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                resp = conn.getresponse()
                body = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("server", "date", "connection"):
                        self.send_header(k, v)
                self.end_headers()
                if method == "GET":
                    self.wfile.write(body)

            def do_HEAD(self):
                self._relay("HEAD")

            def do_GET(self):
                self._relay("GET")

            def log_message(self, *args):
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Front)
        thread = Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}", backs
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join(5)


LOAD = """
import json, sys, torch
from codecport.errors import CodecportError
from codecport.codecs.neucodec.model import PRESETS
from codecport.codecs.neucodec.weights import load
try:
    model, sha = load(sys.argv[1], preset=sys.argv[2] or None, revision=sys.argv[3] or None)
except CodecportError as e:
    print(json.dumps({"error": str(e)}))
else:
    torch.save(model.state_dict(), sys.argv[4])
    print(json.dumps({"sha": sha, "training": model.training,
                      "preset": [n for n, c in PRESETS.items() if c == model.cfg]}))
"""


def _load(weights: str, env: dict, out: Path, preset: str = "", revision: str = "") -> dict:
    proc = subprocess.run([sys.executable, "-c", LOAD, weights, preset, revision, str(out)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def env(tmp_path) -> dict:
    out = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and not k.startswith("HF_")}
    return {**out, "HF_HOME": str(tmp_path / "hf"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1"}


@pytest.fixture(scope="module")
def tiny() -> NeuCodec:
    return init_random(NeuCodec(PRESETS["tiny"]), seed=0).eval()


def _bytes(sd: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


def official(model: NeuCodec, scale: float = 1.0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the official `pytorch_model.bin`'s state dict, w2v-BERT's `model.safetensors`) of `model`:
    the acoustic encoder weight-normed, training-only and constant keys the loader must drop, the
    semantic model left out of the first and in the second under transformers' names with a layer
    more than NeuCodec reads and the keys it does not use."""
    sd = {k: v * scale if v.is_floating_point() else v for k, v in model.state_dict().items()}
    cfg = model.cfg
    bin_sd = {**unfold_weight_norm({k: v for k, v in sd.items() if k.startswith("CodecEnc.")}),
              **{k: v for k, v in sd.items() if not k.startswith(("CodecEnc.", PREFIX))},
              "generator.head.istft.window": torch.hann_window(4 * cfg.hop),
              "fc_post_s.weight": torch.randn(cfg.hidden, cfg.vq_dim),
              "SemanticDecoder_module.initial_conv.weight": torch.randn(4, 4, 3)}
    assert any(k.endswith(".weight_g") for k in bin_sd)  # the loader has weight norm to fold
    w2v = {k[len(PREFIX):]: v.clone() for k, v in sd.items() if k.startswith(PREFIX)}
    w2v.update({k.replace("encoder.layers.0.", f"encoder.layers.{cfg.semantic.layers}."): v + 1
                for k, v in w2v.items() if k.startswith("encoder.layers.0.")})
    w2v["masked_spec_embed"] = torch.rand(cfg.semantic.hidden)
    return bin_sd, w2v


@pytest.fixture(scope="module")
def files(tiny) -> dict[str, bytes]:
    bin_sd, w2v = official(tiny)
    return {"bin": _bytes(bin_sd), "v1": _bytes(official(tiny, scale=2.0)[0]), "w2v": save_safetensors(w2v)}


def assert_same(got: dict[str, torch.Tensor], model: NeuCodec, scale: float = 1.0) -> None:
    """Every tensor of `model` (times `scale`), exactly; the acoustic encoder's convs to rounding
    (weight norm unfolded and folded back)."""
    want = model.state_dict()
    assert set(got) == set(want)
    for k, v in want.items():
        v = v * scale if v.is_floating_point() else v
        if k.startswith("CodecEnc."):
            torch.testing.assert_close(got[k], v, rtol=1e-6, atol=1e-7)
        else:
            assert torch.equal(got[k], v), k


def test_release_by_name_fetches_both_repos(files, env, tiny, tmp_path):
    repos = {REPO: {"main": {WEIGHTS_FILE: files["bin"]}, "v1": {WEIGHTS_FILE: files["v1"]}},
             SEMANTIC_REPO: {"main": {SEMANTIC_FILE: files["w2v"]}}}
    with hubs(repos) as (url, h):
        env = {**env, "HF_ENDPOINT": url}
        got = _load("neucodec", env, tmp_path / "sd.pt")
        assert "error" not in got, got
        assert got["sha"] == hashlib.sha256(files["bin"] + files["w2v"]).hexdigest()
        assert got["preset"] == ["tiny"] and got["training"] is False  # inferred from the shapes
        assert_same(torch.load(tmp_path / "sd.pt"), tiny)
        assert h[REPO].gets == [f"/{REPO}/resolve/main/{WEIGHTS_FILE}"]
        assert h[SEMANTIC_REPO].gets == [f"/{SEMANTIC_REPO}/resolve/main/{SEMANTIC_FILE}"]
        # the shared cache
        assert len(list(Path(env["HF_HOME"]).rglob(f"snapshots/{COMMITS['main']}/*"))) == 2
        # A revision picks NeuCodec's file only: w2v-BERT stays at main (its repo has no v1).
        v1 = _load("neucodec", env, tmp_path / "v1.pt", preset="tiny", revision="v1")
        assert v1["sha"] == hashlib.sha256(files["v1"] + files["w2v"]).hexdigest()
        assert h[REPO].gets[-1] == f"/{REPO}/resolve/v1/{WEIGHTS_FILE}" and len(h[SEMANTIC_REPO].gets) == 1
        sd = torch.load(tmp_path / "v1.pt")
        assert torch.equal(sd["fc_post_a.weight"], 2 * tiny.fc_post_a.weight)
        assert torch.equal(sd[f"{PREFIX}feature_projection.projection.weight"],
                           tiny.semantic_model.feature_projection.projection.weight)  # from w2v-BERT's repo
        wrong = _load("neucodec", env, tmp_path / "x.pt", preset="neucodec")
        assert "not a checkpoint of preset neucodec" in wrong["error"] and \
            "fc_post_a.weight" in wrong["error"]


def test_revision_is_for_released_names(tmp_path):
    with pytest.raises(CheckpointError, match="--revision is for weights fetched"):
        load(str(tmp_path), revision="v1")


@pytest.mark.parametrize("layout", ["ours", "official", "safetensors"])
def test_folder_with_the_semantic_model_inside(tmp_path, tiny, layout):
    """A user's `torch.save(model.state_dict())` (or its safetensors), or the official layout with
    `semantic_model.*` in it (the full w2v-BERT: a layer too many, masked_spec_embed): the folder
    alone is enough."""
    bin_sd, w2v = official(tiny)
    sd = tiny.state_dict() if layout != "official" else {**bin_sd, **{PREFIX + k: v for k, v in w2v.items()}}
    name = "model.safetensors" if layout == "safetensors" else WEIGHTS_FILE
    (tmp_path / name).write_bytes(save_safetensors(dict(sd)) if layout == "safetensors" else _bytes(sd))
    if layout == "safetensors":  # a bin beside it is not read: the safetensors cannot run code
        (tmp_path / WEIGHTS_FILE).write_bytes(b"")
    model, sha = load(str(tmp_path))
    assert model.cfg == PRESETS["tiny"] and not model.training
    assert sha == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
    assert_same(model.state_dict(), tiny)


def test_folder_with_w2v_bert_beside_the_bin(tmp_path, files, tiny):
    (tmp_path / WEIGHTS_FILE).write_bytes(files["bin"])
    (tmp_path / "w2v-bert-2.0").mkdir()
    (tmp_path / "w2v-bert-2.0" / SEMANTIC_FILE).write_bytes(files["w2v"])
    want = hashlib.sha256(files["bin"] + files["w2v"]).hexdigest()
    for weights in (tmp_path, tmp_path / WEIGHTS_FILE):  # the folder, or its file
        model, sha = load(str(weights), preset="tiny")
        assert sha == want
        assert_same(model.state_dict(), tiny)


class RunsCode:
    """Unpickling this opens (creates) `path`: what a hostile checkpoint could do."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def _refusals(tiny: NeuCodec, root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (weights path, what the message says)."""
    sd = dict(tiny.state_dict())
    bin_sd, _ = official(tiny)
    cases = {
        "runs code": ({**sd, "x": RunsCode(root / "pwned")}, "refused to unpickle"),
        "missing key": ({k: v for k, v in sd.items() if k != "generator.backbone.embed.bias"},
                        "missing key generator.backbone.embed.bias"),
        "wrong shape": ({**sd, "generator.backbone.embed.bias": torch.zeros(65)},
                        "generator.backbone.embed.bias has shape (65,)"),
        "no preset fits": ({**sd, "fc_post_a.weight": torch.zeros(32, 64)}, "fits no NeuCodec preset"),
        "not tensors": ({"fc_post_a.weight": 1}, "not a state dict"),
        "no semantic model": (bin_sd, "holds no semantic model (w2v-BERT 2.0)"),
        "random bytes": (bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0),
                                              dtype=torch.uint8).tolist()), "not a torch checkpoint"),
        "empty": (b"", "not a torch checkpoint"),
    }
    out = {}
    for name, (content, says) in cases.items():
        folder = root / name.replace(" ", "_")
        folder.mkdir()
        (folder / WEIGHTS_FILE).write_bytes(content if isinstance(content, bytes) else _bytes(content))
        out[name] = (folder, says)
    (root / "bad.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    out["bad safetensors"] = (root / "bad.safetensors", "not a readable safetensors file")
    return out


REFUSALS = ["runs code", "missing key", "wrong shape", "no preset fits", "not tensors", "no semantic model",
            "random bytes", "empty", "bad safetensors"]


@pytest.mark.parametrize("case", REFUSALS)
def test_refusals_are_one_line(tmp_path, tiny, case):
    weights, says = _refusals(tiny, tmp_path)[case]
    with pytest.raises(CheckpointError) as e:
        load(str(weights))
    msg = str(e.value)
    assert says in msg and "\n" not in msg, msg
    if case == "no semantic model":
        assert f"{weights / 'w2v-bert-2.0'}/" in msg and f"{PREFIX}*" in msg
    if case == "runs code":
        assert not (tmp_path / "pwned").exists()
        torch.load(weights / WEIGHTS_FILE, weights_only=False)  # what the official loader does
        assert (tmp_path / "pwned").exists()  # so the file does run code when unpickled unsafely
