"""Sub-models beyond leading slices: per-layer channel index sets and unstructured masks (issue 44 item 1 a/b).

Channel index sets: a sequential conv/linear chain's parameters share *channel groups*: a weight whose dim 0
scales opens a group (its output channels); its 1-D companions (bias, batch-norm weight and bias) follow that
group; the next weight's dim 1 (its input channels) is the group before it. :func:`channel_groups` reads the
groups off the models' :class:`~hasfl_ray.models.slicing.ParamSpec` (in spec order); a client is then given one
sorted channel list per group and :func:`index_sets` turns them into per-parameter, per-dim index lists (a
flattened dim's channel c covers its ``unit`` positions; gate blocks repeat the list per block), so the next
layer's input channels follow. Residual networks, whose groups are shared across skips, are not sequential
chains: their dims name their groups (``DimSlice.group``, :mod:`hasfl_ray.models.resnet_groups`: one per stage's
residual stream, one per block's inner activation) and :func:`channel_groups` reads those.

Masks: any subset of each tensor's coordinates, a bool tensor of the parameter's shape.

``extract_*`` cut a client's packed sub-model (values plus index lists or bitmask, never the dense tensor);
``insert_*_`` write one back into full tensors (the server's inverse).
"""

from __future__ import annotations

import operator
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.aggregation.packed import IndexedUpdate, MaskedUpdate, mask_storage_problem, unpack_bits
from hasfl_ray.models.slicing import ParamSpec, width_channels

#: (parameter name, dim) -> channel group.
Groups = Dict[Tuple[str, int], int]
IndexSets = Dict[str, Tuple[Optional[torch.Tensor], ...]]


def channel_groups(specs: Mapping[str, ParamSpec]) -> Tuple[Groups, List[int]]:
    """The scaled dims' channel groups, and each group's channel count: the groups the dims name where they name
    them (a residual network's, :mod:`hasfl_ray.models.resnet_groups`), else those of a sequential chain."""
    if any(dim.group is not None for spec in specs.values() for dim in spec.dims):
        return named_groups(specs)
    groups: Groups = {}
    sizes: List[int] = []
    current: Optional[int] = None
    for name, spec in specs.items():
        dims = spec.dims
        blocked = next((d for d, dim in enumerate(dims) if dim.blocks > 1), None)
        if blocked is not None:  # the spec cannot tell whose blocks: an LSTM's/GRU's gates, attention's, declared
            raise ValueError(f"parameter {name!r} is {dims[blocked].blocks} blocks in dim {blocked} (an RNN's "
                             "gates, q/k/v or slice_blocks); expected a sequential conv/linear chain, whose "
                             "parameters have none")
        if len(dims) >= 2:
            if dims[1].scaled:
                if current is None:
                    raise ValueError(f"parameter {name!r} scales its input dim before any layer scales its output; "
                                     "expected a sequential conv/linear chain")
                if dims[1].channels != sizes[current]:
                    raise ValueError(f"parameter {name!r} takes {dims[1].channels} input channels but the layer "
                                     f"before it has {sizes[current]}; expected a sequential conv/linear chain")
                groups[(name, 1)] = current
            if dims[0].scaled:
                sizes.append(dims[0].channels)
                current = len(sizes) - 1
                groups[(name, 0)] = current
        elif dims and dims[0].scaled:
            if current is None or dims[0].channels != sizes[current]:
                raise ValueError(f"parameter {name!r} scales {dims[0].channels} channels that follow no layer of "
                                 "that many; expected a sequential conv/linear chain")
            groups[(name, 0)] = current
    return groups, sizes


