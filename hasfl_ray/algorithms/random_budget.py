"""Random-budget control: random time-varying widths ≤ p_i^max matched to a target average width."""

from __future__ import annotations

from typing import Any, Dict, Sequence, Tuple

import numpy as np

from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.algorithms.hasfl import coverage_guarantee
from hasfl_ray.errors import ConfigError
from hasfl_ray.training.local import ClientResult
from hasfl_ray.training.seeding import STREAM_ALGORITHM, numpy_rng

#: Random factors X_i ~ Uniform(low, high), mean 1: the random stand-in for HAS-FL's H̃_i / mean H̃.
FACTOR_RANGE = (0.5, 1.5)


def random_allocation(factors: np.ndarray, p_max: np.ndarray, target: float, coverage: bool,
                      iterations: int = 60) -> np.ndarray:
    """Widths p_i = clip(L · X_i, min_j p_j^max, p_i^max), with the level L set so that mean_i p_i = target.

    With ``coverage`` the clients of the largest p^max get p^max (HAS-FL's guarantee), as in
    :func:`hasfl_ray.algorithms.hasfl.coverage_guarantee`. The mean is non-decreasing and continuous in
    L, so bisection finds it; a target outside :func:`budget_range` gives that range's nearest end.
    """
    floor = np.minimum(p_max, p_max.min())

    def widths(level: float) -> np.ndarray:
        p = np.clip(level * factors, floor, p_max)
        return coverage_guarantee(p, p_max) if coverage else p

    low, high = 0.0, float(np.max(p_max / factors))
    if widths(high).mean() <= target:
        return widths(high)
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        if widths(middle).mean() < target:
            low = middle
        else:
            high = middle
    return widths(high)


def budget_range(p_max: np.ndarray, coverage: bool) -> Tuple[float, float]:
    """The smallest and largest average width :func:`random_allocation` can give this federation."""
    floor = np.minimum(p_max, p_max.min())
    lowest = coverage_guarantee(floor, p_max) if coverage else floor
    return float(lowest.mean()), float(p_max.mean())


class RandomBudget(Algorithm):
    """HAS-FL's schedule and coverage guarantee with the allocation criterion replaced by chance.

    Allocations start at p^max and are redrawn for every client at HAS-FL's adaptation rounds (t ≥ warmup,
    t % t_adapt == 0, at the end of the round): p_i = clip(L · X_i, min p^max, p_i^max) with fresh
    X_i ~ Uniform(0.5, 1.5) from rng(seed, round), clients of the largest p^max at p^max when ``coverage``
    is on, and L solved so that the allocation's mean over all clients equals the width the rest of the
    run needs to average for the realised avg_p to meet ``budget``: (budget · T − Σ realised) / rounds
    left. Participants are a uniform sample, so each round's avg_p has that mean in expectation, and the
    feedback cancels the warm-up rounds at p^max and sampling noise.
    """

    name = "random-budget"

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        if config.budget is None:
            raise ConfigError("budget is None; expected a resolved config (RunConfig.resolved) for random-budget")
        self.budget = float(config.budget)
        low, high = budget_range(self.p_max, config.coverage)
        if not low - 1e-9 <= self.budget <= high + 1e-9:
            raise ConfigError(f"budget is {self.budget!r} but random widths in this federation average between "
                              f"{low:.4f} and {high:.4f} (mean p_max); expected a budget in that range")
        self.realised_sum = 0.0
        self.rounds_seen = 0
        self._allocated_mean = float(self.p_current.mean())

    def is_adaptation_round(self, round: int) -> bool:
        return round >= self.config.warmup and round % self.config.t_adapt == 0

    def allocate(self, round: int, participants: Sequence[int]) -> Dict[int, float]:
        widths = super().allocate(round, participants)
        self._allocated_mean = float(np.mean(list(widths.values()))) if widths else self._allocated_mean
        return widths

    def target(self) -> float:
        """The average width the remaining rounds need for the run to meet the budget, clipped to what is feasible."""
        remaining = self.config.rounds - self.rounds_seen
        low, high = budget_range(self.p_max, self.config.coverage)
        if remaining <= 0:
            return self.budget
        return float(np.clip((self.budget * self.config.rounds - self.realised_sum) / remaining, low, high))

    def observe(self, round: int, results: Sequence[ClientResult], aggregate: AggregateResult) -> None:
        used = np.mean([r.width for r in results]) if results else self._allocated_mean
        self.realised_sum += float(used)
        self.rounds_seen = round + 1
        if self.is_adaptation_round(round):
            factors = numpy_rng(self.config.seed, STREAM_ALGORITHM, round).uniform(*FACTOR_RANGE, self.num_clients)
            self.p_current = random_allocation(factors, self.p_max, self.target(), self.config.coverage)

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "realised_sum": self.realised_sum, "rounds_seen": self.rounds_seen,
                "allocated_mean": self._allocated_mean}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.realised_sum = float(state["realised_sum"])
        self.rounds_seen = int(state["rounds_seen"])
        self._allocated_mean = float(state["allocated_mean"])
