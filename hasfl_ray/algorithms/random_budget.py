"""Random-budget control: random time-varying widths ≤ p_i^max matched to a target average width."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.algorithms.hasfl import allocation_rule, coverage_guarantee
from hasfl_ray.algorithms.options import AllocationOptions, check_range
from hasfl_ray.errors import ConfigError
from hasfl_ray.files import read_json
from hasfl_ray.registry import finite_number, register_algorithm
from hasfl_ray.schedule import first_adapted_round, is_adaptation_round
from hasfl_ray.training.local import ClientResult
from hasfl_ray.training.seeding import STREAM_ALGORITHM, numpy_rng

logger = logging.getLogger(__name__)

#: Random factors X_i ~ Uniform(low, high), mean 1: the random stand-in for HAS-FL's H̃_i / mean H̃.
FACTOR_RANGE = (0.5, 1.5)


def budget_from_run(run_dir: str) -> float:
    """The realised post-warm-up average width of a finished run directory: ``avg_p_post_warmup`` of its
    summary.json, the rounds where HAS-FL and random-budget both adapt (``avg_p`` for a run too short to have
    any, or a summary written before the key existed)."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.lexists(path):
        raise ConfigError(f"budget_from run directory {run_dir!r} has no summary.json; expected the directory of "
                          "a finished run")
    # a FIFO, a device, JSON that is not UTF-8 or nested too deeply: one sentence (never a hang or a RecursionError)
    summary = read_json(path, "budget_from file", "a run summary with avg_p")
    avg_p = summary.get("avg_p") if isinstance(summary, dict) else None
    if isinstance(summary, dict) and summary.get("avg_p_post_warmup") is not None:
        avg_p = summary["avg_p_post_warmup"]
    if not finite_number(avg_p) or not 0 < avg_p <= 1:
        raise ConfigError(f"budget_from file {path!r} has avg_p {avg_p!r}; expected an average width in (0, 1]")
    return float(avg_p)


def default_budget(p_max: np.ndarray, p_min: float, gamma: float, coverage: bool) -> float:
    """HAS-FL's mean allocation over the federation when every estimate is equal: min(p_i^max, p_min + γ) with the
    coverage rule. A feasible budget for any federation (each width lies between the floor and p_i^max); with the
    paper's 20 clients and defaults it is 0.505, beside which HAS-FL's own post-warm-up average sits."""
    p = allocation_rule(np.ones_like(p_max), p_max, p_min, gamma, 0.0)
    return float((coverage_guarantee(p, p_max) if coverage else p).mean())


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


@dataclass
class RandomBudgetOptions(AllocationOptions):
    """random-budget's options: the target average width after warm-up (``budget``) or the run to take it from
    (``budget_from``, a finished run directory), and HAS-FL's allocation options (coverage, p_min, gamma), which set
    the default budget and whether the largest p^max keep p^max."""

    budget: Optional[float] = None  # None: budget_from's, else HAS-FL's allocation under equal estimates
    budget_from: Optional[str] = None  # a run directory whose summary.json holds avg_p_post_warmup

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget is not None:
            check_range("budget", self.budget, 0, 1, "an average width in (0, 1]", low_open=True)
        if self.budget_from is not None and (not isinstance(self.budget_from, str) or not self.budget_from):
            raise ConfigError(f"budget_from is {self.budget_from!r}; expected a directory path")


