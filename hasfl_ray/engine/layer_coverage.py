"""Per-layer coverage of a round's updates: the fraction of each parameter's coordinates some client covers."""

from __future__ import annotations

import math
from typing import Dict, Mapping, Sequence, Tuple

import torch

from hasfl_ray.aggregation.packed import SPARSE_TYPES, dense_of
from hasfl_ray.models.slicing import ParamSpec, window_indices


def _union(spec: ParamSpec, found) -> torch.Tensor:
    """The bool mask of the (shape, offset) regions in ``found``: a window is the product of its dims' index sets,
    an outer AND of one boolean vector per dim."""
    union = torch.zeros(spec.shape, dtype=torch.bool)
    for shape, offset in found:
        region = torch.ones((), dtype=torch.bool)
        for size, index in zip(spec.shape, window_indices(spec, shape, offset)):
            axis = torch.zeros(size, dtype=torch.bool)
            axis[index] = True
            region = region.unsqueeze(-1) & axis
        union |= region
    return union


def layer_coverage(specs: Mapping[str, ParamSpec], updates: Sequence[Mapping[str, torch.Tensor]],
                   offsets: Sequence[int]) -> Dict[str, float]:
    """Parameter name -> fraction of its coordinates that at least one of ``updates`` covers (its packed tensor's
    leading slice, or the window at its offset), from the packed shapes alone: the aggregate's coverage per layer.

    Each distinct (shape, offset) of a parameter counts once; when they share one offset and one shape holds every
    other (nested slices, or windows from one position: FedRolex's round), the largest is the union, otherwise the
    union is counted on a boolean mask of the parameter.
    """
    regions: Dict[str, Dict[Tuple[Tuple[int, ...], int], None]] = {name: {} for name in specs}
    held: Dict[str, torch.Tensor] = {}  # union of the index-set and masked updates' coordinates
    for update, offset in zip(updates, offsets):
        for name, packed in update.items():
            if isinstance(packed, SPARSE_TYPES):
                mask = dense_of(packed, specs[name].shape)[1].cpu()
                held[name] = mask if name not in held else held[name] | mask
                continue
            regions[name][(tuple(packed.shape), offset)] = None
    coverage = {}
    for name, spec in specs.items():
        total, found = math.prod(spec.shape), list(regions[name])
        largest = max((shape for shape, _ in found), key=math.prod, default=None)
        if not found:
            covered = 0
        elif all(offset == found[0][1] and all(map(int.__le__, shape, largest)) for shape, offset in found):
            covered = math.prod(largest)
        else:
            covered = int(_union(spec, found).sum())
        if name in held:
            covered = int((_union(spec, found) | held[name]).sum())
        coverage[name] = covered / total if total else 0.0
    return coverage
