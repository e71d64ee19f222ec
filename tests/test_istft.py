"""The Vocos inverse STFT as a graph (codecs/neucodec/istft.py): the official computation's numbers, and a
graph of plain ops (no DFT, no ConvTranspose) that every target takes whole."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from codecport.codecs.neucodec.istft import IstftSame
from codecport.export.check import check_graph
from codecport.export.graph import GraphSpec, Tensor, static_check, to_onnx


def _spec(t: int, n_fft: int, hop: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    f = n_fft // 2 + 1
    # Vocos heads: exp of a linear output, clipped at 100; any phase.
    mag = torch.exp(torch.randn(2, f, t, generator=g) * 2).clamp(max=100)
    phase = torch.randn(2, f, t, generator=g) * 4
    return mag, phase


@pytest.mark.parametrize(("n_fft", "hop", "t"), [(1920, 480, 50), (1280, 320, 13), (16, 4, 1), (24, 4, 5)])
def test_graph_form_is_the_official_istft(n_fft, hop, t):
    """NeuCodec (1920 / 480), XCodec2 (1280 / 320), one frame, and 6x overlap."""
    m = IstftSame(n_fft, hop)
    mag, phase = _spec(t, n_fft, hop, seed=t)
    got, want = m(mag, phase), m.reference(mag, phase)
    assert got.shape == want.shape == (2, t * hop)
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-5 * max(1.0, scale), scale


def test_the_reference_is_torch_istft_inside_the_trim():
    """Away from the edges, "same" padding only shifts torch.istft(center=True): the reference
    (and so the graph) is the inverse STFT itself there, not a look-alike."""
    n_fft, hop, t = 64, 16, 20
    m = IstftSame(n_fft, hop)
    mag, phase = _spec(t, n_fft, hop, seed=3)
    spec = mag * (torch.cos(phase) + 1j * torch.sin(phase))
    centred = torch.istft(spec, n_fft, hop, n_fft, torch.hann_window(n_fft), center=True)  # [B, (t-1)*hop]
    ours = m(mag, phase)
    # centre=True trims n_fft/2 from the front, "same" (n_fft - hop)/2: ours is hop/2 later.
    shift = (n_fft // 2) - (n_fft - hop) // 2
    inner = slice(n_fft, (t - 1) * hop - n_fft)
    torch.testing.assert_close(ours[:, inner.start + shift:inner.stop + shift], centred[:, inner],
                               atol=1e-5, rtol=1e-5)


class _Head(torch.nn.Module):
    def __init__(self, m: IstftSame):
        super().__init__()
        self.m = m

    def forward(self, mag, phase):
        return self.m(mag, phase)


def test_the_graph_is_plain_ops_every_target_takes_whole(tmp_path):
    n_fft, hop, t = 1920, 480, 25  # NeuCodec's head, half a second
    m = IstftSame(n_fft, hop)
    f = n_fft // 2 + 1
    spec = GraphSpec("istft", _Head(m),
                     [Tensor("mag", (1, f, t), "float32"), Tensor("phase", (1, f, t), "float32")],
                     [Tensor("audio", (1, t * hop), "float32")])
    model = to_onnx(spec)
    static_check(model, spec)  # static shapes, no ConvTranspose, no Conv pads
    ops = {n.op_type for n in model.graph.node}
    assert not ops & {"DFT", "STFT", "ConvTranspose", "Conv"} and "MatMul" in ops
    path = tmp_path / "istft.onnx"
    onnx.save(model, str(path))
    eps = check_graph(path)["eps"]
    for ep in ("coreml-mlprogram", "directml", "wasm", "webgpu"):
        assert eps[ep]["full"], (ep, eps[ep])
    mag, phase = _spec(t, n_fft, hop, seed=9)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"mag": mag[:1].numpy(), "phase": phase[:1].numpy()})[0]
    want = m.reference(mag[:1], phase[:1]).numpy()
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
