"""Seeded Dirichlet label partitions and capacity tiers of the paper's protocol."""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from hasfl_ray.errors import ConfigError

#: Capacity tiers p_max and their probabilities: constrained devices are more prevalent, mean 0.525.
TIERS = (0.25, 0.5, 0.75, 1.0)
TIER_PROBABILITIES = (0.40, 0.25, 0.20, 0.15)


#: The tier mix of the paper's own runs (its Figure 5's p^max vector): 4/10/3/3 clients, mean 0.5625.
PAPER_RUNS_TIER_COUNTS = (4, 10, 3, 3)


def tier_counts(num_clients: int, probabilities: Sequence[float] = TIER_PROBABILITIES) -> np.ndarray:
    """Clients per tier by largest remainder of ``probabilities * num_clients`` (20 clients: 8/5/4/3)."""
    probs = np.asarray(probabilities, dtype=np.float64)
    exact = probs * num_clients
    counts = np.floor(exact).astype(int)
    remainder_order = np.argsort(-(exact - counts), kind="stable")
    counts[remainder_order[:num_clients - counts.sum()]] += 1
    return counts


def assign_tiers(num_clients: int, rng: np.random.Generator, tiers: Sequence[float] = TIERS,
                 probabilities: Sequence[float] = TIER_PROBABILITIES,
                 counts: Optional[Sequence[int]] = None) -> np.ndarray:
    """p_max per client: ``counts`` clients per tier (default :func:`tier_counts` of ``probabilities``), shuffled.

    With 20 clients the default gives exactly 8/5/4/3 clients at 0.25/0.5/0.75/1.0 (mean 0.525, the paper's
    text); ``counts=(4, 10, 3, 3)`` gives the mix of the paper's own runs (mean 0.5625). Every seed redraws which
    client gets which tier (one permutation of ``rng`` either way).
    """
    counts = tier_counts(num_clients, probabilities) if counts is None else np.asarray(counts, dtype=int)
    if counts.sum() != num_clients or len(counts) != len(tiers):
        raise ConfigError(f"tier_counts is {list(map(int, counts))}; expected {len(tiers)} counts (tiers "
                          f"{', '.join(map(str, tiers))}) that add up to the {num_clients} clients")
    p_max = np.repeat(np.asarray(tiers, dtype=np.float64), counts)
    return p_max[rng.permutation(num_clients)]


def dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
                        min_size: int = 10, max_tries: int = 1000) -> List[np.ndarray]:
    """Split sample indices over clients with Dirichlet(alpha) label skew.

    For each class, its samples are shuffled and divided among clients by proportions drawn from
    Dir(alpha). The draw is repeated until every client holds at least ``min_size`` samples
    (capped at an even share when the dataset is too small), so no client is empty.

    Returns:
        Per client, a sorted int64 array of indices into ``labels``.
    """
    labels = np.asarray(labels)
    if len(labels) < num_clients:
        raise ConfigError(f"{len(labels)} samples cannot give each of {num_clients} clients one; pass fewer --clients")
    min_size = min(min_size, len(labels) // num_clients)
    classes = np.unique(labels)
    for _ in range(max_tries):
        buckets: List[List[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * len(idx)).astype(int)
            for client, part in enumerate(np.split(idx, cuts)):
                buckets[client].append(part)
        parts = [np.sort(np.concatenate(b)).astype(np.int64) for b in buckets]
        if min(len(p) for p in parts) >= max(min_size, 1):
            return parts
    raise ConfigError(f"could not draw a Dirichlet(alpha={alpha}) partition giving every one of {num_clients} "
                      f"clients at least {min_size} samples in {max_tries} tries; pass a larger --alpha or fewer "
                      "--clients")
