"""The league's shared coordinate-wise mean over the clients holding each coordinate, against a float64 loop."""

import pytest
import torch

from hasfl_ray.algorithms.league.common import masked_mean
from hasfl_ray.errors import ConfigError


def test_masked_mean_is_the_weighted_mean_over_holders_and_the_base_elsewhere():
    torch.manual_seed(0)
    base = torch.randn(5, 2)
    values = [torch.randn(5, 2) for _ in range(3)]
    masks = [torch.rand(5, 2) > 0.5 for _ in range(3)]
    for m in masks:
        m[4, 1] = False
    weights = [3.0, 0.0, 2.5]  # a zero weight holds nothing
    got = masked_mean(base, values, masks, weights)
    assert got.dtype == torch.float64
    for r in range(5):
        for c in range(2):
            den = sum(w for m, w in zip(masks, weights) if m[r, c])
            num = sum(w * float(v[r, c]) for v, m, w in zip(values, masks, weights) if m[r, c])
            assert float(got[r, c]) == pytest.approx(num / den if den else float(base[r, c]), rel=1e-12)


def test_values_outside_a_mask_are_ignored_even_when_not_finite():
    got = masked_mean(torch.zeros(2), [torch.tensor([1.0, float("nan")])], [torch.tensor([True, False])])
    assert got.tolist() == [1.0, 0.0]


def test_counts_that_do_not_match_are_refused_in_one_sentence():
    with pytest.raises(ConfigError, match="2 client tensors came with 1 masks for w; expected one mask per client"):
        masked_mean(torch.zeros(2), [torch.zeros(2)] * 2, [torch.ones(2, dtype=torch.bool)], name="w")
    with pytest.raises(ConfigError, match="a client's weight for w is -1.0; expected a number >= 0"):
        masked_mean(torch.zeros(2), [torch.zeros(2)], [torch.ones(2, dtype=torch.bool)], [-1.0], name="w")
