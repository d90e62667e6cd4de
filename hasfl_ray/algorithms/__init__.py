"""Federated algorithms under one protocol: HAS-FL and the paper's baselines."""

from __future__ import annotations

from typing import Dict, Type

from hasfl_ray.algorithms.base import Algorithm

ALGORITHMS = ("hasfl",)


def algorithm_class(name: str) -> Type[Algorithm]:
    """The Algorithm class registered under ``name``."""
    from hasfl_ray.algorithms.hasfl import HASFL

    registry: Dict[str, Type[Algorithm]] = {"hasfl": HASFL}
    return registry[name]


__all__ = ["ALGORITHMS", "Algorithm", "algorithm_class"]
