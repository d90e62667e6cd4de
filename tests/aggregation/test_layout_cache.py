"""The layout cache of the fused path: repeat rounds skip build_layout, and bad input is still named."""

import pytest
import torch

from aggregation_cases import random_federation
from hasfl_ray.aggregation import aggregate_updates
from hasfl_ray.ops import aggregate as ops
from test_reference import assert_matches_oracle

pytestmark = pytest.mark.skipif(not ops.available(), reason="needs hasfl_ray._C built")


@pytest.fixture(autouse=True)
def empty_cache():
    ops.layout_cache.clear()
    yield
    ops.layout_cache.clear()


def args_of(federation):
    return federation.shapes, federation.updates, federation.weights, federation.gate_blocks


def fresh_values(federation, seed):
    """The same shapes with new values: what the next round with the same tiers looks like."""
    generator = torch.Generator().manual_seed(seed)
    federation.updates = [{name: torch.randn(t.shape, generator=generator, dtype=t.dtype) for name, t in u.items()}
                          for u in federation.updates]
    return federation


def test_repeat_round_hits_the_cache_and_matches_the_oracle():
    federation = random_federation(seed=21, num_clients=9, dtype=torch.float64)
    first = aggregate_updates(*args_of(federation), backend="fused")
    assert len(ops.layout_cache) == 1 and ops.layout_cache.hits == 0
    assert_matches_oracle(first, federation, torch.float64)
    fresh_values(federation, seed=22)
    second = aggregate_updates(*args_of(federation), backend="fused")
    assert ops.layout_cache.hits == 1
    assert_matches_oracle(second, federation, torch.float64)
    # bit-identical to the uncached path
    uncached = ops.aggregate_fused(federation.shapes, federation.updates, torch.tensor(federation.weights,
                                   dtype=torch.float64), federation.gate_blocks, use_cache=False)
    for name in federation.shapes:
        assert torch.equal(second.delta[name], uncached.delta[name])
    assert torch.equal(second.div_num, uncached.div_num) and torch.equal(second.div_den, uncached.div_den)


def test_cache_keeps_no_tensors_and_is_bounded():
    federation = random_federation(seed=23, num_clients=4)
    aggregate_updates(*args_of(federation), backend="fused")
    (layout,) = ops.layout_cache._layouts.values()
    assert layout.packed == [] and len(layout.flat_index) == len(layout.entries)
    cache = ops.LayoutCache(size=2)
    for key in "abc":
        cache.put(key, layout)
    assert len(cache) == 2 and cache.get("a") is None and cache.get("c") is not None


def test_other_shapes_or_names_miss():
    federation = random_federation(seed=24, num_clients=5)
    aggregate_updates(*args_of(federation), backend="fused")
    name = next(n for n in federation.updates[1])
    del federation.updates[1][name]
    result = aggregate_updates(*args_of(federation), backend="fused")
    assert ops.layout_cache.hits == 0 and len(ops.layout_cache) == 2
    assert_matches_oracle(result, federation, torch.float32)


def test_offsets_are_part_of_the_key():
    federation = random_federation(seed=25, num_clients=4, rolling=True, nested=False)
    shapes, updates, weights, blocks = args_of(federation)
    weights = torch.tensor(weights, dtype=torch.float64)
    ops.aggregate_fused(shapes, updates, weights, blocks, offsets=federation.offsets)
    unrolled = ops.aggregate_fused(shapes, updates, weights, blocks)
    assert ops.layout_cache.hits == 0 and len(ops.layout_cache) == 2
    federation.offsets = None
    assert_matches_oracle(unrolled, federation, torch.float32)


def good_round():
    shapes = {"w": (4, 3), "b": (4,)}
    return shapes, [{"w": torch.randn(2, 3), "b": torch.randn(2)}, {"w": torch.randn(4, 3), "b": torch.randn(4)}]


@pytest.mark.parametrize("spoil,error,argument", [
    (lambda u: u[1].__setitem__("w", torch.randn(3, 4).t()), ValueError, "updates[1]['w']"),
    (lambda u: u[1].__setitem__("b", torch.randn(4, dtype=torch.float64)), TypeError, "updates[1]['b']"),
    (lambda u: u[0].__setitem__("b", torch.zeros(2, dtype=torch.int64)), TypeError, "updates[0]['b']"),
    (lambda u: u[1].__setitem__("b", torch.zeros(4, device="meta")), ValueError, "updates[1]['b']"),
    (lambda u: u[0].__setitem__("w", [[0.0] * 3] * 2), TypeError, "updates[0]['w']"),
])
def test_bad_input_after_a_cached_round_is_still_named(spoil, error, argument):
    shapes, updates = good_round()
    aggregate_updates(shapes, updates, [1.0, 2.0], backend="fused")
    spoil(updates)
    with pytest.raises(error) as raised:
        aggregate_updates(shapes, updates, [1.0, 2.0], backend="fused")
    assert argument in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("weights", [[1.0, float("nan")], [1.0], [0.0, 1.0], [-1.0, 1.0], [1.0, float("inf")]])
def test_bad_weights_after_a_cached_round_are_named(weights):
    shapes, updates = good_round()
    aggregate_updates(shapes, updates, [1.0, 2.0], backend="fused")
    with pytest.raises(ValueError, match="weights"):
        aggregate_updates(shapes, updates, weights, backend="fused")


def test_signature_is_none_unless_plainly_well_formed():
    shapes, updates = good_round()
    assert ops.signature(shapes, updates, None) is not None
    for spoil in (lambda u: u[1].__setitem__("b", torch.zeros(4, dtype=torch.float64)),  # two dtypes
                  lambda u: u[1].__setitem__("b", torch.zeros(4, device="meta")),  # two devices
                  lambda u: u[0].__setitem__("b", torch.zeros(2, dtype=torch.int32)),  # not float
                  lambda u: u[0].__setitem__("w", [[0.0] * 3] * 2),  # not a tensor
                  lambda u: u.__setitem__(0, torch.zeros(3))):  # not a mapping
        spoiled = [dict(u) for u in updates]
        spoil(spoiled)
        assert ops.signature(shapes, spoiled, None) is None
    assert ops.signature(shapes, [{}, {}], None) is None
