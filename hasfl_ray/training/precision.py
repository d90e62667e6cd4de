"""``--precision``: the arithmetic of local training's forward pass and loss.

``fp32`` (the default, and every run before the key existed): plain float32, no autocast; results are those of
every earlier version. ``bf16``: the forward and the loss of each local step run under
``torch.autocast(device_type, dtype=torch.bfloat16)`` (convolutions and matmuls in bfloat16 with float32
accumulation, reductions and the cross-entropy in float32, as autocast's op lists decide). Everything else stays
float32: the weights (the "master" copy), their gradients (autograd returns a parameter's gradient in its own
dtype), the clip, the optimiser step, the aggregation, and evaluation (the test accuracy of a bf16 run is that of
its float32 weights, measured as an fp32 run's is, so the two compare directly).

On a CPU bf16 is fast where the cores have bfloat16 dot products (AVX512-BF16, AMX); on a GPU it is the tensor
cores' natural precision. Both are measured in benchmarks/RESULTS.md ("bf16 autocast"); docs/gpu.md says where
each training path uses it.

Paths: one-at-a-time training (eager and the static/graphed step, with the autocast weight-cast cache off, as a
CUDA-graph capture needs) runs under autocast. The batched paths (``--client-batching on`` and ``mixed``,
torch.func over stacked clients) are not: a bf16 trainer trains every client one at a time, whatever
``client_batching`` says (:meth:`~hasfl_ray.training.trainer.Trainer.train_unit`).
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch


def forward_precision(device: torch.device, precision: str, cache: bool = True) -> ContextManager:
    """The context the forward and loss of a local step run in: nothing for ``fp32``, bfloat16 autocast on
    ``device``'s type for ``bf16`` (``cache=False``: no weight-cast cache, for a CUDA-graph capture)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, cache_enabled=cache)
    raise ValueError(f"precision is {precision!r}; expected fp32 or bf16")
