"""The clients' local optimiser (docs/configs.md, "Local optimiser"): the built-in step for ``sgd``
(:class:`~hasfl_ray.training.step.LocalSGD`, every batched and captured path), else a ``torch.optim`` class by name
(:mod:`hasfl_ray.config.local_optimizer` checks the keys), its gradients clipped first; those clients train one at a
time."""

from __future__ import annotations

from typing import Any, List, Sequence

import torch

from hasfl_ray.config.local_optimizer import builtin, filled_options, optimizer_class
from hasfl_ray.training.step import LocalSGD


class TorchLocalOptimizer:
    """A ``torch.optim`` optimiser behind :class:`~hasfl_ray.training.step.LocalSGD`'s interface (``zero_grad``,
    ``step``): the gradients clipped to ``clip_norm`` (0: not), then the optimiser's step."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, settings: Any):
        cls = optimizer_class(settings.optimizer)
        self.params: List[torch.Tensor] = list(params)
        self.clip_norm = float(settings.clip_norm or 0.0)
        self.inner = cls(self.params, lr=float(lr), **filled_options(cls, dict(settings.optimizer_options),
                                                                     settings.weight_decay, settings.momentum))

    def zero_grad(self) -> None:
        self.inner.zero_grad(set_to_none=True)

    def step(self) -> None:
        if self.clip_norm > 0:
            grads = [p for p in self.params if p.grad is not None]
            if grads:
                torch.nn.utils.clip_grad_norm_(grads, self.clip_norm)
        self.inner.step()


def local_optimizer(params: Sequence[torch.Tensor], lr: float, settings: Any):
    """The client's optimiser: the built-in step for ``sgd``, else :class:`TorchLocalOptimizer`."""
    if builtin(settings.optimizer, settings.optimizer_options):
        return LocalSGD(list(params), lr, settings.momentum, settings.weight_decay, settings.clip_norm)
    return TorchLocalOptimizer(params, lr, settings)


__all__ = ["TorchLocalOptimizer", "builtin", "local_optimizer"]
