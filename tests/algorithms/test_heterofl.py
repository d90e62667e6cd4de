"""HeteroFL: static p = p_max, sample or count weighting, avg_p = mean p_max of participants, full coverage."""

import numpy as np

from algorithm_runs import LEARNING_RUN, P_MAX_4, SAMPLES_4, mask_fraction, recorded_run, small_config
from hasfl_ray.algorithms.heterofl import HeteroFL


def test_widths_are_capacities_and_never_change(config4):
    algorithm = HeteroFL(small_config(algorithm="heterofl"), P_MAX_4, SAMPLES_4)
    assert algorithm.allocate(0, [0, 1, 2, 3]) == {0: 0.25, 1: 0.5, 2: 0.75, 3: 1.0}
    algorithm.observe(15, [], None)
    assert algorithm.allocate(16, [1, 2]) == {1: 0.5, 2: 0.75}


def test_sample_weighting_by_default_count_weighting_as_an_option():
    assert HeteroFL(small_config(algorithm="heterofl"), P_MAX_4, SAMPLES_4).aggregation_weights([0, 2]) == [10.0, 30.0]
    count = HeteroFL(small_config(algorithm="heterofl", heterofl_weighting="count"), P_MAX_4, SAMPLES_4)
    assert count.aggregation_weights([0, 2, 3]) == [1.0, 1.0, 1.0]


def test_the_runs_count_weighting_is_heterofls_count_and_every_algorithms():
    """``aggregation_weights: count`` (every algorithm's) and heterofl's own ``heterofl_weighting: count`` are one
    rule: 1 a client."""
    from hasfl_ray.algorithms.fullmodel import FedAvg

    run = HeteroFL(small_config(algorithm="heterofl", aggregation_weights="count"), P_MAX_4, SAMPLES_4)
    assert run.aggregation_weights([0, 2, 3]) == [1.0, 1.0, 1.0]
    assert FedAvg(small_config(algorithm="fedavg", aggregation_weights="count"), P_MAX_4,
                  SAMPLES_4).aggregation_weights([1, 3]) == [1.0, 1.0]


def test_avg_p_is_mean_capacity_of_participants_and_coverage_is_full_once_the_top_tier_trained():
    run = recorded_run(algorithm="heterofl", **LEARNING_RUN)
    p_max = run.engine.p_max
    seen_full = False
    widest = 0.0
    for widths, line in zip(run.widths, run.history):
        assert widths == {i: p_max[i] for i in widths}
        assert line["avg_p"] == np.mean([p_max[i] for i in widths])
        widest = max(widest, *widths.values())
        seen_full = seen_full or widest == 1.0
        if seen_full:  # a handful of coordinates may round their update away in float32 for a round
            assert line["frozen_fraction"] < 1e-4
        else:
            assert line["frozen_fraction"] >= 1 - mask_fraction(widest) - 1e-9
    assert seen_full and run.history[-1]["frozen_fraction"] == 0.0
