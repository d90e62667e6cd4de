"""Checks the built-in algorithms' options dataclasses share: one sentence naming the option, its value and the range.

Each built-in declares its options the way a plug-in does (``options_class``, a dataclass whose ``__post_init__``
checks ranges; :func:`hasfl_ray.registry.check_options` has already checked each value's type). The run
configuration keeps the protocol; ``algorithm_options`` holds these, and a flat key such as ``mu: 0.5`` or
``--mu 0.5`` is routed to the algorithm that declares it (:func:`hasfl_ray.config.route_options`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import FLOAT32_MAX, MAX_LR, finite_number


def check_range(name: str, value: Any, low: float, high: float, expected: str, *, low_open: bool = False) -> None:
    """Raise ConfigError unless ``value`` is a finite number in [low, high] ((low, high] with ``low_open``)."""
    if not finite_number(value) or value > high or value < low or (low_open and value == low):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not finite_number(value):
            expected += ", and finite (not NaN or infinity; at most 3.4e+38 in size, float32's largest)"
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:20]}... ({len(repr(value))} characters)"
        raise ConfigError(f"{name} is {shown}; expected {expected}")


def check_count(name: str, value: Any, minimum: int, expected: str) -> None:
    """Raise ConfigError unless ``value`` is an integer (not a bool) of at least ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} is {value!r}; expected {expected}")


@dataclass
class AllocationOptions:
    """What HAS-FL's allocation rule p_i = min(p_i^max, p_min + γ H̃_i / (mean H̃ + ε)) and its coverage guarantee
    take; random-budget matches its default budget to the same rule."""

    coverage: bool = True  # clients of the largest p^max train at p^max (Section 3.3); false = the ablation
    p_min: float = 0.4  # base capacity
    gamma: float = 0.25  # sensitivity to H̃

    def __post_init__(self) -> None:
        if not isinstance(self.coverage, bool):
            raise ConfigError(f"coverage is {self.coverage!r}; expected true or false")
        check_range("p_min", self.p_min, 0, 1, "a width p in (0, 1]", low_open=True)
        check_range("gamma", self.gamma, 0, FLOAT32_MAX, "a number >= 0")


__all__ = ["AllocationOptions", "FLOAT32_MAX", "MAX_LR", "check_count", "check_range"]
