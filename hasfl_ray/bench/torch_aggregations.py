"""The pure-torch (and dense, HeteroFL-style) ways of computing what the fused aggregation computes, which
:mod:`hasfl_ray.bench.aggregate` times against it.

Each takes ``(shapes, updates, weights, gate_blocks)`` and returns the full
:class:`~hasfl_ray.aggregation.result.AggregateResult` (Δ̄, both per-client norms, covered fraction).
"""

from __future__ import annotations

import math
from typing import Dict, List, Sequence, Tuple

import torch

from hasfl_ray.aggregation.result import AggregateResult
from hasfl_ray.models.slicing import region

Shapes = Dict[str, Tuple[int, ...]]
Updates = List[Dict[str, torch.Tensor]]


def _first(updates: Updates) -> torch.Tensor:
    return next(t for u in updates for t in u.values())


def aggregate_torch_per_client(shapes: Shapes, updates: Updates, weights: torch.Tensor,
                               gate_blocks: Dict[str, int]) -> AggregateResult:
    """Pure torch, in place: per (parameter, client) one ``add_`` into the region and one ``dist``.

    Accumulates in the clients' dtype (faster than the reference's float64, less accurate).
    """
    first = _first(updates)
    num_clients = len(updates)
    div_num = torch.zeros(num_clients, dtype=torch.float64, device=first.device)
    div_den = torch.zeros(num_clients, dtype=torch.float64, device=first.device)
    w = weights.tolist()
    delta, covered, total = {}, 0, 0
    for name, shape in shapes.items():
        blocks = gate_blocks.get(name, 1)
        numerator = torch.zeros(shape, dtype=first.dtype, device=first.device)
        denominator = torch.zeros(shape, dtype=first.dtype, device=first.device)
        holders = [(i, u[name]) for i, u in enumerate(updates) if name in u]
        for i, packed in holders:
            view = region(numerator, packed.shape, blocks)
            view.add_(packed.view(view.shape), alpha=w[i])
            region(denominator, packed.shape, blocks).add_(w[i])
        mask = denominator > 0
        mean = numerator.div_(denominator.masked_fill_(~mask, 1.0))
        for i, packed in holders:
            view = region(mean, packed.shape, blocks)
            div_num[i] += torch.dist(packed.view(view.shape), view).double().square()
            div_den[i] += torch.linalg.vector_norm(view).double().square()
        delta[name] = mean
        covered += int(mask.sum())
        total += mean.numel()
    return AggregateResult(delta, div_num.cpu(), div_den.cpu(), covered / total)


