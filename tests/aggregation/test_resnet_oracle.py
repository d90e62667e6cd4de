"""The fused kernel aggregates the width-sliced ResNets (docs/models.md) as the float64 oracle defines: every layer
type they have (convs with and without a scaled input, 1x1 shortcuts, BatchNorm and GroupNorm weight and bias, the
classifier's weight and its unscaled bias), at HeteroFL's levels, as leading slices and as FedRolex's windows."""

import numpy as np
import pytest
import torch

from aggregation_cases import oracle
from hasfl_ray.aggregation import aggregate_updates
from hasfl_ray.aggregation.windows import aggregate_windows
from hasfl_ray.models.resnet import RESNETS
from hasfl_ray.models.slicing import extract_window
from hasfl_ray.ops import aggregate as ops

pytestmark = pytest.mark.skipif(not ops.available(), reason="needs hasfl_ray._C built")

LEVELS = [1.0, 0.5, 0.25, 0.125, 0.0625]


def federation(arch: str, norm: str, seed: int, num_clients: int = 7):
    specs = RESNETS[arch](in_channels=3, num_classes=10, image_size=8, norm=norm, stages=(16, 32, 32, 64)).param_specs()
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    widths = rng.choice(LEVELS, size=num_clients)
    updates = [{name: torch.randn(spec.sliced_shape(p), generator=generator) for name, spec in specs.items()}
               for p in widths]
    weights = rng.integers(10, 500, num_clients).tolist()
    return specs, widths, updates, weights


def assert_close_to_oracle(result, expected):
    delta, div_num, div_den, covered = expected
    for name, mean in delta.items():
        torch.testing.assert_close(result.delta[name].double(), mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.div_num.double(), div_num, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(result.div_den.double(), div_den, rtol=1e-5, atol=1e-6)
    assert result.covered_fraction == pytest.approx(covered, abs=1e-12)


@pytest.mark.parametrize("arch, norm", [("preresnet18", "sbn"), ("resnet18", "gn")])
def test_fused_kernel_aggregates_resnets_like_the_oracle(arch, norm):
    specs, _, updates, weights = federation(arch, norm, seed=11)
    names = {name.rsplit(".", 2)[-2] + "." + name.rsplit(".", 1)[-1] for name in specs}
    assert {"conv1.weight", "shortcut.weight", "n1.weight", "n1.bias", "linear.weight", "linear.bias"} <= names
    shapes = {name: spec.shape for name, spec in specs.items()}
    fused = aggregate_updates(shapes, updates, weights, backend="fused")
    assert_close_to_oracle(fused, oracle(shapes, updates, weights))


def test_fused_kernel_aggregates_fedrolex_resnet_windows_like_the_oracle():
    specs, widths, _, weights = federation("preresnet18", "sbn", seed=12, num_clients=5)
    full = {name: torch.randn(spec.shape, generator=torch.Generator().manual_seed(3)) for name, spec in specs.items()}
    offset = 13  # one window position for the round (FedRolex), wrapping round the 16-channel stage
    updates = [{name: extract_window(full[name], spec, p, offset) * (i + 1) for name, spec in specs.items()}
               for i, p in enumerate(widths)]
    shapes = {name: spec.shape for name, spec in specs.items()}
    per_dim = [{name: tuple(offset % d.channels if d.scaled else 0 for d in spec.dims) for name, spec in specs.items()}
               for _ in updates]
    fused = aggregate_windows(specs, updates, [offset] * len(updates), weights, backend="fused")
    assert_close_to_oracle(fused, oracle(shapes, updates, weights, offsets=per_dim))