def named_groups(specs: Mapping[str, ParamSpec]) -> Tuple[Groups, List[int]]:
    """Channel groups named by the dims (``DimSlice.group``), numbered in order of first appearance; every scaled
    dim must name one, and every dim of a group have the group's channel count."""
    groups: Groups = {}
    sizes: List[int] = []
    number: Dict[str, int] = {}
    for name, spec in specs.items():
        for d, dim in enumerate(spec.dims):
            if not dim.scaled:
                continue
            if dim.group is None or dim.blocks > 1:
                raise ValueError(f"parameter {name!r} scales dim {d} outside any named channel group; expected "
                                 "every scaled dim of a residual network to name its group (an exit head has none)")
            if dim.group not in number:
                number[dim.group] = len(sizes)
                sizes.append(dim.channels)
            elif sizes[number[dim.group]] != dim.channels:
                raise ValueError(f"parameter {name!r} has {dim.channels} channels in group {dim.group!r}, which has "
                                 f"{sizes[number[dim.group]]}; expected one channel count per group")
            groups[(name, d)] = number[dim.group]
    return groups, sizes


def group_names(specs: Mapping[str, ParamSpec]) -> List[str]:
    """A name for each channel group, in group order: the name the dims give it, or (a sequential chain) the
    parameter whose output opens it."""
    groups, sizes = channel_groups(specs)
    names: List[Optional[str]] = [None] * len(sizes)
    for (name, d), group in groups.items():
        if names[group] is None:
            label = specs[name].dims[d].group
            names[group] = label if label is not None else name.rsplit(".", 1)[0]
    return [str(n) for n in names]


def _one_value(item: Any) -> str:
    """``item`` for a one-line sentence: a tensor or array of values (a 2-D group's row) by its kind and shape, else
    its repr on one line, at most 40 characters (a tensor's repr runs over lines)."""
    shape = getattr(item, "shape", None)
    if shape is not None and len(shape) > 0:
        return f"a {type(item).__name__} of shape {tuple(shape)} (a group is one flat list)"
    text = " ".join(repr(item).split())
    return text if len(text) <= 40 else text[:37] + "..."


def channel_numbers(group: int, chosen: Any) -> Tuple[int, ...]:
    """Group ``group``'s channel numbers as ints: Python, numpy or torch integers (a 1-D integer tensor or array
    too); anything else (a float such as 2.0 or 1.5, a bool) is one sentence, never rounded."""
    try:
        items = None if isinstance(chosen, (dict, str, bytes)) else list(chosen)
    except TypeError:
        items = None
    if items is None:
        kind = type(chosen).__name__
        raise ValueError(f"channel_sets[{group}] is {'an' if kind[0] in 'aeiou' else 'a'} {kind}; expected a list "
                         "of channel numbers")
    numbers = []
    for item in items:
        kind = getattr(item, "dtype", None)
        if isinstance(item, (bool, np.bool_)) or kind == torch.bool:
            number = None
        else:
            try:
                number = operator.index(item)
            except TypeError:
                number = None
        if number is None:
            raise ValueError(f"channel_sets[{group}] holds {_one_value(item)}, which is not an integer; expected "
                             "integer channel numbers")
        numbers.append(number)
    return tuple(numbers)


def check_channel_sets(channel_sets: Sequence[Sequence[int]], sizes: Sequence[int]) -> List[torch.Tensor]:
    """``channel_sets`` (one per group) as int64 tensors; a bad one is one sentence."""
    if len(channel_sets) != len(sizes):
        raise ValueError(f"channel_sets has {len(channel_sets)} lists; expected one per channel group ({len(sizes)})")
    checked = []
    for group, (chosen, size) in enumerate(zip(channel_sets, sizes)):
        numbers = channel_numbers(group, chosen)
        if not numbers:
            raise ValueError(f"channel_sets[{group}] is empty; expected at least one of the layer's {size} channels")
        low, high = min(numbers), max(numbers)  # Python ints: a channel past int64 is named, not torch's overflow
        if low < 0 or high >= size:
            raise ValueError(f"channel_sets[{group}] holds channel {low if low < 0 else high}, outside the layer's "
                             f"{size} channels; expected channels in [0, {size})")
        values = torch.tensor(numbers, dtype=torch.int64)
        if values.numel() > 1 and not bool((values[1:] > values[:-1]).all()):
            raise ValueError(f"channel_sets[{group}] is not strictly increasing; expected sorted channels without "
                             "duplicates")
        checked.append(values)
    return checked


