"""Deterministic random streams derived from (seed, round, client): independent of backend and actor count."""

from __future__ import annotations

import numpy as np
import torch

# Distinct stream kinds so that, e.g., client sampling and local training never share a stream.
STREAM_SAMPLING, STREAM_CLIENT, STREAM_ALGORITHM, STREAM_INIT, STREAM_TIERS = 1, 2, 3, 4, 5
STREAM_EVAL = 6  # the test subset of eval_samples (drawn once per run)


def stream_seed(*key: int) -> int:
    """A 63-bit seed from an integer key tuple, e.g. ``(seed, STREAM_CLIENT, round, client)``."""
    return int(np.random.SeedSequence([int(k) for k in key]).generate_state(1, dtype=np.uint64)[0] >> 1)


def numpy_rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(stream_seed(*key))


def torch_generator(*key: int) -> torch.Generator:
    return torch.Generator().manual_seed(stream_seed(*key))
