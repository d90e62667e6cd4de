"""Federated algorithms under one protocol: HAS-FL and the paper's baselines and controls, plus FedRolex.

Each built-in is one file whose class registers itself with ``@register_algorithm("name")``; importing this package
imports them (one line each below). A user's algorithm is a plug-in: ``--algorithm FILE.py:Class`` or
``MODULE:Class`` (docs/plugins.md).
"""

from __future__ import annotations

from typing import Type

from hasfl_ray.algorithms.base import Algorithm, Arrival
from hasfl_ray.registry import lookup, register_algorithm, registered

# The built-ins, in the order of the table in docs/algorithms.md: one import each registers one --algorithm name.
from hasfl_ray.algorithms import hasfl  # noqa: F401,E402
from hasfl_ray.algorithms import heterofl  # noqa: F401,E402
from hasfl_ray.algorithms import fjord  # noqa: F401,E402
from hasfl_ray.algorithms import uniform  # noqa: F401,E402
from hasfl_ray.algorithms import random_budget  # noqa: F401,E402
from hasfl_ray.algorithms import fullmodel  # noqa: F401,E402  (fedavg, fedprox, scaffold)
from hasfl_ray.algorithms import fedrolex  # noqa: F401,E402
from hasfl_ray.algorithms import fluid  # noqa: F401,E402  (FLuID's invariant dropout, issue 44)
from hasfl_ray.algorithms import depthfl  # noqa: F401,E402
from hasfl_ray.algorithms import scalefl  # noqa: F401,E402
from hasfl_ray.algorithms import fiarse  # noqa: F401,E402
from hasfl_ray.algorithms import fedgmr  # noqa: F401,E402

#: Every built-in ``--algorithm`` name (docs/algorithms.md), in registration order.
ALGORITHMS = registered("algorithm")


def algorithm_class(name: str) -> Type[Algorithm]:
    """The Algorithm class registered under ``name``, or of a plug-in spec (``FILE.py:Class``, ``MODULE:Class``)."""
    return lookup("algorithm", name)


__all__ = ["ALGORITHMS", "Algorithm", "Arrival", "algorithm_class", "register_algorithm"]
