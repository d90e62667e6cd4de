"""What a client's local training returns (its own module, below both one-at-a-time and batched training)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import torch

from hasfl_ray.aggregation.packed import SPARSE_TYPES


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
            if isinstance(value, SPARSE_TYPES):  # an index-set or masked update: its values
                value = value.values
            if isinstance(value, torch.Tensor):
                return bool(torch.isfinite(value).all()) if value.is_floating_point() else True
            if isinstance(value, dict):
                return all(finite(v) for v in value.values())
            return not isinstance(value, float) or math.isfinite(value)

        return math.isfinite(self.loss) and finite(self.update) and finite(self.extras)

    def non_finite(self) -> str:
        """What is not finite in it, for a log line: "a NaN or infinite value in its update of 'fc.weight' (2 of
        640; its loss 1.502 is finite)", or "a loss of nan"; "" when everything is finite."""
        if not math.isfinite(self.loss):
            return f"a loss of {self.loss}"
        for kind, values in (("update", self.update), ("extras", self.extras)):
            for name, value in _named_floats(values):
                bad = int((~torch.isfinite(value)).sum()) if isinstance(value, torch.Tensor) else \
                    int(not math.isfinite(value))
                if bad:
                    size = value.numel() if isinstance(value, torch.Tensor) else 1
                    return (f"a NaN or infinite value in its {kind} {name!r} ({bad:,} of {size:,}; its loss "
                            f"{self.loss:.4g} is finite)")
        return ""


def _named_floats(value: Any, prefix: str = ""):
    """(name, floating tensor or float) for every one inside ``value`` (dicts nested: names joined with dots)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _named_floats(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, SPARSE_TYPES):
        yield prefix, value.values
    elif isinstance(value, torch.Tensor) and value.is_floating_point() or isinstance(value, float):
        yield prefix, value


def _floats(value: Any, out: List[Any]) -> None:
    """Every floating tensor and float inside ``value`` (dicts nested), appended to ``out``."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            out.append(value)
    elif isinstance(value, dict):
        for item in value.values():
            _floats(item, out)
    elif isinstance(value, SPARSE_TYPES):
        out.append(value.values)
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