def _dim_index(channels: torch.Tensor, count: int, unit: int, blocks: int) -> torch.Tensor:
    """Indices of a dim of ``blocks`` x ``count`` channels x ``unit`` positions that ``channels`` hold."""
    per_block = (channels[:, None] * unit + torch.arange(unit)[None, :]).reshape(-1)
    return (torch.arange(blocks)[:, None] * (count * unit) + per_block[None, :]).reshape(-1)


def index_sets(specs: Mapping[str, ParamSpec], channel_sets: Sequence[Sequence[int]]) -> IndexSets:
    """Per parameter, per dim, the index list a client with ``channel_sets`` holds (None: the whole dim)."""
    groups, sizes = channel_groups(specs)
    checked = check_channel_sets(channel_sets, sizes)
    sets: IndexSets = {}
    for name, spec in specs.items():
        sets[name] = tuple(_dim_index(checked[groups[(name, d)]], dim.channels, dim.unit, dim.blocks)
                           if (name, d) in groups else None for d, dim in enumerate(spec.dims))
    return sets


def random_channel_sets(specs: Mapping[str, ParamSpec], width: float, generator: torch.Generator) -> List[List[int]]:
    """ceil(width x C) channels of every group, drawn without replacement and sorted (FLuID-style sets)."""
    _, sizes = channel_groups(specs)
    return [sorted(torch.randperm(size, generator=generator)[:width_channels(width, size)].tolist())
            for size in sizes]


def extract_indexed(params: Mapping[str, torch.Tensor], sets: IndexSets) -> Dict[str, IndexedUpdate]:
    """The packed sub-model: per parameter the gathered channels (a narrower network's weights) and their lists."""
    _check_names("sets", sets, params)
    return {name: IndexedUpdate.gather(params[name], sets[name]) for name in sets}


def _check_names(what: str, given: Mapping[str, object], params: Mapping[str, torch.Tensor]) -> None:
    """Every name of ``given`` is a parameter of ``params``, else one sentence (not a KeyError of the name alone)."""
    missing = [name for name in given if name not in params]
    if missing:
        raise ValueError(f"{what} names {missing[0]!r}, which params does not have; expected names of "
                         f"{', '.join(list(params)[:6])}{', ...' if len(params) > 6 else ''}")


@torch.no_grad()
def insert_indexed_(params: Mapping[str, torch.Tensor], packed: Mapping[str, IndexedUpdate]) -> None:
    """Write each packed sub-model tensor back at its coordinates of the full tensors in ``params``."""
    for name, update in packed.items():
        full = params[name]
        grids = [torch.arange(size) if chosen is None else chosen for chosen, size in zip(update.index, full.shape)]
        if grids:
            full[torch.meshgrid(*grids, indexing="ij")] = update.values.to(full)
        else:
            full.copy_(update.values)


def check_masks(specs: Mapping[str, ParamSpec], masks: Mapping[str, torch.Tensor]) -> None:
    """Every mask a bool tensor of its parameter's shape, for a parameter of ``specs``; else one sentence."""
    for name, mask in masks.items():
        spec = specs.get(name)
        if spec is None:
            raise ValueError(f"masks names {name!r}, which the model does not have")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != spec.shape:
            got = (f"a {type(mask).__name__}" if not isinstance(mask, torch.Tensor)
                   else f"shape {tuple(mask.shape)} and dtype {mask.dtype}")
            raise ValueError(f"masks[{name!r}] has {got}; expected a torch.bool tensor of shape {spec.shape}")
        problem = mask_storage_problem(mask)
        if problem:
            raise ValueError(f"masks[{name!r}] {problem} of shape {spec.shape}")


def extract_masked(params: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> Dict[str, MaskedUpdate]:
    """The packed sub-model of unstructured masks: per parameter the held values and the bitmask."""
    _check_names("masks", masks, params)
    return {name: MaskedUpdate.gather(params[name], mask) for name, mask in masks.items()}


@torch.no_grad()
def insert_masked_(params: Mapping[str, torch.Tensor], packed: Mapping[str, MaskedUpdate]) -> None:
    """Write each masked update's values back at its set bits of the full tensors in ``params``."""
    for name, update in packed.items():
        full = params[name]
        full[unpack_bits(update.bits, full.shape).to(full.device)] = update.values.to(full)
