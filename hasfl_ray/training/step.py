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

:class:`StackedSGD` is its twin for batched training (:mod:`hasfl_ray.training.batched`): the same rule for C
clients whose parameters, gradients and momentum buffers are stacked on a leading client dim, each client clipped
by its own gradient norm and stepped with its own learning rate. The rule (clip, weight decay, momentum, step) is
written once, in :class:`ClipThenSGD`; the two classes supply only the tensor layout: a list of one client's
tensors (foreach kernels), or stacked tensors (per-client reductions, broadcasting over the client dim).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch


def per_client(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [C] tensor shaped to broadcast over a stacked [C, ...] tensor."""
    return values.reshape((-1,) + (1,) * (like.dim() - 1))


def common_or_vector(values: Sequence[float], device: torch.device) -> Tuple[Optional[float], torch.Tensor]:
    """(the common value, or None where they differ; the [C] float32 tensor of them)."""
    first = values[0]
    common = first if all(v == first for v in values) else None
    return common, torch.tensor(list(values), dtype=torch.float32, device=device)


class ClipThenSGD:
    """The local optimiser's rule, once: ``torch.nn.utils.clip_grad_norm_`` (when ``clip_norm`` > 0), then a step
    of ``torch.optim.SGD`` (no dampening, no Nesterov)::

        g *= min(1, clip_norm / (‖g‖ + 1e-6))      ‖g‖: the 2-norm of all the client's gradients together
        d  = g + weight_decay · w                  (when weight_decay != 0)
        b  = d  (first step)  or  momentum · b + d (when momentum != 0); d = b
        w -= lr · d

    A subclass lays the tensors out: :meth:`_total_norm`, :meth:`_scale_`, :meth:`_add`, :meth:`_momentum` and
    :meth:`_descend_` are the rule's operations on its tensors; ``where`` is the subclass's own bookkeeping of
    which tensors (or clients) the step covers.
    """

    def __init__(self, momentum: float, weight_decay: float, clip_norm: float):
        self.momentum, self.weight_decay, self.clip_norm = float(momentum), float(weight_decay), float(clip_norm)

    def _apply(self, params: List[torch.Tensor], grads: List[torch.Tensor], where: Any) -> None:
        """One clipped SGD step of ``params`` along ``grads`` (clipped in place; no grad mode)."""
        if self.clip_norm > 0:
            coef = torch.clamp(self.clip_norm / (self._total_norm(grads) + 1e-6), max=1.0)
            self._scale_(grads, coef)
        if self.weight_decay != 0:
            grads = self._add(grads, params, self.weight_decay)
        if self.momentum != 0:
            grads = self._momentum(grads, where)
        self._descend_(params, grads, where)

    def _total_norm(self, grads: List[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def _scale_(self, grads: List[torch.Tensor], coef: torch.Tensor) -> None:
        raise NotImplementedError

    def _add(self, grads: List[torch.Tensor], params: List[torch.Tensor], alpha: float) -> List[torch.Tensor]:
        raise NotImplementedError

    def _momentum(self, directions: List[torch.Tensor], where: Any) -> List[torch.Tensor]:
        raise NotImplementedError

    def _descend_(self, params: List[torch.Tensor], directions: List[torch.Tensor], where: Any) -> None:
        raise NotImplementedError


class LocalSGD(ClipThenSGD):
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
        super().__init__(momentum, weight_decay, clip_norm)
        self.params: List[torch.Tensor] = list(params)
        self.lr = float(lr)
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
        self._apply(params, [p.grad for p in params], indices)

    # The layout: a list of the client's tensors, foreach kernels (those of clip_grad_norm_ and SGD's foreach path).

    def _total_norm(self, grads: List[torch.Tensor]) -> torch.Tensor:
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)

    def _scale_(self, grads: List[torch.Tensor], coef: torch.Tensor) -> None:
        torch._foreach_mul_(grads, coef)

    def _add(self, grads: List[torch.Tensor], params: List[torch.Tensor], alpha: float) -> List[torch.Tensor]:
        return torch._foreach_add(grads, params, alpha=alpha)

    def _momentum(self, directions: List[torch.Tensor], indices: List[int]) -> List[torch.Tensor]:
        buffers = [self.buffers[k] for k in indices]
        if all(b is not None for b in buffers):
            torch._foreach_mul_(buffers, self.momentum)
            torch._foreach_add_(buffers, directions, alpha=1.0)
            return buffers
        for j, k in enumerate(indices):
            if self.buffers[k] is None:
                self.buffers[k] = directions[j].detach().clone()
            else:
                self.buffers[k].mul_(self.momentum).add_(directions[j], alpha=1.0)
        return [self.buffers[k] for k in indices]

    def _descend_(self, params: List[torch.Tensor], directions: List[torch.Tensor], indices: List[int]) -> None:
        torch._foreach_add_(params, directions, alpha=-self.lr)


class StackedSGD(ClipThenSGD):
    """:class:`LocalSGD` of C clients at once, their tensors stacked on a leading client dim: each client's
    gradients clipped by their own norm, its own learning rate, its own momentum buffers.

    A step may cover a sub-stack of the clients (those with a batch of one size at that local step): ``index``
    names them (None: all C, in order) and ``params``/``grads`` are their rows.

    Args:
        stacked: the C clients' stacked parameters (shapes and device of the momentum buffers), in step order.
        lrs: each client's learning rate.
        momentum, weight_decay, clip_norm: as :class:`LocalSGD`.
    """

    def __init__(self, stacked: Sequence[torch.Tensor], lrs: Sequence[float], momentum: float, weight_decay: float,
                 clip_norm: float):
        super().__init__(momentum, weight_decay, clip_norm)
        self.lr_common, self.lr_vector = common_or_vector([float(lr) for lr in lrs], stacked[0].device)
        self.buffers: Optional[List[torch.Tensor]] = [torch.zeros_like(t) for t in stacked] \
            if self.momentum != 0 else None

    @torch.no_grad()
    def step(self, params: List[torch.Tensor], grads: List[torch.Tensor], index: Optional[torch.Tensor],
             first: bool) -> None:
        """Clip ``grads`` per client in place, then step ``params`` (the rows ``index`` of the stack, or all of
        it) in place; ``first``: every client of the step takes its first step (its momentum buffer starts as
        its direction)."""
        self._apply(params, grads, (index, first))

    @staticmethod
    def _pick(tensor: torch.Tensor, index: Optional[torch.Tensor]) -> torch.Tensor:
        return tensor if index is None else tensor.index_select(0, index)

    # The layout: stacked [C, ...] tensors, reductions per client, per-client scalars broadcast over the client dim.

    def _total_norm(self, grads: List[torch.Tensor]) -> torch.Tensor:
        norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2, dim=1) for g in grads], dim=1)
        return torch.linalg.vector_norm(norms, 2, dim=1)

    def _scale_(self, grads: List[torch.Tensor], coef: torch.Tensor) -> None:
        for g in grads:
            g.mul_(per_client(coef, g))

    def _add(self, grads: List[torch.Tensor], params: List[torch.Tensor], alpha: float) -> List[torch.Tensor]:
        return [g.add(w, alpha=alpha) for g, w in zip(grads, params)]

    def _momentum(self, directions: List[torch.Tensor], where: Tuple[Optional[torch.Tensor], bool]
                  ) -> List[torch.Tensor]:
        index, first = where
        if first:
            buffers = directions
        else:
            buffers = [self._pick(b, index) for b in self.buffers]
            for b, d in zip(buffers, directions):
                b.mul_(self.momentum).add_(d)
        for k, b in enumerate(buffers):
            if index is None:
                self.buffers[k] = b
            else:
                self.buffers[k].index_copy_(0, index, b)
        return buffers

    def _descend_(self, params: List[torch.Tensor], directions: List[torch.Tensor],
                  where: Tuple[Optional[torch.Tensor], bool]) -> None:
        index, _ = where
        for w, d in zip(params, directions):
            if self.lr_common is not None:
                w.add_(d, alpha=-self.lr_common)
            else:
                w.sub_(d * per_client(self._pick(self.lr_vector, index), d))
