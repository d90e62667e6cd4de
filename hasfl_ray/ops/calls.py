"""The fused ops' calls as the package makes them: ``hasfl_ray._C``'s direct entries in eager mode, which read the
lists of packed tensors in place, and ``torch.ops.hasfl_ray`` under torch.compile (which traces it) or with an
extension built before the entries existed. The same ops through the same dispatcher either way, the same results
and the same errors; torch.ops boxes every tensor of a list, 160-210 ns a tensor on the sandbox's CPU (1,400 tensors
at 50 EMNIST clients), as long as the CUDA kernel itself takes at 50 clients (benchmarks/bench_handover.py)."""

from __future__ import annotations

import os
import sys
from typing import Mapping, Optional, Sequence, Tuple

import torch

from hasfl_ray.errors import ConfigError

Result = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]

#: The environment variable that picks the CUDA kernel of index sets and masks (docs/install.md), read by the op
#: at each call (csrc/cuda/aggregate_sparse_cuda.cu), and its accepted values (unset or empty: the first).
SPARSE_KERNEL_VARIABLE = "HASFL_SPARSE_CUDA_KERNEL"
SPARSE_KERNELS = ("tabled", "serial")


def sparse_cuda_kernel(environ: Optional[Mapping[str, str]] = None) -> str:
    """The CUDA kernel :data:`SPARSE_KERNEL_VARIABLE` asks for (``tabled`` when unset or empty), or one sentence
    (ConfigError) for any other value: checked on every device, so a value the card would refuse deep in the op is
    refused alike on a machine without one (the CLI checks it at its start, :mod:`hasfl_ray.cli.main`)."""
    value = (os.environ if environ is None else environ).get(SPARSE_KERNEL_VARIABLE, "")
    if value == "":
        return SPARSE_KERNELS[0]
    if value not in SPARSE_KERNELS:
        raise ConfigError(f"{SPARSE_KERNEL_VARIABLE} is {value!r} in the environment; expected tabled (the default) "
                          "or serial, the CUDA kernel of index sets and masks (docs/install.md)")
    return value


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
    """``torch.ops.hasfl_ray.aggregate_sparse_into``; ``direct`` as :func:`aggregate_into`'s. A bad
    :data:`SPARSE_KERNEL_VARIABLE` is refused first, in one sentence (:func:`sparse_cuda_kernel`)."""
    sparse_cuda_kernel()
    entry = _direct("aggregate_sparse_into") if direct is not False else None
    if entry is None:
        if direct:
            raise RuntimeError("hasfl_ray._C has no direct entry aggregate_sparse_into; expected the extension "
                               "rebuilt (pip install --no-build-isolation -e .)")
        return torch.ops.hasfl_ray.aggregate_sparse_into(out, packed, params, entries, weights, kinds, bits, rows,
                                                         row_offsets)
    return entry(out, packed, params, entries, weights, kinds, bits, rows, row_offsets)
