"""FSQ in numpy (runtime/fsq.py) against the official quantizer (vector-quantize-pytorch's
ResidualFSQ, as NeuCodec builds it), both ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vector_quantize_pytorch import ResidualFSQ

from codecport.runtime.fsq import Fsq

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
