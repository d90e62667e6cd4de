"""Coordinate-wise weighted aggregation of packed sub-model updates, with per-client divergence norms."""

from __future__ import annotations

import logging
import math
import operator
from typing import Mapping, Optional, Sequence, Tuple, Union

import torch

from hasfl_ray.aggregation.packed import (SPARSE_TYPES, IndexedUpdate, MaskedUpdate, check_packed, check_structure,
                                          contents_hold)
from hasfl_ray.aggregation.reference import aggregate_reference
from hasfl_ray.aggregation.result import AggregateResult

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "fused", "reference")
_FLOAT_DTYPES = (torch.float32, torch.float64)


def _checked_shape(name: str, shape) -> Tuple[int, ...]:
    """``global_shapes[name]`` as a tuple of ints: a sequence of non-negative integers (Python, numpy, torch.Size);
    anything else (a float such as 2.5, never truncated; a bool; a negative size; a number or a string) is one
    sentence."""
    try:
        dims = tuple(operator.index(size) for size in shape if not isinstance(size, bool)) \
            if isinstance(shape, (tuple, list, torch.Size)) else None
    except TypeError:
        dims = None
    if dims is None or len(dims) != len(shape) or any(size < 0 for size in dims):
        raise ValueError(f"global_shapes[{name!r}] is {shape!r}; expected a tuple of non-negative integer sizes")
    return dims


def validate_inputs(global_shapes: Mapping[str, Sequence[int]], updates: Sequence[Mapping[str, torch.Tensor]],
                    weights, gate_blocks: Optional[Mapping[str, int]]) -> Tuple[dict, torch.Tensor, dict]:
    """Check the aggregation arguments; raise ValueError/TypeError with one sentence naming the argument.

    Returns the normalised ``(global_shapes, weights as float64 CPU tensor, gate_blocks)``.
    """
    if not isinstance(global_shapes, Mapping) or not global_shapes:
        raise ValueError("global_shapes must be a non-empty mapping of parameter name to full shape")
    shapes = {name: _checked_shape(name, shape) for name, shape in global_shapes.items()}
    blocks = dict(gate_blocks or {})
    for name, g in list(blocks.items()):
        if name not in shapes:
            raise ValueError(f"gate_blocks names {name!r}, which is not in global_shapes")
        try:  # Python, numpy and torch integers (as global_shapes takes them), never a bool or a float
            count = None if isinstance(g, bool) else operator.index(g)
        except TypeError:
            count = None
        if count is None or count < 1 or not shapes[name] or shapes[name][0] % count:
            raise ValueError(f"gate_blocks[{name!r}] is {g!r}; expected a positive integer dividing "
                             f"dim 0 of shape {shapes[name]}")
        blocks[name] = count
    if not isinstance(updates, Sequence) or isinstance(updates, (str, bytes)):
        raise TypeError(f"updates is a {type(updates).__name__}; expected a list of per-client mappings (name -> "
                        "packed update)")
    if len(updates) == 0:
        raise ValueError("updates is an empty client list; expected at least one client's update")
    try:
        weights_t = torch.as_tensor(weights, dtype=torch.float64).flatten().cpu()
    except (TypeError, ValueError, RuntimeError):
        shown = repr(weights)
        raise TypeError(f"weights is {shown if len(shown) <= 60 else shown[:57] + '...'}; expected one finite "
                        f"positive number per client ({len(updates)})") from None
    if weights_t.numel() != len(updates):
        raise ValueError(f"weights has {weights_t.numel()} entries but updates has {len(updates)} clients; "
                         "expected one weight per client")
    if not torch.isfinite(weights_t).all() or (weights_t <= 0).any():
        raise ValueError(f"weights must be finite and positive, got {weights_t.tolist()}")
    # The loop runs once per (client, parameter), thousands of times per round: each check is the cheap
    # test first, the sentence only on failure.
    dtype = device = None
    sparse_holders = {}  # name -> [(where, packed)]: their index lists and bitmasks checked together below
    for i, update in enumerate(updates):
        if not isinstance(update, Mapping):
            raise TypeError(f"updates[{i}] is a {type(update).__name__}; expected a mapping of name to tensor")
        for name, packed in update.items():
            full = shapes.get(name)
            if full is None:
                raise ValueError(f"updates[{i}][{name!r}] names a parameter that is not in global_shapes")
            sparse = not isinstance(packed, torch.Tensor)
            if sparse:
                if not isinstance(packed, SPARSE_TYPES):
                    raise TypeError(f"updates[{i}][{name!r}] is a {type(packed).__name__}; expected a torch.Tensor, "
                                    "an IndexedUpdate or a MaskedUpdate")
                where = f"updates[{i}][{name!r}]"
                values = check_structure(where, full, packed)
                sparse_holders.setdefault(name, []).append((where, packed))
                packed = values
            if packed.dtype is not dtype:
                where = f"updates[{i}][{name!r}]"
                if packed.dtype not in _FLOAT_DTYPES:
                    raise TypeError(f"{where} has dtype {packed.dtype}; expected torch.float32 or torch.float64")
                if dtype is not None:
                    raise TypeError(f"{where} has dtype {packed.dtype} but earlier updates are {dtype}; "
                                    "expected one dtype for all clients")
                dtype = packed.dtype
            if packed.device != device:
                if packed.device.type == "meta":
                    raise ValueError(f"updates[{i}][{name!r}] is on meta, a tensor without values; expected one on "
                                     "the CPU or a GPU")
                if device is not None:
                    raise ValueError(f"updates[{i}][{name!r}] is on {packed.device} but earlier updates are on "
                                     f"{device}; expected one device for all clients")
                device = packed.device
            if sparse:
                continue
            if not packed.is_contiguous():
                raise ValueError(f"updates[{i}][{name!r}] is not contiguous; expected a contiguous packed tensor")
            shape = packed.shape
            if len(shape) != len(full):
                raise ValueError(f"updates[{i}][{name!r}] has {len(shape)} dims but the global shape {full} has "
                                 f"{len(full)}")
            g = blocks.get(name, 1)
            if shape != full and (any(map(operator.gt, shape, full)) or (g > 1 and shape[0] % g)):
                raise ValueError(f"updates[{i}][{name!r}] has shape {tuple(shape)}, which does not fit inside the "
                                 f"global shape {full}" + (f" as {g} equal gate blocks" if g > 1 else ""))
    if dtype is None:
        raise ValueError("updates holds no tensors at all; expected at least one packed parameter")
    for name, holders in sparse_holders.items():
        if not contents_hold(shapes[name], [packed for _, packed in holders]):
            for where, packed in holders:  # the first problem's sentence
                check_packed(where, shapes[name], packed)
    return shapes, weights_t, blocks


