"""Uniform: p_i = min(0.5, p_i^max) for every client, no coverage guarantee (the paper's collapsing baseline)."""

from __future__ import annotations

import numpy as np

from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.registry import register_algorithm

#: The uniform width cap of the paper's baseline.
UNIFORM_WIDTH = 0.5


@register_algorithm("uniform")
class Uniform(Algorithm):
    """Static p_i = min(0.5, p_i^max). No client ever trains beyond the leading half of a layer, so the
    rest stays at its initialisation (Proposition 1): frozen_fraction stays above zero for the whole run.
    """

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        self.p_current = self.capacity_allocation(self.p_max)

    def capacity_allocation(self, p_max: np.ndarray) -> np.ndarray:
        return np.minimum(UNIFORM_WIDTH, p_max)
