"""What a client's local training returns (its own module, below both one-at-a-time and batched training)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

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


def _floats(value: Any, out: List[Any]) -> None:
    """Every floating tensor and float inside ``value`` (dicts nested), appended to ``out``."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _floats(item, out)
    elif isinstance(value, float):
        out.append(value)


def finite_flags(results: Sequence[ClientResult]) -> List[bool]:
    """``[r.is_finite() for r in results]``, in one pass when every value is finite (the usual round).

    One ``torch._foreach_norm`` over every floating tensor of every result: a norm is NaN or infinite when its
    tensor holds a NaN or an infinity, so all norms finite means all values finite; a non-finite norm (or a
    finite tensor whose norm overflows) sends every result through the exact :meth:`ClientResult.is_finite`.
    """
    tensors: List[torch.Tensor] = []
    scalars: List[float] = []
    for result in results:
        values: List[Any] = [result.loss]
        _floats(result.update, values)
        _floats(result.extras, values)
        for value in values:
            (tensors if isinstance(value, torch.Tensor) else scalars).append(value)
    try:
        if all(isinstance(x, (int, float)) and math.isfinite(x) for x in scalars) and len(
                {(t.device, t.dtype) for t in tensors}) <= 1:
            if not tensors or bool(torch.isfinite(torch.stack(torch._foreach_norm(tensors))).all()):
                return [True] * len(results)
    except (RuntimeError, TypeError, AttributeError):  # an odd tensor (sparse, an old torch): the exact check says
        pass
    return [result.is_finite() for result in results]