def aggregate_torch_sliced(shapes: Shapes, updates: Updates, weights: torch.Tensor,
                           gate_blocks: Dict[str, int]) -> AggregateResult:
    """The best pure torch found: leading-slice ``add_`` per tier, one ``dist`` per (client, parameter).

    Per parameter, the holders are grouped by packed shape (the tiers): a tier's updates are summed
    contiguously (``mul`` then ``add_(alpha=w)``, in the clients' dtype) and added once into the leading
    slice of the numerator, its weight once into the denominator; the mean's slice is made contiguous once
    per tier, which gives ||m_i Δ̄||² for every member and one ``torch.dist`` per member for
    ||m_i (Δ_i − Δ̄)||². No host synchronisation inside (norms are collected and scattered at the end),
    so it is also the best of these on a GPU. Sums in the clients' dtype: faster than the reference's
    float64, less accurate.
    """
    first = _first(updates)
    num_clients = len(updates)
    w = weights.tolist()
    delta, covered, total = {}, [], 0
    num_terms, num_index, den_terms, den_index = [], [], [], []
    for name, shape in shapes.items():
        blocks = gate_blocks.get(name, 1)
        tiers: Dict[Tuple[int, ...], List[int]] = {}
        for i, update in enumerate(updates):
            packed = update.get(name)
            if packed is not None:
                tiers.setdefault(tuple(packed.shape), []).append(i)
        numerator = torch.zeros(shape, dtype=first.dtype, device=first.device)
        denominator = torch.zeros(shape, dtype=first.dtype, device=first.device)
        for packed_shape, members in tiers.items():
            view = region(numerator, packed_shape, blocks)
            if len(members) == 1:
                view.add_(updates[members[0]][name].view(view.shape), alpha=w[members[0]])
            else:
                tier_sum = torch.mul(updates[members[0]][name], w[members[0]])
                for i in members[1:]:
                    tier_sum.add_(updates[i][name], alpha=w[i])
                view.add_(tier_sum.view(view.shape))
            region(denominator, packed_shape, blocks).add_(math.fsum(w[i] for i in members))
        mask = denominator > 0
        mean = numerator.div_(denominator.masked_fill_(~mask, 1.0))
        for packed_shape, members in tiers.items():
            local_mean = region(mean, packed_shape, blocks).reshape(packed_shape)
            den_terms.append(torch.linalg.vector_norm(local_mean))
            den_index.append(members)
            for i in members:
                num_terms.append(torch.dist(updates[i][name], local_mean))
                num_index.append(i)
        delta[name] = mean
        covered.append(mask.sum())
        total += mean.numel()
    div_num = torch.zeros(num_clients, dtype=torch.float64, device=first.device)
    div_den = torch.zeros(num_clients, dtype=torch.float64, device=first.device)
    if num_terms:
        index = torch.as_tensor(num_index, device=first.device)
        div_num.index_add_(0, index, torch.stack(num_terms).double().square())
        per_tier = torch.stack(den_terms).double().square()
        sizes = torch.as_tensor([len(m) for m in den_index], device=first.device)
        members = torch.as_tensor([i for m in den_index for i in m], device=first.device)
        div_den.index_add_(0, members, per_tier.repeat_interleave(sizes))
    return AggregateResult(delta, div_num.cpu(), div_den.cpu(), int(torch.stack(covered).sum()) / total)


def aggregate_torch_stacked(shapes: Shapes, updates: Updates, weights: torch.Tensor,
                            gate_blocks: Dict[str, int]) -> AggregateResult:
    """Pure torch, batched: clients with equal packed shapes (one tier) are stacked and reduced by a matmul.

    A handful of large ops per (parameter, tier) instead of a few small ones per (parameter, client).
    """
    first = _first(updates)
    num_clients = len(updates)
    div_num = torch.zeros(num_clients, dtype=torch.float64, device=first.device)
    div_den = torch.zeros(num_clients, dtype=torch.float64, device=first.device)
    w = weights.to(device=first.device, dtype=first.dtype)
    delta, covered, total = {}, 0, 0
    for name, shape in shapes.items():
        blocks = gate_blocks.get(name, 1)
        groups: Dict[Tuple[int, ...], List[int]] = {}
        for i, u in enumerate(updates):
            if name in u:
                groups.setdefault(tuple(u[name].shape), []).append(i)
        numerator = torch.zeros(shape, dtype=first.dtype, device=first.device)
        denominator = torch.zeros(shape, dtype=first.dtype, device=first.device)
        stacks = []
        for packed_shape, members in groups.items():
            stacked = torch.stack([updates[i][name] for i in members]).view(len(members), -1)
            index = torch.as_tensor(members, device=first.device)
            group_weights = w[index]
            view = region(numerator, packed_shape, blocks)
            view.add_((group_weights @ stacked).view(view.shape))
            region(denominator, packed_shape, blocks).add_(float(group_weights.sum()))
            stacks.append((packed_shape, index, stacked))
        mask = denominator > 0
        mean = numerator.div_(denominator.masked_fill_(~mask, 1.0))
        for packed_shape, index, stacked in stacks:
            view = region(mean, packed_shape, blocks).reshape(1, -1)
            div_num[index] += (stacked - view).square_().sum(dim=1, dtype=torch.float64)
            div_den[index] += view.square().sum(dtype=torch.float64)
        delta[name] = mean
        covered += int(mask.sum())
        total += mean.numel()
    return AggregateResult(delta, div_num.cpu(), div_den.cpu(), covered / total)