@register_algorithm("random-budget")
class RandomBudget(Algorithm):
    """HAS-FL's schedule and coverage guarantee with the allocation criterion replaced by chance.

    Allocations start at p^max and are redrawn for every client at HAS-FL's adaptation rounds (t ≥ warmup,
    t % t_adapt == 0, at the end of the round): p_i = clip(L · X_i, min p^max, p_i^max) with fresh
    X_i ~ Uniform(0.5, 1.5) from rng(seed, round), clients of the largest p^max at p^max when ``coverage``
    is on, and L solved so that the allocation's mean over all clients equals the width the rest of the
    adapted rounds need to average for the realised post-warm-up avg_p (rounds from
    :func:`first_adapted_round` on, where HAS-FL adapts too) to meet ``budget``:
    (budget · A − Σ realised) / adapted rounds left, A the run's adapted rounds. Participants are a uniform
    sample, so each round's avg_p has that mean in expectation, and the feedback cancels sampling noise.

    A budget outside what this federation can average is refused, unless it came from a run
    (``budget_from``), where it is clamped to the nearest feasible end with one warning.
    """

    options_class = RandomBudgetOptions

    @classmethod
    def resolve_config(cls, config) -> Dict[str, Any]:
        """The budget when none is given: ``budget_from``'s realised post-warm-up average width, else
        :func:`default_budget` for this many clients, dealt the width ladder's mix (the paper's tiers: their mix
        alone, whatever ``tier_counts`` says, as always; a custom ladder: its ``tier_counts`` when given)."""
        options = RandomBudgetOptions(**config.algorithm_options)
        if options.budget is not None:
            return {}
        if options.budget_from:
            budget = budget_from_run(options.budget_from)
        else:
            from hasfl_ray.data.partition import assign_tiers
            from hasfl_ray.federation import ladder_of

            ladder = ladder_of(config)
            counts = config.tier_counts if getattr(config, "widths", None) is not None else None
            p_max = assign_tiers(config.clients, np.random.default_rng(0), ladder.widths, ladder.probabilities,
                                 counts=counts)
            budget = round(default_budget(p_max, options.p_min, options.gamma, options.coverage), 4)
        return {"algorithm_options": {**config.algorithm_options, "budget": budget}}

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        if self.options.budget is None:
            raise ConfigError("budget is None; expected a resolved config (RunConfig.resolved) for random-budget")
        self.budget = float(self.options.budget)
        low, high = budget_range(self.p_max, self.options.coverage)
        if not low - 1e-9 <= self.budget <= high + 1e-9:
            if self.options.budget_from is None:
                raise ConfigError(f"budget is {self.budget!r} but random widths in this federation average between "
                                  f"{low:.4f} and {high:.4f} (mean p_max); expected a budget in that range")
            clamped = float(np.clip(self.budget, low, high))
            logger.warning("budget %.4f from %s is outside what random widths in this federation can average "
                           "(%.4f to %.4f); using %.4f", self.budget, self.options.budget_from, low, high, clamped)
            self.budget = clamped
        self.first_adapted = first_adapted_round(config.warmup, config.t_adapt)
        self.realised_sum = 0.0
        self.rounds_seen = 0
        self._allocated_mean = float(self.p_current.mean())
        self._pending_mean = self._allocated_mean

    def allocate(self, round: int, participants: Sequence[int]) -> Dict[int, float]:
        widths = super().allocate(round, participants)
        # Held until observe: a round interrupted after allocating leaves the checkpointed state untouched.
        self._pending_mean = float(np.mean(list(widths.values()))) if widths else self._allocated_mean
        return widths

    def target(self) -> float:
        """The average width the remaining adapted rounds need for the post-warm-up average to meet the budget,
        clipped to what is feasible."""
        adapted_rounds = max(self.config.rounds - self.first_adapted, 0)
        remaining = self.config.rounds - max(self.rounds_seen, self.first_adapted)
        low, high = budget_range(self.p_max, self.options.coverage)
        if remaining <= 0:
            return self.budget
        return float(np.clip((self.budget * adapted_rounds - self.realised_sum) / remaining, low, high))

    def observe(self, round: int, results: Sequence[ClientResult], aggregate: AggregateResult) -> None:
        self._allocated_mean = self._pending_mean
        used = np.mean([r.width for r in results]) if results else self._allocated_mean
        if round >= self.first_adapted:
            self.realised_sum += float(used)  # only the rounds the budget is matched over
        self.rounds_seen = round + 1
        if is_adaptation_round(round, self.config.warmup, self.config.t_adapt):
            self.p_current = random_allocation(self.factors(round), self.p_max, self.target(), self.options.coverage)

    def factors(self, round: int) -> np.ndarray:
        """The random factors X_i of the adaptation at the end of round ``round``, from rng(seed, round)."""
        return numpy_rng(self.config.seed, STREAM_ALGORITHM, round).uniform(*FACTOR_RANGE, self.num_clients)

    def set_capacities(self, round: int, p_max: np.ndarray) -> None:
        """Dynamic assignment: the round's capacities; once adapted, the last adaptation's factors X_i with the level
        L solved again for the current target under them (before: p^max, as in a fixed run)."""
        self.p_max = np.asarray(p_max, dtype=np.float64).copy()
        if round < self.first_adapted:
            self.p_current = self.p_max.copy()
            return
        last = (round - 1) // self.config.t_adapt * self.config.t_adapt  # >= the first adaptation round
        self.p_current = random_allocation(self.factors(last), self.p_max, self.target(), self.options.coverage)

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "realised_sum": self.realised_sum, "rounds_seen": self.rounds_seen,
                "allocated_mean": self._allocated_mean}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.realised_sum = float(state["realised_sum"])
        self.rounds_seen = int(state["rounds_seen"])
        self._allocated_mean = self._pending_mean = float(state["allocated_mean"])
