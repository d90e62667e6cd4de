"""The fused ops' calls as the package makes them: ``hasfl_ray._C``'s direct entries in eager mode, which read the
lists of packed tensors in place, and ``torch.ops.hasfl_ray`` under torch.compile (which traces it) or with an
extension built before the entries existed. The same ops through the same dispatcher either way, the same results
and the same errors; torch.ops boxes every tensor of a list, 160-210 ns a tensor on the sandbox's CPU (1,400 tensors
at 50 EMNIST clients), as long as the CUDA kernel itself takes at 50 clients (benchmarks/bench_handover.py)."""

from __future__ import annotations

import sys
from typing import Optional, Sequence, Tuple

import torch

Result = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _direct(name: str):
    if torch.compiler.is_compiling():
        return None
    return getattr(sys.modules.get("hasfl_ray._C"), name, None)


def aggregate_into(out: torch.Tensor, packed: Sequence[torch.Tensor], params: torch.Tensor, entries: torch.Tensor,
                   weights: torch.Tensor, direct: Optional[bool] = None) -> Result:
    """``torch.ops.hasfl_ray.aggregate_into``; ``direct`` False forces torch.ops (benchmarks), True the direct entry."""
    entry = _direct("aggregate_into") if direct is not False else None
    if entry is None:
        if direct:
            raise RuntimeError("hasfl_ray._C has no direct entry aggregate_into; expected the extension rebuilt "
                               "(pip install --no-build-isolation -e .)")
        return torch.ops.hasfl_ray.aggregate_into(out, packed, params, entries, weights)
    return entry(out, packed, params, entries, weights)


def aggregate_sparse_into(out: torch.Tensor, packed: Sequence[torch.Tensor], params: torch.Tensor,
                          entries: torch.Tensor, weights: torch.Tensor, kinds: torch.Tensor,
                          bits: Sequence[torch.Tensor], rows: torch.Tensor, row_offsets: torch.Tensor,
                          direct: Optional[bool] = None) -> Result:
    """``torch.ops.hasfl_ray.aggregate_sparse_into``; ``direct`` as :func:`aggregate_into`'s."""
    entry = _direct("aggregate_sparse_into") if direct is not False else None
    if entry is None:
        if direct:
            raise RuntimeError("hasfl_ray._C has no direct entry aggregate_sparse_into; expected the extension "
                               "rebuilt (pip install --no-build-isolation -e .)")
        return torch.ops.hasfl_ray.aggregate_sparse_into(out, packed, params, entries, weights, kinds, bits, rows,
                                                         row_offsets)
    return entry(out, packed, params, entries, weights, kinds, bits, rows, row_offsets)
