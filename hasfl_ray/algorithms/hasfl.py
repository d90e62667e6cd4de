"""HAS-FL (Algorithm 1): masked divergence estimator, EMA, periodic normalisation, allocation, coverage guarantee."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

import numpy as np

from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.algorithms.options import FLOAT32_MAX, AllocationOptions, check_count, check_range
from hasfl_ray.registry import register_algorithm
from hasfl_ray.schedule import first_adapted_round, is_adaptation_round
from hasfl_ray.training.local import ClientResult


def allocation_rule(h_tilde: np.ndarray, p_max: np.ndarray, p_min: float, gamma: float, epsilon: float) -> np.ndarray:
    """p_i = min(p_i^max, p_min + γ · H̃_i / (mean_j H̃_j + ε)) for every client (Definition 2)."""
    return np.minimum(p_max, p_min + gamma * h_tilde / (h_tilde.mean() + epsilon))


def coverage_guarantee(p: np.ndarray, p_max: np.ndarray) -> np.ndarray:
    """Clients whose p^max equals the federation's largest p^max train at p^max (Section 3.3)."""
    out = p.copy()
    top = p_max == p_max.max()
    out[top] = p_max[top]
    return out


@dataclass
class HASFLOptions(AllocationOptions):
    """HAS-FL's options (the paper's defaults): the allocation rule's (coverage, p_min, gamma), the EMA factor β,
    the normalisation interval T_norm and ε. The adaptation schedule (warmup, t_adapt) and the divergence
    estimator are the protocol's: the run config keeps them."""

    beta: float = 0.9  # EMA H̃_i ← βH̃_i + (1−β)Ĥ_i
    t_norm: int = 20  # rescale H̃ to mean 1 after the adaptation of every round t > 0 with t % t_norm == 0
    epsilon: float = 1e-8  # in Ĥ_i's denominator and the allocation rule's

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("beta", self.beta, 0, 1, "a number in [0, 1]")
        check_count("t_norm", self.t_norm, 1, "a positive integer")
        check_range("epsilon", self.epsilon, 0, FLOAT32_MAX, "a number >= 0")


@register_algorithm("hasfl")
class HASFL(Algorithm):
    """Heterogeneity-aware adaptive sub-model allocation.

    Schedule (paper, Section 4.1): allocations start at p^max; the adaptation block — estimate
    Ĥ_i for the participants, EMA H̃_i ← βH̃_i + (1−β)Ĥ_i, new allocation for every client, coverage
    guarantee — runs at the end of every round t with t ≥ warmup and t % t_adapt == 0 (t counts from
    0), so with the defaults at t = 10, 15, 20, … . Every t_norm rounds, right after the adaptation of round t
    with t > 0 and t % t_norm == 0 (t = 20, 40, …), all H̃ are rescaled to mean 1, which preserves their order: the
    paper's Figure 4 has mean H̃ = 1.000 exactly at t = 20, 40, … .
    """

    options_class = HASFLOptions

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        self.h = np.ones(self.num_clients, dtype=np.float64)

    def is_adaptation_round(self, round: int) -> bool:
        return is_adaptation_round(round, self.config.warmup, self.config.t_adapt)

    def observe(self, round: int, results: Sequence[ClientResult], aggregate: AggregateResult) -> None:
        c = self.options
        if self.is_adaptation_round(round):
            h_hat = aggregate.heterogeneity(c.epsilon).numpy()
            for result, estimate in zip(results, h_hat):
                self.h[result.client] = c.beta * self.h[result.client] + (1 - c.beta) * estimate
            self.p_current = self.adapted_widths()
        if round > 0 and round % c.t_norm == 0:
            self.h = self.h / self.h.mean()

    def adapted_widths(self) -> np.ndarray:
        """The allocation rule on the current H̃ and capacities, with the coverage guarantee when it is on."""
        c = self.options
        p = allocation_rule(self.h, self.p_max, c.p_min, c.gamma, c.epsilon)
        return coverage_guarantee(p, self.p_max) if c.coverage else p

    def set_capacities(self, round: int, p_max: np.ndarray) -> None:
        """Dynamic assignment: the round's capacities, and the allocation rule (with the coverage guarantee) applied
        to them and the current H̃ once HAS-FL has adapted; before its first adaptation every client trains at its
        p^max, as in a fixed run."""
        self.p_max = np.asarray(p_max, dtype=np.float64).copy()
        adapted = round >= first_adapted_round(self.config.warmup, self.config.t_adapt)
        self.p_current = self.adapted_widths() if adapted else self.p_max.copy()

    def h_tilde(self) -> Optional[np.ndarray]:
        return self.h.copy()

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "h": self.h.copy()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.h = np.asarray(state["h"], dtype=np.float64).copy()
