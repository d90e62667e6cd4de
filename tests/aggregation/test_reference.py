"""The pure-torch reference aggregation against the float64 oracle with explicit masks."""

import pytest
import torch

from aggregation_cases import oracle, random_federation
from hasfl_ray.aggregation import aggregate_updates

TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-12}


def assert_matches_oracle(result, federation, dtype):
    """Δ̄ within the dtype's relative tolerance (of the largest |Δ̄|), norms within 1e-12 relative.

    Norms are compared relative to the largest norm: a client whose update equals the mean has
    ||m_i(Δ_i − Δ̄)||² at rounding-noise level (1e-31), which no two summation orders agree on.
    """
    delta, div_num, div_den, covered = oracle(federation.shapes, federation.updates, federation.weights,
                                              federation.gate_blocks, federation.offsets)
    scale = max(float(d.abs().max()) if d.numel() else 0.0 for d in delta.values()) or 1.0
    for name, expected in delta.items():
        got = result.delta[name]
        assert got.shape == expected.shape and got.dtype == dtype, name
        error = float((got.cpu().to(torch.float64) - expected).abs().max()) if got.numel() else 0.0
        assert error <= TOLERANCE[dtype] * scale, f"{name}: max error {error:.3g} (scale {scale:.3g})"
    norm_scale = max(float(div_num.max()), float(div_den.max()))
    for got, expected in ((result.div_num, div_num), (result.div_den, div_den)):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-12, atol=1e-12 * norm_scale)
    assert result.covered_fraction == pytest.approx(covered, abs=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("num_clients", [1, 2, 7, 64])
@pytest.mark.parametrize("nested", [True, False])
def test_reference_matches_oracle(dtype, num_clients, nested):
    federation = random_federation(seed=num_clients * 3 + nested, num_clients=num_clients, dtype=dtype, nested=nested)
    result = aggregate_updates(federation.shapes, federation.updates, federation.weights, federation.gate_blocks,
                               backend="reference")
    assert_matches_oracle(result, federation, dtype)


def test_uncovered_coordinates_are_zero_and_not_counted():
    shapes = {"w": (4, 3)}
    updates = [{"w": torch.ones(2, 3)}, {"w": torch.full((1, 3), 4.0)}]
    result = aggregate_updates(shapes, updates, [1.0, 3.0], backend="reference")
    expected = torch.tensor([[3.25] * 3, [1.0] * 3, [0.0] * 3, [0.0] * 3])
    torch.testing.assert_close(result.delta["w"], expected)
    assert result.covered_fraction == 0.5
    # client 0: rows 0-1; client 1: row 0
    torch.testing.assert_close(result.div_num, torch.tensor([3 * 2.25 ** 2, 3 * 0.75 ** 2], dtype=torch.float64))
    torch.testing.assert_close(result.div_den, torch.tensor([3 * 3.25 ** 2 + 3.0, 3 * 3.25 ** 2], dtype=torch.float64))