def aggregate_dense(shapes: Shapes, updates: Updates, weights: torch.Tensor,
                    gate_blocks: Dict[str, int]) -> AggregateResult:
    """Dense: every update zero-padded to the full shape with a 0/1 mask, then full-shape arithmetic."""
    first = _first(updates)
    num_clients = len(updates)
    div_num = torch.zeros(num_clients, dtype=torch.float64)
    div_den = torch.zeros(num_clients, dtype=torch.float64)
    w = weights.tolist()
    delta, covered, total = {}, 0, 0

    def padded(name, packed):
        full = torch.zeros(shapes[name], dtype=first.dtype, device=first.device)
        mask = torch.zeros(shapes[name], dtype=first.dtype, device=first.device)
        view = region(full, packed.shape, gate_blocks.get(name, 1))
        view.copy_(packed.view(view.shape))
        region(mask, packed.shape, gate_blocks.get(name, 1)).fill_(1.0)
        return full, mask

    for name, shape in shapes.items():
        numerator = torch.zeros(shape, dtype=first.dtype, device=first.device)
        denominator = torch.zeros(shape, dtype=first.dtype, device=first.device)
        for i, u in enumerate(updates):
            if name in u:
                full, mask = padded(name, u[name])
                numerator += w[i] * full
                denominator += w[i] * mask
        covered_mask = denominator > 0
        mean = torch.where(covered_mask, numerator / torch.where(covered_mask, denominator, 1.0), 0.0)
        for i, u in enumerate(updates):
            if name in u:
                full, mask = padded(name, u[name])
                div_num[i] += float(((full - mean) * mask).square().sum())
                div_den[i] += float((mean * mask).square().sum())
        delta[name] = mean
        covered += int(covered_mask.sum())
        total += mean.numel()
    return AggregateResult(delta, div_num, div_den, covered / total)


def _heterofl_index(shape: Sequence[int], packed_shape: Sequence[int], blocks: int,
                    device: torch.device) -> Tuple[torch.Tensor, ...]:
    """HeteroFL's way: an index tensor per dim (per gate block for dim 0), expanded by ``torch.meshgrid``."""
    per_dim = []
    for d, (full, count) in enumerate(zip(shape, packed_shape)):
        if d == 0 and blocks > 1:
            rows, kept = full // blocks, count // blocks
            per_dim.append(torch.cat([torch.arange(b * rows, b * rows + kept, device=device) for b in range(blocks)]))
        else:
            per_dim.append(torch.arange(count, device=device))
    return tuple(torch.meshgrid(*per_dim, indexing="ij"))


def aggregate_heterofl_loop(shapes: Shapes, updates: Updates, weights: torch.Tensor,
                            gate_blocks: Dict[str, int]) -> AggregateResult:
    """HeteroFL's combine(): per parameter, per client, index tensors and advanced-index read-modify-write."""
    first = _first(updates)
    num_clients = len(updates)
    div_num = torch.zeros(num_clients, dtype=torch.float64)
    div_den = torch.zeros(num_clients, dtype=torch.float64)
    w = weights.tolist()
    delta, covered, total = {}, 0, 0
    for name, shape in shapes.items():
        numerator = torch.zeros(shape, dtype=first.dtype, device=first.device)
        count = torch.zeros(shape, dtype=first.dtype, device=first.device)
        indices = {}
        for i, u in enumerate(updates):
            if name not in u:
                continue
            packed = u[name]
            indices[i] = _heterofl_index(shape, packed.shape, gate_blocks.get(name, 1), first.device) if shape else ()
            numerator[indices[i]] += w[i] * packed
            count[indices[i]] += w[i]
        covered_mask = count > 0
        mean = torch.where(covered_mask, numerator / torch.where(covered_mask, count, 1.0), 0.0)
        for i, index in indices.items():
            local_mean = mean[index]
            div_num[i] += float((updates[i][name] - local_mean).square().sum())
            div_den[i] += float(local_mean.square().sum())
        delta[name] = mean
        covered += int(covered_mask.sum())
        total += mean.numel()
    return AggregateResult(delta, div_num, div_den, covered / total)
