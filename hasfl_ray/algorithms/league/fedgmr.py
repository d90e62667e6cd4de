"""FedGMR (Ma, Oh, Park and Kim; arXiv 2512.05372, ICML 2026): gradual model restoration on top of a sub-model
method, with mask-aware aggregation. NOT transcribed from the authors' code: a stand-in, marked as such.

What could be read here: the stored copy of github.com/shenhao66666/FedGMR (commits 8206b83f22cf, 60cef1c6af4b,
457fcc38891e) holds a 16-character README and an unrelated project (MoE-LSTM load forecasting on building data, with
a gate-aware expert aggregation): no gradual restoration and no sub-model masks. The paper's text reachable offline is
its abstract only (arxiv.org/abs/2512.05372v1 and its HTML page's first section): "FedGMR progressively increases
each client's sub-model density during training" and "a mask-aware aggregation (MA) rule tailored for asynchronous
MHFL", with an error bound that "scales with the average sub-model density across clients and rounds". The density
schedule's shape, when restoration happens, which parameters are restored and the exact MA rule are not in what
could be read.

So this module holds what the abstract pins down, in the form hasfl-ray would need, each rule named a stand-in:

- :func:`density` — a client's density grows from its initial d_0 (its capacity) to ``final`` (1: the full model)
  by ``restore_rounds``, in steps every ``restore_every`` rounds, linearly in the round (stand-in: linear steps).
- :func:`restore_mask` — restoration only adds coordinates (the mask at a higher density contains the one before),
  the new ones chosen by importance (|w|, FIARSE's score, when FIARSE is the base method) (stand-in).
- :func:`aggregate` — mask-aware: each coordinate moves by the weighted mean of the updates of the clients whose mask
  holds it (weights n_i · s(τ_i), s the asynchronous server's staleness factor; 1 in rounds), and stays where no
  client holds it: :func:`hasfl_ray.algorithms.league.common.masked_mean` over the updates (stand-in: the abstract
  names the rule, not its weights).

Replace each stand-in with the authors' rule when their code or the paper's method section can be read; the tests
check the stand-ins' stated properties, not a source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence

import torch

from hasfl_ray.algorithms.league.common import check_mask, masked_mean
from hasfl_ray.algorithms.options import check_count, check_range
from hasfl_ray.errors import ConfigError

#: Says in results and docs that FedGMR's rules here are hasfl-ray's stand-ins, not the authors' code.
SOURCE_STATUS = "stand-in: the authors' code and the paper's method section were not readable here"


@dataclass
class FedGMROptions:
    fedgmr_final_density: float = 1.0  # the density every client is restored to
    fedgmr_restore_rounds: int = 100  # the round by which it is reached
    fedgmr_restore_every: int = 10  # rounds between restoration steps

    def __post_init__(self) -> None:
        check_range("fedgmr_final_density", self.fedgmr_final_density, 0, 1, "a density in (0, 1]", low_open=True)
        check_count("fedgmr_restore_rounds", self.fedgmr_restore_rounds, 1, "a whole number of rounds >= 1")
        check_count("fedgmr_restore_every", self.fedgmr_restore_every, 1, "a whole number of rounds >= 1")
        if self.fedgmr_restore_every > self.fedgmr_restore_rounds:
            raise ConfigError(f"fedgmr_restore_every is {self.fedgmr_restore_every}; expected at most "
                              f"fedgmr_restore_rounds ({self.fedgmr_restore_rounds}), or no step would restore")


def density(round: int, initial: float, options: Optional[FedGMROptions] = None) -> float:
    """A client's density in round ``round`` (0-based) from its ``initial`` one (stand-in: linear steps)."""
    options = options or FedGMROptions()
    check_range("the initial density", initial, 0, 1, "a density in (0, 1]", low_open=True)
    final = max(options.fedgmr_final_density, initial)  # restoration never shrinks a client
    stepped = (max(round, 0) // options.fedgmr_restore_every) * options.fedgmr_restore_every
    progress = min(1.0, stepped / options.fedgmr_restore_rounds)
    return initial + (final - initial) * progress


def kept_count(numel: int, fraction: float) -> int:
    """Coordinates a density keeps: ceil(density · numel), at least 1."""
    return max(1, min(numel, math.ceil(fraction * numel - 1e-9)))


def restore_mask(current: torch.Tensor, scores: torch.Tensor, fraction: float,
                 name: str = "the parameter") -> torch.Tensor:
    """The mask at density ``fraction``: ``current`` plus the highest-scoring coordinates it lacks, up to
    ceil(fraction · numel) (ties broken by the lower flat index); never drops a coordinate (stand-in)."""
    check_mask(name, current, scores)
    target = kept_count(scores.numel(), fraction)
    held = int(current.sum())
    if held >= target:
        return current.clone()
    flat = current.reshape(-1)
    candidates = torch.nonzero(~flat).reshape(-1)
    ranked = candidates[torch.argsort(-scores.reshape(-1)[candidates].to(torch.float64), stable=True)]
    out = flat.clone()
    out[ranked[:target - held]] = True
    return out.reshape(current.shape)


def aggregate(global_params: Mapping[str, torch.Tensor], deltas: Sequence[Mapping[str, torch.Tensor]],
              masks: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float],
              server_lr: float = 1.0) -> Dict[str, torch.Tensor]:
    """w + η · (the weighted mean of the updates over the clients whose mask holds each coordinate), float64; a
    coordinate no client holds stays (stand-in)."""
    out = {}
    for name, value in global_params.items():
        zero = torch.zeros(value.shape, dtype=torch.float64)
        mean = masked_mean(zero, [d[name] for d in deltas], [m[name] for m in masks], weights, name)
        out[name] = value.to(torch.float64) + server_lr * mean
    return out


__all__ = ["FedGMROptions", "SOURCE_STATUS", "aggregate", "density", "kept_count", "restore_mask"]
