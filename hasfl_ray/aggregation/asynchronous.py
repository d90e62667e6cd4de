"""The asynchronous servers' rules as the fused kernel's arguments (docs/algorithms.md, "Asynchronous servers").

FedBuff (Nguyen et al., AISTATS 2022) applies K buffered updates at once; FedAsync (Xie et al., 2019) mixes each
arrival in. Both scale an update by its staleness factor s(τ). On width-sliced updates the kernel computes, at every
coordinate j, the mean of the updates covering j with weights w_i = n_i s(τ_i), and the server adds η times it:

- FedBuff: η = η_g Σ_i n_i s(τ_i) / Σ_i n_i, so that where every update covers j the step is
  η_g Σ_i n_i s(τ_i) Δ_ij / Σ_i n_i (the paper's (1/K) Σ_i s(τ_i) Δ_i for equal n_i);
- FedAsync (K = 1): η = η_g α s(τ), the update being the mixing's u = (w_stale + Δ) − w on the client's
  coordinates (:meth:`hasfl_ray.engine.server.Server.mixed`), so w ← (1 − α s(τ)) w + α s(τ) (w_stale + Δ) there.

FedBuff's server momentum β (``server_momentum``) turns the server's w ← w + η Δ̄ into m ← β m + η Δ̄, w ← w + m
(:func:`server_step`).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch


def buffered_step(counts: Sequence[float], factors: Sequence[float], server_lr: float) -> Tuple[List[float], float]:
    """FedBuff: the kernel's weights n_i s(τ_i) and the server step η_g Σ n_i s(τ_i) / Σ n_i."""
    weights = [float(n) * float(s) for n, s in zip(counts, factors)]
    total = float(sum(float(n) for n in counts))
    return weights, (float(server_lr) * sum(weights) / total if total > 0 else 0.0)


def mixing_step(count: float, factor: float, alpha: float, server_lr: float) -> Tuple[List[float], float]:
    """FedAsync: the kernel's weight n s(τ) (one update: any positive weight gives the update itself) and the
    step η_g α s(τ)."""
    return [float(count) * float(factor)], float(server_lr) * float(alpha) * float(factor)


def server_step(params: Mapping[str, torch.Tensor], delta: Mapping[str, torch.Tensor], server_lr: float,
                momentum: float = 0.0, last: Optional[Mapping[str, torch.Tensor]] = None
                ) -> Tuple[Dict[str, torch.Tensor], Optional[Dict[str, torch.Tensor]]]:
    """The server's new parameters and momentum buffer: w + η Δ̄ (no buffer), or with ``momentum`` β > 0 (FedBuff's
    server momentum) w + m with m ← β m + η Δ̄ over every parameter, ``last`` the previous m (None before the first
    step; Δ̄ is 0 where nothing covers): the heavy-ball form of SGD with momentum at a constant learning rate, m
    being η times torch's momentum buffer (FLSim's FedBuff steps a ``torch.optim.SGD`` on the buffer's delta)."""
    if not momentum:
        return {name: params[name].add(d, alpha=server_lr) for name, d in delta.items()}, None
    last = last or {}
    steps = {}
    for name in params:
        step = last[name].mul(momentum) if name in last else None
        if name in delta:
            step = delta[name].mul(server_lr) if step is None else step.add(delta[name], alpha=server_lr)
        if step is not None:
            steps[name] = step
    return {name: params[name].add(step) for name, step in steps.items()}, steps


__all__ = ["buffered_step", "mixing_step", "server_step"]
