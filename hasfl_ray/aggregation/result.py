"""The result of one coordinate-wise aggregation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

import torch


@dataclass
class AggregateResult:
    """Output of :func:`hasfl_ray.aggregate_updates`.

    Attributes:
        delta: parameter name -> full-shape tensor Δ̄ (the clients' dtype and device), the weighted mean
            over exactly the clients covering each coordinate, 0 where none does.
        div_num: float64 tensor (num_clients,), ||m_i ⊙ (Δ_i − Δ̄)||² per client.
        div_den: float64 tensor (num_clients,), ||m_i ⊙ Δ̄||² per client.
        covered_fraction: fraction of all coordinates covered by at least one client.
        covered_by_layer: parameter name -> fraction of its coordinates covered by at least one client (filled by
            :meth:`hasfl_ray.engine.server.Server.apply` from the updates' shapes and offsets; empty otherwise).
        privacy: the metrics line's keys of a differentially private update (dp_clip, dp_updates, ...;
            :func:`hasfl_ray.aggregation.privacy.privatize`), None without DP.
    """

    delta: Dict[str, torch.Tensor]
    div_num: torch.Tensor
    div_den: torch.Tensor
    covered_fraction: float
    covered_by_layer: Dict[str, float] = field(default_factory=dict)
    privacy: Optional[Dict[str, float]] = None

    def heterogeneity(self, eps: float = 1e-8) -> torch.Tensor:
        """The paper's estimator Ĥ_i = div_num_i / (div_den_i + eps), float64 (num_clients,)."""
        return self.div_num / (self.div_den + eps)
