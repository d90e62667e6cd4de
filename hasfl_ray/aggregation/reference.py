"""Pure-torch reference of the coordinate-wise aggregation: the fallback backend and the tests' oracle."""

from __future__ import annotations

from typing import Dict, Mapping, Sequence, Tuple

import torch

from hasfl_ray.aggregation.packed import SPARSE_TYPES, dense_of
from hasfl_ray.aggregation.result import AggregateResult
from hasfl_ray.models.slicing import region


def aggregate_reference(global_shapes: Mapping[str, Tuple[int, ...]], updates: Sequence[Mapping[str, torch.Tensor]],
                        weights: torch.Tensor, gate_blocks: Mapping[str, int]) -> AggregateResult:
    """Gather, weighted mean and masked divergence norms with one region view per (parameter, client).

    Vectorised over coordinates; loops only over parameters and clients. Sums are taken in float64 and
    Δ̄ is rounded to the clients' dtype once at the end (the norms use the unrounded mean), as in the
    fused kernel. Inputs are assumed validated (see :func:`hasfl_ray.aggregation.validate_inputs`).
    """
    first = next(t for u in updates for t in u.values())
    first = first.values if isinstance(first, SPARSE_TYPES) else first
    dtype, device = first.dtype, first.device
    num_clients = len(updates)
    div_num = torch.zeros(num_clients, dtype=torch.float64)
    div_den = torch.zeros(num_clients, dtype=torch.float64)
    delta: Dict[str, torch.Tensor] = {}
    covered = 0
    total = 0
    w64 = weights.to(torch.float64)
    for name, shape in global_shapes.items():
        blocks = gate_blocks.get(name, 1)
        numerator = torch.zeros(shape, dtype=torch.float64, device=device)
        denominator = torch.zeros(shape, dtype=torch.float64, device=device)
        spread = {}  # client -> (dense float64 values, bool mask) of an index-set or mask update
        for i, update in enumerate(updates):
            packed = update.get(name)
            if packed is None:
                continue
            if isinstance(packed, SPARSE_TYPES):
                dense, mask = spread[i] = dense_of(packed, tuple(shape))
                numerator.add_(dense, alpha=float(w64[i]))
                denominator.add_(mask.to(torch.float64), alpha=float(w64[i]))
                continue
            view_num = region(numerator, packed.shape, blocks)
            view_num.add_(packed.reshape(view_num.shape).to(torch.float64), alpha=float(w64[i]))
            region(denominator, packed.shape, blocks).add_(float(w64[i]))
        covered_mask = denominator > 0
        mean = torch.where(covered_mask, numerator / torch.where(covered_mask, denominator, 1), 0)
        delta[name] = mean.to(dtype)
        covered += int(covered_mask.sum())
        total += mean.numel()
        for i, update in enumerate(updates):
            packed = update.get(name)
            if packed is None:
                continue
            if i in spread:
                dense, mask = spread[i]
                div_num[i] += torch.where(mask, dense - mean, 0).square().sum().cpu()
                div_den[i] += torch.where(mask, mean, 0).square().sum().cpu()
                continue
            mean_view = region(mean, packed.shape, blocks).reshape(packed.shape)
            div_num[i] += (packed.to(torch.float64) - mean_view).square().sum().cpu()
            div_den[i] += mean_view.square().sum().cpu()
    return AggregateResult(delta, div_num, div_den, covered / total if total else 0.0)
