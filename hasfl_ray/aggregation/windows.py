"""Coordinate-wise aggregation of rolling-window (FedRolex) updates: the same mean and norms at other positions."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from hasfl_ray.aggregation import aggregate_updates, validate_inputs
from hasfl_ray.aggregation.result import AggregateResult
from hasfl_ray.models.slicing import ParamSpec, gate_blocks_of, roll_channels, window_linear_index


def aggregate_windows(specs: Mapping[str, ParamSpec], updates: Sequence[Mapping[str, torch.Tensor]],
                      offsets: Sequence[int], weights: Union[Sequence[float], torch.Tensor],
                      backend: str = "auto") -> AggregateResult:
    """Coordinate-wise weighted mean of packed updates whose windows start at per-client channel offsets.

    Client i's packed tensor holds, in every scaled dim, the channels ``offsets[i], offsets[i] + 1, …``
    modulo the dim's channel count (see :func:`hasfl_ray.models.slicing.window_index`); offset 0 is the
    leading slice of :func:`hasfl_ray.aggregation.aggregate_updates`. The result is defined exactly as
    there: Δ̄ over the clients covering each coordinate (0 where none does), ||m_i ⊙ (Δ_i − Δ̄)||²,
    ||m_i ⊙ Δ̄||² and the covered fraction.

    When every client shares one offset o (FedRolex: one window position per round), rolling the
    coordinates by −o turns every window into a leading slice, so the aggregation runs on
    ``aggregate_updates`` (the fused kernel where built) and only Δ̄ is rolled back. Mixed offsets use
    a pure-torch scatter over flat indices.

    Args:
        specs: parameter name -> slice description of the full model.
        updates: per client, name -> packed tensor in window order.
        offsets: per client, the window's first channel (>= 0).
        weights: per client weight (> 0).
        backend: passed to ``aggregate_updates`` on the shared-offset path.
    """
    shapes = {name: spec.shape for name, spec in specs.items()}
    blocks = gate_blocks_of(specs)
    if len(offsets) != len(updates):
        raise ValueError(f"offsets has {len(offsets)} entries but updates has {len(updates)} clients; "
                         "expected one window offset per client")
    if any(not isinstance(o, int) or isinstance(o, bool) or o < 0 for o in offsets):
        raise ValueError(f"offsets must be non-negative integers, got {list(offsets)}")
    if len(set(offsets)) == 1:
        offset = offsets[0]
        result = aggregate_updates(shapes, updates, weights, blocks, backend=backend)
        if offset:
            result.delta = {name: roll_channels(delta, specs[name], offset) for name, delta in result.delta.items()}
        return result
    shapes, weights_t, _ = validate_inputs(shapes, updates, weights, blocks)
    return _aggregate_mixed(specs, updates, offsets, weights_t)


def element_starts(specs: Mapping[str, ParamSpec], updates: Sequence[Mapping[str, object]], offsets: Sequence[int]
                   ) -> Optional[List[Dict[str, Tuple[int, ...]]]]:
    """The windows of ``offsets`` (one channel offset per client) as the fused kernel's layout takes them: per client,
    name -> the window's first element in every dim (:func:`hasfl_ray.ops.aggregate.build_layout`'s ``offsets``).

    A scaled dim of C channels, each ``unit`` positions wide, starts at element (offset mod C) · unit (per gate block
    in dim 0: the layout's blocked dim); an unscaled dim at 0. The window of :func:`hasfl_ray.models.slicing.
    window_index` is then exactly the op's: packed position k at element (start + k) mod (C · unit). None where a dim
    after the first is split in blocks, which the layout cannot express (the caller keeps the torch path)."""
    if any(dim.scaled and dim.blocks > 1 for spec in specs.values() for dim in spec.dims[1:]):
        return None
    starts: Dict[Tuple[str, int], Tuple[int, ...]] = {}
    out = []
    for update, offset in zip(updates, offsets):
        client = {}
        for name in update:
            key = (name, offset)
            if key not in starts:
                starts[key] = tuple((offset % dim.channels) * dim.unit if dim.scaled else 0 for dim in specs[name].dims)
            client[name] = starts[key]
        out.append(client)
    return out


def _aggregate_mixed(specs: Mapping[str, ParamSpec], updates: Sequence[Mapping[str, torch.Tensor]],
                     offsets: Sequence[int], weights: torch.Tensor) -> AggregateResult:
    first = next(t for u in updates for t in u.values())
    dtype, device = first.dtype, first.device
    div_num = torch.zeros(len(updates), dtype=torch.float64)
    div_den = torch.zeros(len(updates), dtype=torch.float64)
    delta: Dict[str, torch.Tensor] = {}
    covered = total = 0
    for name, spec in specs.items():
        numerator = torch.zeros(spec.shape, dtype=dtype, device=device)
        denominator = torch.zeros(spec.shape, dtype=dtype, device=device)
        positions = {}
        for i, update in enumerate(updates):
            packed = update.get(name)
            if packed is None:
                continue
            # a window never repeats a channel, so the flat positions of one client are distinct
            positions[i] = window_linear_index(spec, packed.shape, offsets[i], device).flatten()
            numerator.view(-1).index_add_(0, positions[i], packed.flatten(), alpha=float(weights[i]))
            denominator.view(-1).index_add_(0, positions[i], torch.full_like(packed.flatten(), float(weights[i])))
        covered_mask = denominator > 0
        mean = torch.where(covered_mask, numerator / torch.where(covered_mask, denominator, 1), 0)
        delta[name] = mean
        covered += int(covered_mask.sum())
        total += mean.numel()
        for i, flat in positions.items():
            packed = updates[i][name].flatten().to(torch.float64)
            mean_at = mean.view(-1)[flat].to(torch.float64)
            div_num[i] += (packed - mean_at).square().sum().cpu()
            div_den[i] += mean_at.square().sum().cpu()
    return AggregateResult(delta, div_num, div_den, covered / total if total else 0.0)
