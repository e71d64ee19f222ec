"""Qwen3-TTS tokenizer: our torch reference and our graphs against the official `qwen-tts` 0.1.1.

The official package pins transformers 4.57.3 (under transformers 5, its encoder is windowed and
its codes change), so it runs in an environment of its own: tests/data/qwen3tts-official holds
what `scripts/official_qwen3tts.py --config tiny --seed 0` wrote there (a tiny config of the
released architecture, seeded random weights in the official `save_pretrained` format) and what
the official model gave on a clip of 24311 samples (`reference-short.npz`, not a whole number of
frames) and on the same clip tiled past 300 frames (`reference-long.npz`, add `--long`):
`model.encode`'s codes, the latent, `model.decoder(codes)` on the whole clip, `tok.decode` (the
official chunks of 300 frames, 25 of context) and chunks of 25 with 72 of context."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import codecport
from codecport.codecs.qwen3tts.runtime import CHUNK, CONTEXT
from codecport.codecs.qwen3tts.weights import load
from codecport.models.streaming import StreamState

OFFICIAL = Path(__file__).parent / "data" / "qwen3tts-official"


@pytest.fixture(scope="module")
def ours():
    model, sha = load(str(OFFICIAL))
    assert len(sha) == 64
    return model


@pytest.fixture(scope="module", params=["short", "long"])
def ref(request):
    return dict(np.load(OFFICIAL / f"reference-{request.param}.npz"))


def test_official_parity_codes_latent_and_whole_clip_decode(ours, ref):
    x = torch.from_numpy(ref["audio"])[None, None]
    with torch.no_grad():
        latent = ours.encoder.latent(x)
        codes = ours.encode(x)
        audio = ours.decode(torch.from_numpy(ref["codes"]).T[None])
    assert ref["audio"].shape[0] % ours.cfg.frame_size  # the clip ends inside a frame: the padding matters
    np.testing.assert_array_equal(codes[0].T.numpy(), ref["codes"])
    assert np.abs(latent.numpy() - ref["latent"]).max() < 1e-5
    assert np.abs(audio[0, 0].numpy() - ref["decoded"]).max() < 1e-5


def test_official_parity_decoder_step_by_step(ours, ref):
    """Our decoder's explicit state, a few frames a step: the official whole-clip decode."""
    dec, codes = ours.decoder, torch.from_numpy(ref["codes"]).T[None]
    state, out = dec.zero_state(), []
    with torch.no_grad():
        for piece in codes[..., :60].split(7, -1):
            with dec.streaming(state) as st:
                out.append(dec(piece))
            state = StreamState(st.outputs, state.offset + piece.shape[-1])
    got = torch.cat(out, -1)[0, 0].numpy()
    assert np.abs(got - ref["decoded"][:got.size]).max() < 1e-5


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """`codec-export qwen3tts --weights <the official folder> --len <325 frames>`: a decoder that
    holds the official chunk and its context."""
    from cli_support import process

    hop = 480
    out = tmp_path_factory.mktemp("qwen3tts-official") / "model"
    r = process("codec-export", "qwen3tts", "--weights", OFFICIAL, "--len", (CHUNK + CONTEXT) * hop,
                "-o", out, timeout=900)
    assert r.returncode == 0, r.stderr
    return codecport.load(out)


def test_official_parity_through_the_graphs(exported, ref):
    codes = exported.encode(ref["audio"], 24000)
    np.testing.assert_array_equal(codes.data[0].T, ref["codes"])
    audio, sr = exported.decode(ref["codes"].T[None])
    assert sr == 24000 and np.abs(audio[0] - ref["decoded"]).max() < 1e-4
    official, _ = exported.decode(ref["codes"].T[None], mode="chunked")
    assert np.abs(official[0] - ref["official_decode"]).max() < 1e-4


def test_past_300_frames_the_official_decode_is_not_the_whole_clip(exported):
    """The measured gap the docs state (tiny weights here; the released model's in docs/qwen3tts.md)."""
    long = dict(np.load(OFFICIAL / "reference-long.npz"))
    assert long["codes"].shape[0] > CHUNK
    gap = np.abs(long["official_decode"] - long["decoded"]).max()
    assert gap > 1e-4  # the 25 frames of context do not hold the decoder's reach
    audio, _ = exported.decode(long["codes"].T[None])
    assert np.abs(audio[0] - long["decoded"]).max() < 1e-4 < gap


def test_the_official_layout_written_for_the_bench_is_the_official_files():
    """codec-bench's official contender gets our weights in the official layout: from what we
    loaded of the official files, `to_official` (given the official names and shapes) writes
    those files' tensors back, every one, bit for bit, and `official_config` their config."""
    import json

    from safetensors.torch import load_file

    from codecport.codecs.qwen3tts.config import PRESETS
    from codecport.codecs.qwen3tts.model import Qwen3Model
    from codecport.codecs.qwen3tts.weights import official_config, read_config, to_official, to_ours

    files = load_file(OFFICIAL / "model.safetensors")
    conf = json.loads((OFFICIAL / "config.json").read_text())
    cfg = read_config(conf, "test")
    shapes = {k: (tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in files.items()}
    back = to_official(to_ours(files, cfg, Qwen3Model(cfg), "test"), shapes, cfg)
    assert set(back) == set(files)
    assert [k for k in files if not torch.equal(back[k], files[k])] == []
    written = official_config(cfg)
    for part in ("encoder_config", "decoder_config"):
        # sliding_window: the official encoder ignores it (full causal); we write the release's.
        assert {k: v for k, v in written[part].items() if conf[part].get(k) != v} == \
            ({"sliding_window": 250} if part == "encoder_config" else {})
    assert {k: v for k, v in written.items() if not isinstance(v, dict) and conf.get(k) != v} == {}
    assert all(read_config(official_config(c), "preset") == c for c in PRESETS.values())
