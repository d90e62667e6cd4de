"""Uniform: p = min(0.5, p_max), avg_p ≤ 0.5, and the outer half of every layer frozen at w^(0) for good."""

import numpy as np
import pytest

from algorithm_runs import LEARNING_RUN, P_MAX_4, SAMPLES_4, mask_fraction, recorded_run
from hasfl_ray.algorithms.uniform import Uniform


def test_widths_are_half_or_less(config4):
    algorithm = Uniform(config4, P_MAX_4, SAMPLES_4)
    assert algorithm.allocate(0, [0, 1, 2, 3]) == {0: 0.25, 1: 0.5, 2: 0.5, 3: 0.5}
    assert algorithm.h_tilde() is None


def test_frozen_fraction_is_positive_and_constant_once_half_width_trained():
    run = recorded_run(algorithm="uniform", **LEARNING_RUN)
    widest = 0.0
    for widths, line in zip(run.widths, run.history):
        assert line["avg_p"] <= 0.5
        assert line["avg_p"] == pytest.approx(np.mean([min(0.5, run.engine.p_max[i]) for i in widths]))
        widest = max(widest, *widths.values())
        assert line["frozen_fraction"] == pytest.approx(1 - mask_fraction(widest), abs=1e-9)
    assert widest == 0.5 and run.history[-1]["frozen_fraction"] > 0.5
