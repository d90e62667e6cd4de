"""The local optimiser step: gradient-norm clipping, then SGD with momentum and weight decay, on a fixed list of
parameters.

The arithmetic is op for op that of ``torch.nn.utils.clip_grad_norm_(params, clip)`` followed by
``torch.optim.SGD(params, lr, momentum, weight_decay).step()`` (foreach kernels, which on a CPU run the same
per-tensor kernels as the single-tensor path), so results are bit-identical to them (tests/training/test_step.py).
What it leaves out is their per-call Python: regrouping the tensors by device and dtype, the optimiser's hooks,
profiler records and state dictionaries. For the small networks of many-client runs (the Synthetic MLP: a step is
about a millisecond on a CPU core) that bookkeeping was about a third of every local step.

With ``zero_buffers=True`` the momentum buffers start as zeros instead of a copy of the first gradient: the same
values (0·m + d = d) with tensors that exist before the first step, which a captured CUDA graph needs.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch


class LocalSGD:
    """``clip_grad_norm_`` + ``torch.optim.SGD`` (no dampening, no Nesterov) over ``params``.

    Args:
        params: the parameters to train, in a fixed order (a parameter whose ``.grad`` is None after backward is
            skipped by the clip and the step, as torch does).
        lr, momentum, weight_decay: SGD's.
        clip_norm: the maximal total 2-norm of the gradients; 0 disables clipping.
        zero_buffers: start the momentum buffers at zero (see the module docstring).
    """

    def __init__(self, params: Sequence[torch.Tensor], lr: float, momentum: float, weight_decay: float,
                 clip_norm: float, zero_buffers: bool = False):
        self.params: List[torch.Tensor] = list(params)
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.clip_norm = float(clip_norm)
        self.buffers: List[Optional[torch.Tensor]] = (
            [torch.zeros_like(p) for p in self.params] if zero_buffers and self.momentum != 0
            else [None] * len(self.params))

    def zero_grad(self) -> None:
        """Drop the gradients (``set_to_none``), as ``optimizer.zero_grad()`` does."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Clip the gradients in place, then take one SGD step."""
        indices = [k for k, p in enumerate(self.params) if p.grad is not None]
        if not indices:
            return
        params = [self.params[k] for k in indices]
        grads = [p.grad for p in params]
        if self.clip_norm > 0:
            norms = torch._foreach_norm(grads, 2.0)
            total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
            coef = torch.clamp(self.clip_norm / (total + 1e-6), max=1.0)
            torch._foreach_mul_(grads, coef)
        if self.weight_decay != 0:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        if self.momentum != 0:
            buffers = [self.buffers[k] for k in indices]
            if all(b is not None for b in buffers):
                torch._foreach_mul_(buffers, self.momentum)
                torch._foreach_add_(buffers, grads, alpha=1.0)
            else:
                for j, k in enumerate(indices):
                    if self.buffers[k] is None:
                        self.buffers[k] = grads[j].detach().clone()
                    else:
                        self.buffers[k].mul_(self.momentum).add_(grads[j], alpha=1.0)
                buffers = [self.buffers[k] for k in indices]
            grads = buffers
        torch._foreach_add_(params, grads, alpha=-self.lr)