_warned_fallback = False


def fused_available(device: Optional[Union[str, torch.device]] = None) -> bool:
    """Whether the compiled fused aggregation op is importable (and has a kernel for ``device``, if given).

    The CPU kernel is always built with the extension; the CUDA kernel only where the build saw CUDA (or
    ``HASFL_FORCE_CUDA=1``). Other device types have no fused kernel.
    """
    try:
        from hasfl_ray.ops import aggregate as ops_aggregate
    except ImportError:
        return False
    if not ops_aggregate.available():
        return False
    kind = torch.device(device).type if device is not None else "cpu"
    return kind == "cpu" or (kind == "cuda" and ops_aggregate.cuda_available())


def _checked_weights(weights, num_clients: int) -> Optional[torch.Tensor]:
    """``weights`` as a float64 CPU tensor when it has ``num_clients`` finite positive entries, else None."""
    try:
        weights_t = torch.as_tensor(weights, dtype=torch.float64).flatten().cpu()
    except (TypeError, ValueError, RuntimeError):
        return None
    values = weights_t.tolist()
    if len(values) != num_clients or not all(0.0 < value < math.inf for value in values):
        return None
    return weights_t


def _aggregate_cached(global_shapes, updates, weights, gate_blocks) -> Optional[AggregateResult]:
    """The fused path of a round whose layout is cached, or None (then the full path runs).

    A cache hit means an earlier call with the same global shapes, gate blocks, per-client names and packed
    shapes passed the full validation, so what is left to check is per call: one float dtype and one device
    (:func:`hasfl_ray.ops.aggregate.signature`), the weights, and what the op re-checks itself (contiguity,
    sizes). If the op rejects the input, the full validation runs to name the culprit in one sentence.
    """
    if not fused_available():
        return None
    from hasfl_ray.ops import aggregate as ops_aggregate

    try:
        found = ops_aggregate.signature(global_shapes, updates, gate_blocks)
    except Exception:  # noqa: BLE001 (anything odd: the full validation will say what)
        return None
    if found is None:
        return None
    layout = ops_aggregate.layout_cache.get(found.key)
    if layout is None or not fused_available(found.device):
        return None
    weights_t = _checked_weights(weights, len(updates))
    if weights_t is None:
        return None
    try:
        return ops_aggregate.run_layout(layout, layout.packed_from(found.flat), weights_t)
    except (RuntimeError, TypeError, ValueError):
        validate_inputs(global_shapes, updates, weights, gate_blocks)  # raises the one-sentence error if it is the input
        raise


