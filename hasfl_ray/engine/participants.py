"""The run's seeded draws: each round's participants, every client's p^max (the tiers, or each round's) and w^(0)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from hasfl_ray.data import assign_tiers
from hasfl_ray.federation import WidthLadder
from hasfl_ray.models import build_model
from hasfl_ray.training.seeding import STREAM_INIT, STREAM_SAMPLING, STREAM_TIERS, STREAM_WIDTHS, numpy_rng, stream_seed


def sample_participants(seed: int, round: int, num_clients: int, per_round: int) -> List[int]:
    """The round's participants, drawn uniformly without replacement from rng(seed, round), sorted."""
    rng = numpy_rng(seed, STREAM_SAMPLING, round)
    return sorted(int(i) for i in rng.choice(num_clients, size=per_round, replace=False))


def capacity_tiers(seed: int, num_clients: int, counts: Optional[Sequence[int]] = None,
                   ladder: Optional[WidthLadder] = None) -> np.ndarray:
    """p_i^max of every client: the run's tier draw from rng(seed, tiers) (``hasfl-ray data inspect`` shares it);
    ``counts`` clients per tier (config ``tier_counts``), default the text's mix (8/5/4/3 of 20), of the width
    ``ladder`` (default the paper's tiers; :func:`hasfl_ray.federation.ladder_of` a config's)."""
    ladder = ladder or WidthLadder()
    return assign_tiers(num_clients, numpy_rng(seed, STREAM_TIERS), ladder.widths, ladder.probabilities,
                        counts=counts)


def round_capacities(seed: int, round: int, num_clients: int, ladder: WidthLadder) -> np.ndarray:
    """``width_assignment: dynamic``: every client's p^max for round ``round``, drawn independently from the
    ladder's mix with rng(seed, widths, round) (HeteroFL's "dynamic"), the same on every backend and after a
    resume."""
    return ladder.draw(num_clients, numpy_rng(seed, STREAM_WIDTHS, round))


def initial_parameters(model_name: str, seed: int) -> Dict[str, torch.Tensor]:
    """w^(0): the full-width model initialised from the run seed (the global torch RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed, STREAM_INIT))
        model = build_model(model_name)
    return {name: p.detach().clone() for name, p in model.named_parameters()}
