"""Deterministic random streams derived from (seed, round, client): independent of backend and actor count."""

from __future__ import annotations

import numpy as np
import torch

# Distinct stream kinds so that, e.g., client sampling and local training never share a stream.
STREAM_SAMPLING, STREAM_CLIENT, STREAM_ALGORITHM, STREAM_INIT, STREAM_TIERS = 1, 2, 3, 4, 5
STREAM_EVAL = 6  # the test subset of eval_samples (drawn once per run)
STREAM_WIDTHS = 7  # width_assignment dynamic: every client's p^max redrawn from the ladder's mix, keyed by round
STREAM_LOCAL_EVAL = 9  # the clients a local-accuracy pass scores beyond local_eval_clients (drawn once per run)
# The device clock (hasfl_ray/clock, docs/clock.md): device profiles drawn once per run, each client's availability
# (keyed by client), and each round's invitations and dropouts (keyed by round); numbers far from the others' so
# that new kinds elsewhere never collide with them.
STREAM_DEVICES, STREAM_AVAILABILITY, STREAM_CLOCK = 20, 21, 22
STREAM_PRIVACY = 23  # DP noise of the aggregate, keyed by the DP update's number (hasfl_ray/aggregation/privacy.py)


def stream_seed(*key: int) -> int:
    """A 63-bit seed from an integer key tuple, e.g. ``(seed, STREAM_CLIENT, round, client)``."""
    return int(np.random.SeedSequence([int(k) for k in key]).generate_state(1, dtype=np.uint64)[0] >> 1)


def numpy_rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(stream_seed(*key))


def sample_participants(seed: int, round: int, num_clients: int, per_round: int) -> list:
    """The round's participants, drawn uniformly without replacement from rng(seed, round), sorted (the default of
    ``Algorithm.select``; here, below every module that draws them)."""
    rng = numpy_rng(seed, STREAM_SAMPLING, round)
    return sorted(int(i) for i in rng.choice(num_clients, size=per_round, replace=False))


def poisson_participants(seed: int, round: int, num_clients: int, per_round: int) -> list:
    """The round's participants under Poisson participation (config ``participation: poisson``): each client joins
    independently with probability q = per_round / num_clients, one uniform draw a client (in client order) from
    rng(seed, sampling, round); sorted, possibly empty or larger than ``per_round`` (its expectation)."""
    rng = numpy_rng(seed, STREAM_SAMPLING, round)
    return [int(i) for i in np.flatnonzero(rng.random(num_clients) < per_round / num_clients)]


def torch_generator(*key: int) -> torch.Generator:
    return torch.Generator().manual_seed(stream_seed(*key))
