"""`hasfl-ray bench aggregate --layout index|mask|window`: the fused kernel on sub-model shapes beyond slices.

Federations at the paper's tier mix, as for slices (:func:`hasfl_ray.bench.aggregate.make_federation`):

* ``index``: per client, ceil(p x C) channels of every layer drawn at random (FLuID-style sets), the next
  layer's input channels following (:mod:`hasfl_ray.models.index_slicing`): :class:`IndexedUpdate` s;
* ``mask``: per client and parameter, a random mask holding the fraction of coordinates a width-p slice holds
  (FIARSE-style unstructured sub-models): :class:`MaskedUpdate` s;
* ``window``: width-p rolling windows at a random offset per client (FedRolex with mixed offsets);
* ``depth``: DepthFL-style depth sub-models of the model with exits (:mod:`hasfl_ray.models.depth`): a client of
  tier rank r (of k tiers, narrowest first) holds depth ceil((r + 1) x D / k) of the model's D depths at full width,
  i.e. the parameters :func:`~hasfl_ray.models.depth.depth_names` gives for it (a prefix of the blocks and their
  exit heads); a parameter a client does not hold is absent from its update, one nobody holds keeps the global
  value (delta 0). Plain tensors: the slice kernel's nested path, and the slice layout's torch competitors.

With ``--device cuda`` the values live on the GPU (index lists and bitmasks on the host, as on the wire).

Bytes moved count what travels: the values, the index lists or bitmasks, and the global output written once.
The pure-torch competitors compute the same result (Δ̄, both norms) in the clients' dtype, as the slice
layout's do; the fastest is "best torch".
"""

from __future__ import annotations

import math
from typing import Callable, Dict

import numpy as np
import torch

from hasfl_ray.aggregation import aggregate_updates, validate_inputs
from hasfl_ray.aggregation.packed import IndexedUpdate, MaskedUpdate
from hasfl_ray.aggregation.reference import aggregate_reference
from hasfl_ray.bench.federation import Federation
from hasfl_ray.data.partition import TIER_PROBABILITIES, TIERS
from hasfl_ray.models import build_model, gate_blocks_of
from hasfl_ray.models.depth import depth_names, exit_depths
from hasfl_ray.models.index_slicing import index_sets, random_channel_sets
from hasfl_ray.ops import aggregate as ops
from hasfl_ray.ops import calls

LAYOUTS = ("slice", "window", "index", "mask", "depth")
#: Competitors per layout (the fastest is "best torch").
TORCH_BY_LAYOUT = {"index": ("torch index_add", "torch dense"), "mask": ("torch index_add", "torch dense"),
                   "window": ("torch window scatter",)}


def make_layout_federation(model: str, num_clients: int, layout: str, seed: int = 0,
                           dtype: torch.dtype = torch.float32, device: str = "cpu") -> Federation:
    """Random updates of ``layout`` for ``num_clients`` clients of ``model`` at the tier mix; their values on
    ``device`` (index lists and bitmasks stay on the CPU, where the kernels' host side reads them)."""
    if layout == "depth":
        return make_depth_federation(model, num_clients, seed, dtype, device)
    federation = _make_layout_federation(model, num_clients, layout, seed, dtype)
    if device == "cpu":
        return federation
    from dataclasses import replace

    from hasfl_ray.aggregation.packed import to_device

    return replace(federation, updates=[{name: to_device(packed, device) for name, packed in update.items()}
                                        for update in federation.updates])


def _make_layout_federation(model: str, num_clients: int, layout: str, seed: int,
                            dtype: torch.dtype) -> Federation:
    specs = build_model(model).param_specs()
    rng = np.random.default_rng(seed)
    widths = tuple(float(p) for p in rng.choice(TIERS, size=num_clients, p=TIER_PROBABILITIES))
    generator = torch.Generator().manual_seed(seed)
    shapes = {name: spec.shape for name, spec in specs.items()}
    updates, offsets = [], []
    for p in widths:
        if layout == "index":
            sets = _random_sets(specs, p, generator)
            updates.append({name: IndexedUpdate(torch.randn(tuple(s if i is None else i.numel() for i, s in
                                                                  zip(sets[name], shapes[name])),
                                                            generator=generator, dtype=dtype), sets[name])
                            for name in specs})
        elif layout == "mask":
            update = {}
            for name, spec in specs.items():
                density = spec.numel(p) / max(spec.numel(), 1)
                mask = torch.rand(spec.shape, generator=generator) < density
                update[name] = MaskedUpdate.gather(torch.randn(spec.shape, generator=generator, dtype=dtype), mask)
            updates.append(update)
        else:
            offset = int(rng.integers(0, 1 << 20))
            updates.append({name: torch.randn(spec.sliced_shape(p), generator=generator, dtype=dtype)
                            for name, spec in specs.items()})
            offsets.append({name: tuple((offset % dim.channels) * dim.unit if dim.scaled else 0 for dim in spec.dims)
                            for name, spec in specs.items()})
    weights = torch.as_tensor(rng.integers(20, 500, num_clients), dtype=torch.float64)
    return Federation(model, shapes, updates, weights, gate_blocks_of(specs), widths, offsets or None)