def aggregate_updates(global_shapes: Mapping[str, Sequence[int]], updates: Sequence[Mapping[str, torch.Tensor]],
                      weights: Union[Sequence[float], torch.Tensor], gate_blocks: Optional[Mapping[str, int]] = None,
                      backend: str = "auto") -> AggregateResult:
    """Coordinate-wise weighted mean of packed (width-sliced) client updates, with divergence norms.

    Args:
        global_shapes: parameter name -> full shape.
        updates: per client, name -> packed tensor holding the leading indices of every dim (inside each
            gate block where ``gate_blocks`` says so), or an :class:`IndexedUpdate` (per-dim index sets, e.g.
            a client's channels) or a :class:`MaskedUpdate` (any subset of the coordinates, as a bitmask);
            see :mod:`hasfl_ray.aggregation.packed`. A name absent from a client's dict was not trained by it.
        weights: per client weight n_i (> 0), length ``len(updates)``.
        gate_blocks: name -> G when dim 0 is G equal blocks sliced separately (LSTM gates).
        backend: ``"fused"`` (the compiled kernel), ``"reference"`` (pure torch) or ``"auto"`` (fused when
            built with a kernel for the updates' device, else reference with a one-time warning).

    Returns:
        :class:`AggregateResult` with ``delta`` (full-shape, 0 where no client covers), ``div_num`` and
        ``div_den`` (float64, one per client) and ``covered_fraction``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is unknown; expected one of {', '.join(BACKENDS)}")
    with torch.no_grad():  # updates cut from tracked parameters: a plain result on every backend, no graph kept
        return _aggregate(global_shapes, updates, weights, gate_blocks, backend)


def _aggregate(global_shapes, updates, weights, gate_blocks, backend: str) -> AggregateResult:
    """:func:`aggregate_updates` once ``backend`` is known to be one of :data:`BACKENDS`."""
    global _warned_fallback
    if backend != "reference":
        result = _aggregate_cached(global_shapes, updates, weights, gate_blocks)
        if result is not None:
            return result
    shapes, weights_t, blocks = validate_inputs(global_shapes, updates, weights, gate_blocks)
    device = next(t for update in updates for t in update.values()).device
    from hasfl_ray.ops.sparse import has_sparse

    sparse = has_sparse(updates)
    if backend == "auto":
        backend = "fused" if fused_available(device) else "reference"
        if backend == "reference" and not _warned_fallback:
            _warned_fallback = True
            logger.warning("hasfl_ray._C %s; aggregating with the pure-torch reference",
                           "has no kernel for " + device.type if fused_available() else "is not built")
    if backend == "fused":
        if not fused_available():
            raise RuntimeError("backend 'fused' needs the compiled extension hasfl_ray._C; "
                               "build it with `pip install --no-build-isolation -e .`")
        if not fused_available(device):
            raise RuntimeError(f"backend 'fused' has no kernel for updates on {device}; hasfl_ray._C was built "
                               "without CUDA (rebuild with a GPU visible or HASFL_FORCE_CUDA=1), or use "
                               "backend 'reference'")
        if sparse:  # CPU: csrc/cpu/aggregate_sparse_kernel.h; CUDA: csrc/cuda/aggregate_sparse_cuda.cu
            from hasfl_ray.ops.sparse import aggregate_sparse
            return aggregate_sparse(shapes, updates, weights_t, blocks)
        from hasfl_ray.ops.aggregate import aggregate_fused
        return aggregate_fused(shapes, updates, weights_t, blocks)
    return aggregate_reference(shapes, updates, weights_t, blocks)


__all__ = ["AggregateResult", "BACKENDS", "IndexedUpdate", "MaskedUpdate", "aggregate_reference", "aggregate_updates", "fused_available",
           "validate_inputs"]
