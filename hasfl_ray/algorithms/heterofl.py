"""HeteroFL (Diao et al., 2021): static width p_i = p_i^max, coordinate-wise aggregation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import register_algorithm


@dataclass
class HeteroFLOptions:
    heterofl_weighting: str = "samples"  # samples: n_i (the paper's protocol); count: HeteroFL's unweighted mean

    def __post_init__(self) -> None:
        if self.heterofl_weighting not in ("samples", "count"):
            raise ConfigError(f"heterofl_weighting is {self.heterofl_weighting!r}; expected samples or count")


@register_algorithm("heterofl")
class HeteroFL(Algorithm):
    """Every client always trains its capacity p_i^max (the base allocation, never changed).

    Aggregation is the paper's coordinate-wise mean weighted by n_i; ``heterofl_weighting="count"``
    restores HeteroFL's original unweighted mean over the clients covering each coordinate (the same as the run's
    ``aggregation_weights: count``, which every algorithm takes; this option stays for the configs that name it).
    """

    options_class = HeteroFLOptions

    def aggregation_weights(self, clients: Sequence[int]) -> List[float]:
        if self.options.heterofl_weighting == "count":
            return [1.0] * len(clients)
        return super().aggregation_weights(clients)