def depth_model(model: str, choices=None):
    """``model``'s network with an exit after every stage (the depth layout's), or a ValueError sentence offering
    the models of ``choices`` (default: every built-in) that have depths: the caller's own list, so that the sentence
    never offers a model its caller refuses (``bench aggregate --models`` takes fewer than the built-ins)."""
    from hasfl_ray.models import MODEL_CONFIGS, build_model_from

    try:
        network = build_model_from(dict(MODEL_CONFIGS[model], exits=True)) if model in MODEL_CONFIGS else None
    except TypeError:
        network = None
    if network is None or exit_depths(network) < 2:
        offering = [name for name in (MODEL_CONFIGS if choices is None else choices) if _has_depths(name)]
        raise ValueError(f"--layout depth needs a model with depth sub-models (exits), but {model!r} has none; "
                         f"expected one of {', '.join(offering)}")
    return network


def _has_depths(name: str) -> bool:
    from hasfl_ray.models import MODEL_CONFIGS, build_model_from

    try:
        return exit_depths(build_model_from(dict(MODEL_CONFIGS[name], exits=True))) >= 2
    except TypeError:
        return False


def make_depth_federation(model: str, num_clients: int, seed: int = 0, dtype: torch.dtype = torch.float32,
                          device: str = "cpu") -> Federation:
    """Depth sub-models at the tier mix: the client of the r-th narrowest tier (of k) holds depth
    ceil((r + 1) x D / k) of D, at full width (DepthFL); its update holds exactly that depth's parameters."""
    network = depth_model(model)
    specs = network.param_specs()
    depths = exit_depths(network)
    rng = np.random.default_rng(seed)
    widths = tuple(float(p) for p in rng.choice(TIERS, size=num_clients, p=TIER_PROBABILITIES))
    generator = torch.Generator().manual_seed(seed)
    tiers = sorted(TIERS)
    updates = []
    for p in widths:
        depth = math.ceil((tiers.index(p) + 1) * depths / len(tiers))
        updates.append({name: torch.randn(specs[name].shape, generator=generator, dtype=dtype).to(device)
                        for name in depth_names(network, depth)})
    weights = torch.as_tensor(rng.integers(20, 500, num_clients), dtype=torch.float64)
    return Federation(model, {name: spec.shape for name, spec in specs.items()}, updates, weights,
                      gate_blocks_of(specs), widths)


def _random_sets(specs, p: float, generator: torch.Generator):
    """A client's index sets: per-layer channel sets of a sequential chain (the next layer's inputs following);
    for a model that is not one (the LSTM), ceil(p x size) random indices of every scaled dim, independently."""
    try:
        return index_sets(specs, random_channel_sets(specs, p, generator))
    except ValueError:
        return {name: tuple(torch.sort(torch.randperm(dim.size, generator=generator)[:dim.sliced(p)]).values
                            if dim.scaled else None for dim in spec.dims) for name, spec in specs.items()}


def wire_bytes(federation: Federation) -> int:
    """Values plus index lists or bitmasks of every client (what the layout's updates occupy on the wire)."""
    total = 0
    for update in federation.updates:
        for packed in update.values():
            total += packed.nbytes() if hasattr(packed, "nbytes") and not isinstance(packed, torch.Tensor) else \
                packed.numel() * packed.element_size()
    return total


def _flat_indices(packed, shape) -> torch.Tensor:
    """The flat coordinates a client's update holds, in its values' order."""
    if isinstance(packed, MaskedUpdate):
        bits = packed.bits
        flat = ((bits[:, None] >> torch.arange(8, dtype=torch.uint8)) & 1).reshape(-1)[:math.prod(shape)]
        return flat.nonzero().squeeze(1)
    flat = torch.zeros(1, dtype=torch.int64)
    for chosen, size in zip(packed.index, shape):
        chosen = torch.arange(size) if chosen is None else chosen
        flat = (flat[:, None] * size + chosen[None, :]).reshape(-1)
    return flat


def torch_index_add(shapes, updates, weights, blocks):
    """Per parameter: index_add of w x values at each client's flat coordinates, the mean, per-client norms."""
    first = next(u for update in updates for u in update.values()).values
    div_num = torch.zeros(len(updates), dtype=torch.float64, device=first.device)
    div_den = torch.zeros(len(updates), dtype=torch.float64, device=first.device)
    delta = {}
    for name, shape in shapes.items():
        numel = math.prod(shape)
        num = torch.zeros(numel, dtype=first.dtype, device=first.device)
        den = torch.zeros(numel, dtype=first.dtype, device=first.device)
        held = []
        for i, update in enumerate(updates):
            packed = update.get(name)
            if packed is None:
                continue
            index = _flat_indices(packed, shape).to(first.device)
            values = packed.values.reshape(-1)
            num.index_add_(0, index, values, alpha=float(weights[i]))
            den.index_add_(0, index, torch.full_like(values, float(weights[i])))
            held.append((i, index, values))
        mean = torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), 0)
        for i, index, values in held:
            local = mean[index]
            div_num[i] += (values - local).square().sum().double()
            div_den[i] += local.square().sum().double()
        delta[name] = mean.view(shape)
    return delta, div_num.cpu(), div_den.cpu()


