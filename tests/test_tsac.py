"""TSAC's variant of DAC (`channels=2, snake="tsac"`): a stereo stem, both channels in one graph,
and the decoder's Snake with alpha indexed by the flat channel-major position (TSAC's `snake_s`).

The formula is checked against a numpy implementation written from its statement, and the
exported decoder against the torch model whose flat Snakes are swapped for that numpy code: the
graph's way of holding alpha (one period, not the whole length) is not what the check runs."""

from __future__ import annotations

import copy
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from cli_support import invoke
from support import noise
from test_dac_model import _official_state

import codecport
from codecport.codecs.dac.config import DacConfig
from codecport.codecs.dac.export import export_dac
from codecport.codecs.dac.model import DAC, PRESETS, init_random
from codecport.codecs.dac.weights import load_dac
from codecport.errors import ConfigError, ExportError
from codecport.export.builds import Build
from codecport.models.layers import Snake


def snake_s(x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """TSAC's snake on one `[C, T]` buffer, element by element: alpha at the flat position
    `(c*T + t) mod len(alpha)`, clamped to 1e-6."""
    c, t = x.shape
    out = np.empty_like(x, dtype=np.float64)
    for ci in range(c):
        for ti in range(t):
            a = max(float(alpha[(ci * t + ti) % len(alpha)]), 1e-6)
            out[ci, ti] = x[ci, ti] + np.sin(a * x[ci, ti]) ** 2 / a
    return out


def snake_s_vectorised(x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """The same for `[B, C, T]`, with numpy's own indexing (fast enough for a whole decoder)."""
    _, c, t = x.shape
    a = np.maximum(alpha[(np.arange(c)[:, None] * t + np.arange(t)[None, :]) % len(alpha)], 1e-6)
    return x + np.sin(a * x) ** 2 / a


@pytest.mark.parametrize("t", [1, 5, 7, 16, 50])  # shorter than, equal to, past one period (7)
def test_flat_snake_is_the_formula(t):
    g = torch.Generator().manual_seed(t)
    snake = Snake(7, flat=True)
    with torch.no_grad():
        snake.alpha.copy_(torch.rand(1, 7, 1, generator=g) * 2 - 0.3)
        snake.alpha[0, 2, 0] = -0.5  # below 1e-6: the clamp
        x = torch.randn(2, 7, t, generator=g)
        got = snake(x).numpy()
    alpha = snake.alpha.detach().numpy().reshape(-1)
    assert (alpha < 1e-6).any()
    for b in range(2):
        np.testing.assert_allclose(got[b], snake_s(x[b].numpy(), alpha), rtol=1e-5, atol=1e-5)
    # Not DAC's Snake: the same alpha per channel gives another result.
    plain = Snake(7)
    with torch.no_grad():
        plain.alpha.copy_(snake.alpha)
        assert not torch.allclose(plain(x), snake(x), atol=1e-3)


class _NumpySnake(torch.nn.Module):
    def __init__(self, alpha: np.ndarray):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(
            snake_s_vectorised(x.numpy().astype(np.float64), self.alpha).astype(np.float32))


@pytest.fixture(scope="module")
def tsac(tmp_path_factory):
    model = init_random(DAC(PRESETS["tiny-tsac"]), seed=2).eval()
    with torch.no_grad():  # alphas spread out (some clamped) so the flat indexing shows
        for m in model.decoder.modules():
            if isinstance(m, Snake):
                m.alpha.copy_(torch.rand(m.alpha.shape,
                                         generator=torch.Generator().manual_seed(m.alpha.numel())) * 2)
    out = tmp_path_factory.mktemp("tsac") / "model"
    report = export_dac(model, out, 1200, 600, preset="tiny-tsac", weights="random", weights_sha256="none")
    return model, out, report


def test_the_decoder_graph_is_the_formula_at_every_layer(tsac):
    model, out, _ = tsac
    ref = copy.deepcopy(model)
    swapped = 0
    for _name, m in list(ref.decoder.named_modules()):
        for child_name, child in list(m.named_children()):
            if isinstance(child, Snake):
                assert child.flat
                setattr(m, child_name, _NumpySnake(child.alpha.detach().numpy().reshape(-1)))
                swapped += 1
    assert swapped == 1 + 7 * len(PRESETS["tiny-tsac"].decoder_rates)  # the last + each block's
    # TSAC's encoder is DAC's
    assert not any(isinstance(m, Snake) and m.flat for m in model.encoder.modules())
    sess = ort.InferenceSession(str(out / "decoder.onnx"), providers=["CPUExecutionProvider"])
    latent = sess.get_inputs()[0]
    assert sess.get_outputs()[0].shape[:2] == [1, 2]  # both channels out of one call
    z = np.random.default_rng(0).standard_normal(latent.shape).astype(np.float32)
    with torch.no_grad():
        want = ref.decoder(torch.from_numpy(z)).numpy()
    np.testing.assert_allclose(sess.run(None, {latent.name: z})[0], want, atol=1e-4)


def test_graphs_take_both_channels_and_say_so(tsac):
    _, out, report = tsac
    for name in ("encoder", "encoder_chunked"):
        g = onnx.load(out / f"{name}.onnx")
        dims = [d.dim_value for d in g.graph.input[0].type.tensor_type.shape.dim]
        assert dims[:2] == [1, 2], name
        meta = {p.key: p.value for p in g.metadata_props}
        assert (meta["channels"], meta["snake"]) == ("2", "tsac")
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["channels"], manifest["snake"]) == ("2", "tsac")
    assert report["validation"]["decoder_chunked"]["audio_max_abs_err"] <= 1e-4


@pytest.mark.parametrize("mode", ["fixed", "chunked", "whole"])
def test_stereo_in_one_row_of_codes_and_back(tsac, mode):
    model, out, _ = tsac
    codec = codecport.load(out)
    assert codec.channels_per_row == 2
    n = 1200 if mode == "fixed" else 3001
    x = noise(n, channels=2, seed=5)
    codes = codec.encode(x, 16000, mode=mode)
    assert codes.data.shape[0] == 1  # one row of codes for the two channels
    audio, sr = codec.decode(codes)
    assert audio.shape == (2, n) and sr == 16000
    if mode == "fixed":
        with torch.no_grad():
            want = model.encode(torch.from_numpy(x)[None]).numpy()
        np.testing.assert_array_equal(codes.data, want)


def test_mono_input_is_refused_in_one_line(tsac, tmp_path):
    import soundfile as sf

    _, out, _ = tsac
    wav = tmp_path / "mono.wav"
    sf.write(wav, noise(3000, seed=1)[0], 16000)
    r = invoke("codec-run", "encode", "-m", out, wav, "-o", tmp_path / "codes.dac")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "codes 2 channels at once" in r.stderr and "ffmpeg -ac 2" in r.stderr
    assert not (tmp_path / "codes.dac").exists()
    stereo = tmp_path / "stereo.wav"
    sf.write(stereo, noise(3000, channels=2, seed=1).T, 16000)
    r = invoke("codec-run", "encode", "-m", out, stereo, "-o", tmp_path / "codes.dac")
    assert r.returncode == 0 and "2 ch x 3000 samples" in r.stdout


def test_config_kwargs_and_a_tsac_checkpoint(tmp_path):
    # The official DAC takes neither key: its kwargs stay as they were.
    assert "channels" not in PRESETS["44khz"].to_kwargs() and "snake" not in PRESETS["tiny"].to_kwargs()
    cfg = PRESETS["tiny-tsac"]
    assert DacConfig.from_kwargs(cfg.to_kwargs()) == cfg
    with pytest.raises(ConfigError, match="snake must be one of"):
        DacConfig(snake="bigvgan")
    with pytest.raises(ConfigError, match="channels"):
        DacConfig(channels=0)
    # A checkpoint in DAC's format whose kwargs say TSAC loads as TSAC, weights and all.
    model = init_random(DAC(cfg), seed=3).eval()
    path = tmp_path / "tsac.pth"
    torch.save({"state_dict": _official_state(model, "legacy"),
                "metadata": {"kwargs": cfg.to_kwargs()}}, path)
    loaded, _ = load_dac(str(path))
    assert loaded.cfg == cfg
    x = torch.from_numpy(noise(600, channels=2, seed=4))[None]
    with torch.no_grad():
        torch.testing.assert_close(loaded.decode(loaded.encode(x)), model.decode(model.encode(x)),
                                   atol=1e-5, rtol=0)


def test_web_target_refuses_a_stereo_model(tmp_path):
    model = init_random(DAC(PRESETS["tiny-tsac"]), seed=0).eval()
    with pytest.raises(ExportError, match="one channel a call"):
        export_dac(model, tmp_path / "web", 1200, preset="tiny-tsac", weights="random", weights_sha256="none",
                   build=Build(target="web"))
    assert not (tmp_path / "web").exists()
