"""The asynchronous servers' rules as the fused kernel's arguments (docs/algorithms.md, "Asynchronous servers").

FedBuff (Nguyen et al., AISTATS 2022) applies K buffered updates at once; FedAsync (Xie et al., 2019) mixes each
arrival in. Both scale an update by its staleness factor s(τ). On width-sliced updates the kernel computes, at every
coordinate j, the mean of the updates covering j with weights w_i = n_i s(τ_i), and the server adds η times it:

- FedBuff: η = η_g Σ_i n_i s(τ_i) / Σ_i n_i, so that where every update covers j the step is
  η_g Σ_i n_i s(τ_i) Δ_ij / Σ_i n_i (the paper's (1/K) Σ_i s(τ_i) Δ_i for equal n_i);
- FedAsync (K = 1): η = η_g α s(τ), the update being the mixing's u = (w_stale + Δ) − w on the client's
  coordinates (:meth:`hasfl_ray.engine.server.Server.mixed`), so w ← (1 − α s(τ)) w + α s(τ) (w_stale + Δ) there.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple


def buffered_step(counts: Sequence[float], factors: Sequence[float], server_lr: float) -> Tuple[List[float], float]:
    """FedBuff: the kernel's weights n_i s(τ_i) and the server step η_g Σ n_i s(τ_i) / Σ n_i."""
    weights = [float(n) * float(s) for n, s in zip(counts, factors)]
    total = float(sum(float(n) for n in counts))
    return weights, (float(server_lr) * sum(weights) / total if total > 0 else 0.0)


def mixing_step(count: float, factor: float, alpha: float, server_lr: float) -> Tuple[List[float], float]:
    """FedAsync: the kernel's weight n s(τ) (one update: any positive weight gives the update itself) and the
    step η_g α s(τ)."""
    return [float(count) * float(factor)], float(server_lr) * float(alpha) * float(factor)


__all__ = ["buffered_step", "mixing_step"]
