"""Federated algorithms under one protocol: HAS-FL and the paper's baselines and controls, plus FedRolex."""

from __future__ import annotations

from typing import Dict, Type

from hasfl_ray.algorithms.base import Algorithm

#: Every ``--algorithm`` name (README, "Algorithms").
ALGORITHMS = ("hasfl", "heterofl", "fjord", "uniform", "random-budget", "fedavg", "fedprox", "scaffold", "fedrolex")


def algorithm_class(name: str) -> Type[Algorithm]:
    """The Algorithm class registered under ``name``."""
    from hasfl_ray.algorithms.fedrolex import FedRolex
    from hasfl_ray.algorithms.fjord import FjORD
    from hasfl_ray.algorithms.fullmodel import SCAFFOLD, FedAvg, FedProx
    from hasfl_ray.algorithms.hasfl import HASFL
    from hasfl_ray.algorithms.heterofl import HeteroFL
    from hasfl_ray.algorithms.random_budget import RandomBudget
    from hasfl_ray.algorithms.uniform import Uniform

    registry: Dict[str, Type[Algorithm]] = {cls.name: cls for cls in (
        HASFL, HeteroFL, FjORD, Uniform, RandomBudget, FedAvg, FedProx, SCAFFOLD, FedRolex)}
    return registry[name]


__all__ = ["ALGORITHMS", "Algorithm", "algorithm_class"]