def torch_dense(shapes, updates, weights, blocks):
    """Per client and parameter: scatter into a dense zero tensor and a dense mask, then dense arithmetic."""
    first = next(u for update in updates for u in update.values()).values
    device = first.device
    div_num = torch.zeros(len(updates), dtype=torch.float64, device=device)
    div_den = torch.zeros(len(updates), dtype=torch.float64, device=device)
    delta = {}
    for name, shape in shapes.items():
        numel = math.prod(shape)
        num = torch.zeros(numel, dtype=first.dtype, device=device)
        den = torch.zeros(numel, dtype=first.dtype, device=device)
        dense = []
        for i, update in enumerate(updates):
            packed = update.get(name)
            if packed is None:
                continue
            values = torch.zeros(numel, dtype=first.dtype, device=device)
            mask = torch.zeros(numel, dtype=torch.bool, device=device)
            mask[_flat_indices(packed, shape).to(device)] = True
            values.masked_scatter_(mask, packed.values.reshape(-1))
            num.add_(values, alpha=float(weights[i]))
            den.add_(mask.to(first.dtype), alpha=float(weights[i]))
            dense.append((i, values, mask))
        mean = torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), 0)
        for i, values, mask in dense:
            local = torch.where(mask, mean, 0)
            div_num[i] += (values - local).square().sum().double()
            div_den[i] += local.square().sum().double()
        delta[name] = mean.view(shape)
    return delta, div_num.cpu(), div_den.cpu()


def layout_implementations(federation: Federation, layout: str, include_slow: bool = True
                           ) -> Dict[str, Callable[[], object]]:
    """The timed callables of the window, index and mask layouts (fused ones only where the extension is built);
    depth's are the slice layout's (:func:`hasfl_ray.bench.aggregate.implementations`)."""
    shapes, updates, weights, blocks = federation.shapes, federation.updates, federation.weights, federation.gate_blocks
    runs: Dict[str, Callable[[], object]] = {}
    if layout == "window":
        offsets = federation.offsets
        if ops.available():
            validated = validate_inputs(shapes, updates, weights, blocks)
            built = ops.build_layout(shapes, updates, blocks, offsets)
            out = torch.empty(built.total_numel, dtype=built.packed[0].dtype)
            runs["fused kernel"] = lambda: calls.aggregate_into(out, built.packed, built.params, built.entries,
                                                                validated[1])
            runs["fused"] = lambda: ops.aggregate_fused(shapes, updates, validated[1], blocks, offsets=offsets)
        runs["torch window scatter"] = lambda: torch_index_add(
            shapes, [{n: IndexedUpdate(t, _window_index(t.shape, shapes[n], offsets[i][n], blocks.get(n, 1)))
                      for n, t in u.items()} for i, u in enumerate(updates)], weights, blocks)
        return runs
    from hasfl_ray.ops.sparse import build_sparse_layout

    if ops.available() and hasattr(torch.ops.hasfl_ray, "aggregate_sparse_into"):
        built = build_sparse_layout(shapes, updates, blocks)
        out = torch.empty(built.total_numel, dtype=built.packed[0].dtype, device=built.packed[0].device)
        runs["fused kernel"] = lambda: calls.aggregate_sparse_into(
            out, built.packed, built.params, built.entries, weights, built.kinds, built.bits, built.rows,
            built.row_offsets)
        runs["fused"] = lambda: aggregate_updates(shapes, updates, weights, blocks, backend="fused")
    runs["torch index_add"] = lambda: torch_index_add(shapes, updates, weights, blocks)
    runs["torch dense"] = lambda: torch_dense(shapes, updates, weights, blocks)
    if include_slow:
        runs["reference"] = lambda: aggregate_reference(shapes, updates, weights, blocks)
    return runs


def _window_index(packed_shape, full, start, blocks):
    """A window's per-dim indices, sorted, for the torch competitor (values reordered alike is not needed for
    timing: the competitor's work is the same for any order)."""
    index = []
    for d, (held, size) in enumerate(zip(packed_shape, full)):
        if held == size and not start[d]:
            index.append(None)
        elif d == 0 and blocks > 1:
            rows = size // blocks
            index.append(torch.sort((torch.arange(blocks)[:, None] * rows +
                                     (start[d] + torch.arange(held // blocks)) % rows).reshape(-1)).values)
        else:
            index.append(torch.sort((start[d] + torch.arange(held)) % size).values)
    return tuple(index)
