"""The width-aware clock prices a depth sub-model (issue 44 item 1c) from what it holds and trains."""

from __future__ import annotations

from hasfl_ray.clock.cost import BYTES_PER_PARAM, TRAIN_FACTOR, WidthCosts, base_cost
from hasfl_ray.models import MODEL_CONFIGS, build_model, register_model
from hasfl_ray.models.depth import depth_names


def test_a_depth_client_moves_its_held_parameters_and_trains_its_exits():
    register_model("cifar10+exits", dict(MODEL_CONFIGS["cifar10"], exits=True))
    costs = WidthCosts("cifar10+exits")
    full = build_model("cifar10+exits")
    specs = full.param_specs()
    for depth in (1, 2, 3):
        for width in (1.0, 0.5):
            held = sum(specs[n].numel(width) for n in depth_names(full, depth))
            assert costs.params(width, depth) == held
            assert costs.macs(width, depth) == build_model("cifar10+exits", 1.0, depth).macs(width)
            cost = base_cost(costs, width, samples=70, batch_size=32, epochs=1, depth=depth)
            assert cost.bytes_up == cost.bytes_down == BYTES_PER_PARAM * held
            assert list(cost.step_macs) == [TRAIN_FACTOR * costs.macs(width, depth) * b for b in (32, 32, 6)]
    assert costs.params(1.0, 3) == costs.params(1.0)  # the deepest is the whole model with exits
    assert costs.macs(1.0, 1) < costs.macs(1.0, 2) < costs.macs(1.0, 3) == costs.macs(1.0)
    assert costs.params(0.5, 1) < costs.params(1.0, 1) < costs.params(0.5, 3)
