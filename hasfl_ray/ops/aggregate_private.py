"""The fused aggregation with client-level DP in its pass: ``hasfl_ray::aggregate_private_into`` and, with index sets
and masks (and the label split's masks), ``hasfl_ray::aggregate_private_sparse_into`` (CPU; CUDA where the extension
is built with it: csrc/cuda/aggregate_private_cuda.cu, compiled for sm_90 but not yet run on a card).

One call clips each client's packed update to its bound (C over its repeats, as
:func:`hasfl_ray.aggregation.privacy.clip_updates`), takes the weighted mean over each coordinate's holders, counts
them (k_j) and adds the Gaussian noise of :func:`hasfl_ray.aggregation.privacy.noised` — ξ_j / k_j where k_j > 0
(fixed-size sampling), or (Δ̄_j k_j + ξ_j) / (q N) everywhere (Poisson participation) — with ξ_j = std · normal(seed,
offset, j) from a counter-based generator (Philox4x32-10 keyed by the seed, counter (offset, j), j the coordinate's
index in the flat output of ``global_shapes`` in order): the draws depend on nothing but (seed, offset, j), so the
result is the same with any number of threads (csrc/cpu/aggregate_private.cpp).

Scope: the dense layouts (leading slices, rolling windows, gate blocks; :func:`aggregate_private`) and the sparse ones
beside them (index sets, masks, the label split's output layer with its ``aside`` rows; :func:`aggregate_private_sparse`,
the tables of :func:`hasfl_ray.ops.sparse.build_sparse_layout`). normal(seed, offset, j) is one definition for the CPU
and CUDA kernels (csrc/private_normal.h), so either device adds the same draws; the torch path of
:func:`hasfl_ray.aggregation.privacy.privatize` (``--aggregation reference``) adds them too
(:func:`hasfl_ray.aggregation.privacy.normal_draws`). The server takes these ops where the round's layout has them
(:func:`hasfl_ray.engine.server_privacy.fused_form`). Checked against float64 oracles in
tests/aggregation/test_private_fused.py, test_private_fused_windows.py, test_private_fused_sparse.py,
test_private_fused_label_split.py and, on a GPU, test_private_cuda.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch

from hasfl_ray.aggregation.result import AggregateResult
from hasfl_ray.ops import aggregate as ops


@dataclass
class PrivateAggregate:
    """What one private call returns.

    Attributes:
        result: the noised mean (``delta``; the clients' dtype) and the divergence norms of the clipped updates
            against the noiseless mean (``div_num``, ``div_den``), the covered fraction.
        counts: name -> k_j, float64 of the parameter's shape (0 where no client holds j).
        norms: float64 (num_clients,), each client's L2 norm over its packed values before clipping.
    """

    result: AggregateResult
    counts: Dict[str, torch.Tensor]
    norms: torch.Tensor  # (CPU; counts on the updates' device)


def available() -> bool:
    """Whether the built extension registers the private op (a build older than it does not)."""
    return ops.available() and hasattr(torch.ops.hasfl_ray, "aggregate_private_into")


def sparse_available() -> bool:
    """Whether the built extension registers the private op of index sets and masks."""
    return available() and hasattr(torch.ops.hasfl_ray, "aggregate_private_sparse_into")


def cuda_available() -> bool:
    """Whether both private ops have their CUDA kernel (csrc/cuda/aggregate_private_cuda.cu: a build with CUDA)."""
    return sparse_available() and all(
        torch._C._dispatch_has_kernel_for_dispatch_key(f"hasfl_ray::{op}", "CUDA")
        for op in ("aggregate_private_into", "aggregate_private_sparse_into"))


def normals(seed: int, offset: int, n: int) -> torch.Tensor:
    """The op's standard normal draws normal(seed, offset, j) for j < n, float64 (what the noise is made of)."""
    if not available():
        raise RuntimeError("the private fused aggregation needs a build of hasfl_ray._C that has it; rebuild it "
                           "with `pip install --no-build-isolation -e .`")
    return torch.ops.hasfl_ray.private_normals(int(seed), int(offset), int(n))


def aggregate_private(global_shapes: Mapping[str, Tuple[int, ...]], updates: Sequence[Mapping[str, torch.Tensor]],
                      weights: Sequence[float], bounds: Sequence[float], noise_std: float, seed: int, offset: int,
                      expected: Optional[float] = None, gate_blocks: Optional[Mapping[str, int]] = None,
                      offsets: Optional[Sequence[Mapping[str, Sequence[int]]]] = None) -> PrivateAggregate:
    """Clip, weighted mean over the holders, holder counts and noise in one pass (module docstring).

    Args:
        global_shapes, updates, gate_blocks, offsets: as for :func:`hasfl_ray.ops.aggregate.aggregate_fused`
            (CPU tensors of one float dtype, dense packings; validated here like :func:`hasfl_ray.aggregate_updates`).
        weights: one positive weight per client (DP uses 1 each: the count-weighted mean).
        bounds: each client's clip bound (C / its repeats; ``math.inf``: not clipped).
        noise_std: z·C, the std of ξ_j (0: no noise).
        seed, offset: the noise's key (e.g. the run's privacy key and the update number), int64 each.
        expected: Poisson participation's q·N, the denominator at every coordinate; None: fixed-size sampling.
    """
    _check(available(), bounds, updates)
    from hasfl_ray.aggregation import validate_inputs

    global_shapes, weights_t, blocks = validate_inputs(global_shapes, updates, list(weights), gate_blocks)
    layout = ops.build_layout(global_shapes, updates, blocks, offsets)
    out, weights_t, bounds_t = _buffers(layout.packed[0], layout.total_numel, weights_t, bounds)
    got = torch.ops.hasfl_ray.aggregate_private_into(
        out, layout.packed, layout.params, layout.entries, weights_t, bounds_t, float(noise_std), int(seed),
        int(offset), None if expected is None else float(expected))
    return _unpacked(out, got, layout.names, layout.shapes, layout.total_numel, layout.names)


def aggregate_private_sparse(global_shapes: Mapping[str, Tuple[int, ...]], updates: Sequence[Mapping[str, object]],
                             weights: Sequence[float], bounds: Sequence[float], noise_std: float, seed: int,
                             offset: int, expected: Optional[float] = None,
                             gate_blocks: Optional[Mapping[str, int]] = None,
                             offsets: Optional[Sequence[Mapping[str, Sequence[int]]]] = None,
                             aside: Sequence[Tuple[int, Mapping[str, object]]] = ()) -> PrivateAggregate:
    """:func:`aggregate_private` where some client holds a parameter as an index set or a mask
    (:class:`~hasfl_ray.aggregation.packed.IndexedUpdate`, :class:`~hasfl_ray.aggregation.packed.MaskedUpdate`)
    beside slices: the tables of :func:`hasfl_ray.ops.sparse.build_sparse_layout`, each client's norm over its
    packed values, the noise of coordinate j keyed by j's index in the flat model (``global_shapes`` in order, as
    the dense op's: the layout puts the dense parameters first, so each parameter's output is moved to its place).

    ``offsets``: the dense parameters' window starts per client (:func:`aggregate_private`'s). ``aside``: (client,
    packed values) of coordinates a client trained but is not averaged over (the label split's rows of labels it
    does not hold, :func:`hasfl_ray.aggregation.label_split.split_by_label`): they count in its norm and its
    divergence norms, not in any mean or k_j (the op's ``uncounted`` entries)."""
    _check(sparse_available(), bounds, updates)
    from hasfl_ray.aggregation import validate_inputs
    from hasfl_ray.ops.sparse import build_sparse_layout

    global_shapes, weights_t, blocks = validate_inputs(global_shapes, updates, list(weights), gate_blocks)
    names = tuple(global_shapes)
    owners = [client for client, _ in aside]
    layout = build_sparse_layout(global_shapes, list(updates) + [part for _, part in aside], blocks,
                                 None if offsets is None else list(offsets) + [{} for _ in aside])
    where, start = {}, 0
    for name in names:
        where[name] = start
        start += math.prod(global_shapes[name])
    params = layout.params.clone()
    params[:, ops._PARAM_OUT_OFFSET] = torch.tensor([where[name] for name in layout.names], dtype=torch.int64)
    entries, uncounted = layout.entries, None
    if aside:  # the aside parts' entries belong to their clients, uncounted
        entries = entries.clone()
        column = entries[:, ops._ENTRY_CLIENT]
        extra = column >= len(updates)
        uncounted = extra.to(torch.uint8).contiguous()
        column[extra] = torch.tensor(owners, dtype=torch.int64)[column[extra] - len(updates)]
    out, weights_t, bounds_t = _buffers(layout.packed[0], layout.total_numel, weights_t, bounds)
    got = torch.ops.hasfl_ray.aggregate_private_sparse_into(
        out, layout.packed, params, entries, weights_t, bounds_t, float(noise_std), int(seed), int(offset),
        None if expected is None else float(expected), layout.kinds, layout.bits, layout.rows, layout.row_offsets,
        uncounted)
    return _unpacked(out, got, names, tuple(tuple(global_shapes[n]) for n in names), layout.total_numel, names)


def _check(present: bool, bounds: Sequence[float], updates: Sequence[Mapping[str, object]]) -> None:
    if not present:
        raise RuntimeError("the private fused aggregation needs a build of hasfl_ray._C that has it; rebuild it "
                           "with `pip install --no-build-isolation -e .`")
    if len(bounds) != len(updates):
        raise ValueError(f"bounds has {len(bounds)} entries but updates has {len(updates)} clients; expected one "
                         "bound per client")


def _buffers(first: torch.Tensor, total: int, weights, bounds):
    if first.device.type not in ("cpu", "cuda") or (first.device.type == "cuda" and not cuda_available()):
        raise ValueError(f"the updates are on {first.device} but this build of the private fused aggregation runs on "
                         f"the CPU{' and CUDA' if cuda_available() else ''}; expected updates there")
    out = torch.empty(total, dtype=first.dtype, device=first.device)
    weights_t = torch.as_tensor(weights, dtype=torch.float64).cpu().contiguous()
    bounds_t = torch.as_tensor(list(bounds), dtype=torch.float64).contiguous()
    return out, weights_t, bounds_t


def _unpacked(out, got, names, shapes, total, order) -> PrivateAggregate:
    """The op's flat output and counts (``names``' order, each of ``shapes``) as dicts in ``order``; the norms and
    divergence norms on the CPU, the output and counts on the updates' device."""
    div_num, div_den, covered, counts, norms = got
    div_num, div_den, norms = div_num.cpu(), div_den.cpu(), norms.cpu()
    sizes = [math.prod(shape) for shape in shapes]
    delta = {name: view.view(shape) for name, shape, view in zip(names, shapes, out.split(sizes))}
    count = {name: view.view(shape) for name, shape, view in zip(names, shapes, counts.split(sizes))}
    result = AggregateResult({n: delta[n] for n in order}, div_num, div_den, int(covered) / total if total else 0.0)
    return PrivateAggregate(result, {n: count[n] for n in order}, norms)


__all__ = ["PrivateAggregate", "aggregate_private", "aggregate_private_sparse", "available", "cuda_available",
           "normals", "sparse_available"]
