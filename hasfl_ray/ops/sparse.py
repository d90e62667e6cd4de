"""Layout of ``hasfl_ray::aggregate_sparse_into``: index-set and mask updates beside slices, in one kernel pass.

A parameter some client holds as an :class:`~hasfl_ray.aggregation.packed.IndexedUpdate` or
:class:`~hasfl_ray.aggregation.packed.MaskedUpdate` is *sparse* (kind 1); the others keep the slice/window
layout of :func:`hasfl_ray.ops.aggregate.build_layout` (kind 0) and its kernel. Every holder of a sparse
parameter is described alike, in the parameter's canonical shape (rows x last dim):

* some holder is a mask: the canonical shape is the flat tensor (one row); every holder gets a flat
  bitmask (a mask's own; an index set's or a slice's spelled out);
* else (index sets and slices): the full shape, its last two dims merged while every holder holds the last in
  full or it is shorter than ``MERGE_BELOW`` (a conv weight (o, i, 3, 3) becomes (o, i * 9)); per holder the
  sorted index list of every row dim (a slice's is a range, per gate block) and the bitmask of the last.

The packed tensors are used as they are: row-major over the held coordinates, which is row-major over the
canonical shape (merging dims keeps that order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.aggregation.packed import IndexedUpdate, MaskedUpdate, SPARSE_TYPES, joined_indices
from hasfl_ray.aggregation.result import AggregateResult
from hasfl_ray.ops import aggregate as dense_ops

#: Merge the last two canonical dims of an index-set parameter while the last is shorter than this (or held in
#: full by every holder).
MERGE_BELOW = 512


@dataclass(frozen=True)
class SparseLayout:
    """The tables of one ``aggregate_sparse_into`` call (see ``csrc/aggregate_sparse_host.h``)."""

    names: Tuple[str, ...]   # in the flat output's order: dense parameters first, then sparse ones
    shapes: Tuple[Tuple[int, ...], ...]
    total_numel: int
    num_clients: int
    packed: List[torch.Tensor]
    params: torch.Tensor
    entries: torch.Tensor
    kinds: torch.Tensor
    bits: List[torch.Tensor]
    rows: torch.Tensor
    row_offsets: torch.Tensor


def _slice_lists(full: Tuple[int, ...], shape: Tuple[int, ...], blocks: int) -> List[np.ndarray]:
    """Per dim, the indices a leading slice of ``shape`` holds (dim 0 inside each of ``blocks`` gate blocks)."""
    lists = [np.arange(size, dtype=np.int64) for size in shape]
    if blocks > 1 and full:
        rows, held = full[0] // blocks, shape[0] // blocks
        lists[0] = (np.arange(blocks, dtype=np.int64)[:, None] * rows + np.arange(held, dtype=np.int64)).ravel()
    return lists


def _lists_of(packed, full: Tuple[int, ...], blocks: int) -> List[np.ndarray]:
    if isinstance(packed, IndexedUpdate):
        return [np.arange(size, dtype=np.int64) if chosen is None else chosen.cpu().numpy()
                for chosen, size in zip(packed.index, full)]
    return _slice_lists(full, tuple(packed.shape), blocks)


def _values_of(packed) -> torch.Tensor:
    return packed if isinstance(packed, torch.Tensor) else packed.values


def _flat_bits(packed, full: Tuple[int, ...], blocks: int) -> torch.Tensor:
    """A holder's flat bitmask of the full shape (a mask's own, else spelled out from its index lists)."""
    if isinstance(packed, MaskedUpdate):
        return packed.bits
    mask = np.zeros(full if full else (1,), dtype=bool)
    lists = _lists_of(packed, full, blocks) if full else [np.zeros(1, np.int64)]
    mask[np.ix_(*lists)] = True
    return torch.from_numpy(np.packbits(mask.ravel(), bitorder="little"))


def _index_lists(holders, full: Tuple[int, ...], blocks: int) -> List[List[np.ndarray]]:
    """Per dim, every holder's sorted index list there (an index set's, its None as the whole dim, or a slice's): one
    concatenation per dim (a tensor's .numpy() alone costs more than a microsecond)."""
    whole = [np.arange(size, dtype=np.int64) for size in full]
    slices = {k: _slice_lists(full, tuple(p.shape), blocks) for k, p in enumerate(holders)
              if not isinstance(p, IndexedUpdate)}
    per_dim = []
    for dim in range(len(full)):
        index = [None if k in slices else p.index[dim] for k, p in enumerate(holders)]
        chosen = [t for t in index if t is not None]
        pieces = iter(())
        if chosen:
            joined = joined_indices(chosen)
            ends = np.cumsum([t.numel() for t in chosen]).tolist()
            pieces = iter([joined[start:end] for start, end in zip([0] + ends[:-1], ends)])
        per_dim.append([slices[k][dim] if k in slices else whole[dim] if t is None else next(pieces)
                        for k, t in enumerate(index)])
    return per_dim


def _indicator_matrix(lists: Sequence[np.ndarray], size: int) -> np.ndarray:
    """[holders, size] bool: row k set at holder k's indices."""
    lengths = [len(chosen) for chosen in lists]
    matrix = np.zeros((len(lists), size), dtype=bool)
    flat = np.concatenate(lists)
    flat += np.repeat(np.arange(len(lists), dtype=np.int64) * size, lengths)  # (a copy: lists untouched)
    matrix.reshape(-1)[flat] = True
    return matrix


def _merge(dims: List[int], per_dim: List[List[np.ndarray]]) -> Tuple[List[int], np.ndarray]:
    """Merge the last two dims while every holder holds the last one in full (a conv's kernel positions) or it is
    shorter than MERGE_BELOW; every holder's indicators alike (the merged dim's is the outer AND, row-major), all
    holders at once. Returns the dims and the last one's [holders, size] indicators (``per_dim``: per dim, each
    holder's index list; the row dims need no indicators). Rows stay rows otherwise: the kernel skips a row an entry
    does not hold at the cost of one lookup."""
    last = _indicator_matrix(per_dim[len(dims) - 1], dims[-1])
    while len(dims) > 1 and (dims[-1] < MERGE_BELOW or last.all()):
        outer = _indicator_matrix(per_dim[len(dims) - 2], dims[-2])
        last = (outer[:, :, None] & last[:, None, :]).reshape(len(outer), -1)
        dims = dims[:-2] + [dims[-2] * dims[-1]]
    return dims, last


def build_sparse_layout(global_shapes: Mapping[str, Tuple[int, ...]], updates: Sequence[Mapping[str, object]],
                        gate_blocks: Mapping[str, int],
                        offsets: Optional[Sequence[Mapping[str, Sequence[int]]]] = None) -> SparseLayout:
    """The tables of validated inputs where some parameter is held as an index set or a mask (``offsets``: the
    dense parameters' window starts per client, as :func:`hasfl_ray.ops.aggregate.build_layout` takes them; the
    sparse parameters' entries are never rolled)."""
    sparse_names = {name for update in updates for name, packed in update.items() if isinstance(packed, SPARSE_TYPES)}
    dense_shapes = {name: shape for name, shape in global_shapes.items() if name not in sparse_names}
    dense_updates = [{name: t for name, t in update.items() if name not in sparse_names} for update in updates]
    if offsets is not None:
        offsets = [{name: start for name, start in client.items() if name not in sparse_names} for client in offsets]
    if dense_shapes:
        dense = dense_ops.build_layout(dense_shapes, dense_updates, gate_blocks, offsets)
        param_blocks, entry_blocks = [dense.params.numpy()], [dense.entries.numpy()]
        packed, names, shapes = list(dense.packed), list(dense.names), list(dense.shapes)
        out_offset = dense.total_numel
    else:
        param_blocks, entry_blocks, packed, names, shapes, out_offset = [], [], [], [], [], 0
    num_dense_entries = len(packed)
    bits: List[torch.Tensor] = [torch.empty(0, dtype=torch.uint8)] * num_dense_entries
    row_lists: List[np.ndarray] = []
    row_offsets: List[np.ndarray] = [np.zeros((num_dense_entries, dense_ops.MAX_DIMS), np.int64)]
    rows_used = 0
    entry_begin = num_dense_entries
    for name, full in global_shapes.items():
        if name not in sparse_names:
            continue
        full = tuple(full)
        blocks = gate_blocks.get(name, 1)
        holders = [(client, update[name]) for client, update in enumerate(updates) if name in update]
        masked = any(isinstance(p, MaskedUpdate) for _, p in holders)
        if masked:
            dims = [math.prod(full)]  # a scalar: 1; a parameter of no coordinates: 0 (nothing to write)
            lists = [[None] for _ in holders]
            last_bits = [_flat_bits(p, full, blocks) for _, p in holders]
            last_sizes = [_values_of(p).numel() for _, p in holders]
        else:
            dims = list(full) if full else [1]
            parts = [p for _, p in holders]
            per_dim = _index_lists(parts, full, blocks) if full else [[np.zeros(1, np.int64)] * len(parts)]
            dims, last = _merge(dims, per_dim)
            # The row dims are never merged: their lists are the holders' own (sorted, validated).
            lists = [[per_dim[dim][k] for dim in range(len(dims) - 1)] for k in range(len(holders))]
            packed_bits = torch.from_numpy(np.packbits(last, axis=1, bitorder="little"))
            last_bits = list(packed_bits.unbind(0))
            last_sizes = last.sum(axis=1, dtype=np.int64).tolist()
        if len(dims) > dense_ops.MAX_DIMS:
            raise ValueError(f"global_shapes[{name!r}] keeps {len(dims)} dims; the fused kernel handles at most "
                             f"{dense_ops.MAX_DIMS}")
        index = len(names)
        count = len(holders)
        entry_rows = np.zeros((count, dense_ops.ENTRY_COLS), np.int64)
        offsets = np.zeros((count, dense_ops.MAX_DIMS), np.int64)
        entry_rows[:, dense_ops._ENTRY_PACKED:dense_ops._ENTRY_PACKED + dense_ops.MAX_DIMS] = 1
        entry_rows[:, dense_ops._ENTRY_CLIENT] = [client for client, _ in holders]
        entry_rows[:, dense_ops._ENTRY_PARAM] = index
        row_dims = len(dims) - 1
        if row_dims:  # each holder's row lists follow one another in `rows`, holder by holder, dim by dim
            lengths = np.array([[len(chosen) for chosen in holder] for holder in lists], np.int64)
            entry_rows[:, dense_ops._ENTRY_PACKED:dense_ops._ENTRY_PACKED + row_dims] = lengths
            ends = np.cumsum(lengths.ravel()).reshape(lengths.shape)
            offsets[:, :row_dims] = rows_used + ends - lengths
            rows_used += int(ends[-1, -1])
            row_lists.extend(chosen for holder in lists for chosen in holder)
        entry_rows[:, dense_ops._ENTRY_PACKED + row_dims] = last_sizes
        packed.extend(_values_of(p) for _, p in holders)
        bits.extend(last_bits)
        param = np.zeros(dense_ops.PARAM_COLS, np.int64)
        param[dense_ops._PARAM_NDIM] = len(dims)
        param[dense_ops._PARAM_FULL:dense_ops._PARAM_FULL + dense_ops.MAX_DIMS] = 1
        param[dense_ops._PARAM_FULL:dense_ops._PARAM_FULL + len(dims)] = dims
        param[dense_ops._PARAM_OUT_OFFSET] = out_offset
        param[dense_ops._PARAM_ENTRY_BEGIN], param[dense_ops._PARAM_ENTRY_END] = entry_begin, entry_begin + count
        param_blocks.append(param[None, :])
        entry_blocks.append(entry_rows)
        row_offsets.append(offsets)
        names.append(name)
        shapes.append(full)
        out_offset += math.prod(full)
        entry_begin += count
    kinds = np.zeros(len(names), np.int64)
    kinds[len(dense_shapes):] = 1
    return SparseLayout(
        names=tuple(names), shapes=tuple(shapes), total_numel=out_offset, num_clients=len(updates), packed=packed,
        params=torch.from_numpy(np.ascontiguousarray(np.concatenate(param_blocks))),
        entries=torch.from_numpy(np.ascontiguousarray(np.concatenate(entry_blocks))),
        kinds=torch.from_numpy(kinds), bits=bits,
        rows=torch.from_numpy(np.concatenate(row_lists) if row_lists else np.zeros(0, np.int64)),
        row_offsets=torch.from_numpy(np.ascontiguousarray(np.concatenate(row_offsets))))


def run_sparse_layout(layout: SparseLayout, weights: torch.Tensor,
                      order: Optional[Sequence[str]] = None) -> AggregateResult:
    """Run the op on a layout; ``delta`` in ``order`` (default: the layout's)."""
    first = layout.packed[0]
    out = torch.empty(layout.total_numel, dtype=first.dtype, device=first.device)
    from hasfl_ray.ops import calls

    div_num, div_den, covered = calls.aggregate_sparse_into(
        out, layout.packed, layout.params, layout.entries, weights, layout.kinds, layout.bits, layout.rows,
        layout.row_offsets)
    views: Dict[str, torch.Tensor] = {}
    start = 0
    for name, shape in zip(layout.names, layout.shapes):
        size = math.prod(shape)
        views[name] = out[start:start + size].view(shape)
        start += size
    delta = {name: views[name] for name in (order or layout.names)}
    total = layout.total_numel
    if div_num.device.type != "cpu":
        div_num, div_den, covered = div_num.cpu(), div_den.cpu(), covered.cpu()
    return AggregateResult(delta, div_num, div_den, int(covered) / total if total else 0.0)


def has_sparse(updates: Sequence[Mapping[str, object]]) -> bool:
    """Whether any client holds some parameter as an index set or a mask."""
    return any(isinstance(packed, SPARSE_TYPES) for update in updates for packed in update.values())


def aggregate_sparse(global_shapes: Mapping[str, Tuple[int, ...]], updates: Sequence[Mapping[str, object]],
                     weights: torch.Tensor, gate_blocks: Mapping[str, int]) -> AggregateResult:
    """Aggregate validated inputs, some of them index sets or masks, with the fused kernel."""
    if not dense_ops.available() or not hasattr(torch.ops.hasfl_ray, "aggregate_sparse_into"):
        raise RuntimeError("the fused aggregation of index sets and masks needs the compiled extension "
                           "hasfl_ray._C (rebuilt since aggregate_sparse_into); build it with "
                           "`pip install --no-build-isolation -e .`")
    weights = torch.as_tensor(weights, dtype=torch.float64).cpu().contiguous()
    layout = build_sparse_layout(global_shapes, updates, gate_blocks)
    return run_sparse_layout(layout, weights, order=tuple(global_shapes))
