"""FSQ in numpy (codecs/neucodec/fsq.py) against the official quantizer (vector-quantize-pytorch's
ResidualFSQ, as NeuCodec builds it), both ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vector_quantize_pytorch import ResidualFSQ

from codecport.codecs.neucodec.fsq import Fsq

LEVELS = [4] * 8  # NeuCodec and XCodec2: 65 536 codes


@pytest.fixture(scope="module")
def official():
    q = ResidualFSQ(dim=2048, levels=LEVELS, num_quantizers=1).eval()
    with torch.no_grad():  # latents spread over every level, as a trained projection gives
        q.project_in.weight.mul_(4)
    return q


def test_indices_are_the_official_ones(official):
    fsq = Fsq(LEVELS)
    x = torch.randn(4, 500, 2048, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, want = official(x)  # [B, N, 1]
        z = official.project_in(x).numpy()
    got = fsq.indices(z)
    assert len(np.unique(got)) > 1000  # spread out: every digit of every level is exercised
    for d in range(len(LEVELS)):  # each level takes all its values
        assert len(np.unique(got // fsq.basis[d] % 4)) == 4
    np.testing.assert_array_equal(got, want[..., 0].numpy())


def test_codes_are_the_official_output_before_its_projection(official):
    fsq = Fsq(LEVELS)
    idx = np.random.default_rng(1).integers(0, fsq.size, (3, 40))
    with torch.no_grad():
        want = official.get_output_from_indices(torch.from_numpy(idx)[..., None])
        got = official.project_out(torch.from_numpy(fsq.codes(idx)))
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert fsq.codes(np.arange(fsq.size)).min() == -1 and fsq.codes(np.arange(fsq.size)).max() == 0.5


def test_bad_levels_and_shapes_are_refused():
    with pytest.raises(ValueError, match="levels"):
        Fsq([4, 1])
    with pytest.raises(ValueError, match="takes"):
        Fsq(LEVELS).indices(np.zeros((3, 7), np.float32))


# ---- the graphs' FSQ (codecs/neucodec/ingraph.py): what the browser and in-graph folders run ----------
def test_rounding_from_floor_is_torch_round():
    """Half to even without ONNX's Round (WebGPU has none), ties and their neighbours included."""
    from codecport.codecs.neucodec.ingraph import round_half_even

    halves = np.arange(-8, 8, dtype=np.float32) + np.float32(0.5)
    x = np.concatenate([halves, np.nextafter(halves, np.float32(-9)), np.nextafter(halves, np.float32(9)),
                        np.random.default_rng(0).uniform(-3, 3, 10_000).astype(np.float32), [-0.0, 0.0]])
    t = torch.from_numpy(x.astype(np.float32))
    torch.testing.assert_close(round_half_even(t), torch.round(t), atol=0, rtol=0)


@pytest.mark.parametrize("levels", [LEVELS, [8, 5, 5, 5], [7, 5, 5, 5, 5], [4, 4, 4]])
def test_graph_fsq_is_the_numpy_fsq_for_every_code(levels):
    """Every code's levels from float32 Floor arithmetic, and latents' codes, bit for bit."""
    from codecport.codecs.neucodec.ingraph import FsqOps

    fsq, ops = Fsq(levels), FsqOps(levels)
    every = np.arange(fsq.size, dtype=np.int32)
    z = (np.random.default_rng(2).standard_normal((20_000, len(levels))) * 2).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_array_equal(ops.levels(torch.from_numpy(every)).numpy(), fsq.codes(every))
        got = ops.indices(torch.from_numpy(z)).numpy()
    assert got.dtype == np.int32 and len(np.unique(got)) > min(fsq.size, 20_000) // 4
    np.testing.assert_array_equal(got, fsq.indices(z))
