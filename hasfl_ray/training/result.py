"""What a client's local training returns (its own module, below both one-at-a-time and batched training)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import torch


@dataclass
class ClientResult:
    """What a client returns: its packed update Δ_i (name -> sliced tensor), n_i, mean loss and extras."""

    client: int
    width: float
    update: Dict[str, torch.Tensor]
    num_samples: int
    loss: float
    steps: int
    extras: Dict[str, Any] = field(default_factory=dict)
    #: The task's window offset: where ``update`` lies in the global coordinates.
    offset: int = 0
    #: The width the client effectively trained where it differs from ``width`` (FjORD: its mean sampled width);
    #: avg_p counts it. None: ``width``.
    trained_width: Optional[float] = None

    def is_finite(self) -> bool:
        """False for a diverged client: a non-finite loss, update or extra tensor (e.g. SCAFFOLD's drift)."""
        def finite(value: Any) -> bool:
            if isinstance(value, torch.Tensor):
                return bool(torch.isfinite(value).all()) if value.is_floating_point() else True
            if isinstance(value, dict):
                return all(finite(v) for v in value.values())
            return not isinstance(value, float) or math.isfinite(value)

        return math.isfinite(self.loss) and finite(self.update) and finite(self.extras)
