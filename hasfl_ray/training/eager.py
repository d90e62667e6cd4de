"""One-at-a-time local training: one client's width-p sub-model, K local epochs of its objective's steps.

The reference form of local training: the objective's ``setup``, ``loss``, ``adjust_gradients`` and ``finish``
run as written, and :class:`~hasfl_ray.training.step.LocalSGD` clips and steps. A client whose objective is the
default one (:func:`~hasfl_ray.training.task.graphable`) on a workspace with a step cache runs each step on static
tensors instead (:mod:`hasfl_ray.training.graphed`; the same values).
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch

from hasfl_ray.training.graphed import StaticStep
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.local_optim import builtin, local_optimizer
from hasfl_ray.training.precision import forward_precision
from hasfl_ray.training.task import ClientTask, client_result, graphable
from hasfl_ray.training.augment import augmented
from hasfl_ray.aggregation.packed import IndexedUpdate, MaskedUpdate
from hasfl_ray.training.workspace import Workspace, client_batches, client_generator, local_plan, packed_update


def train_eager(workspace: Workspace, task: ClientTask, global_params: Optional[Mapping[str, torch.Tensor]],
                start: Optional[Mapping[str, torch.Tensor]] = None) -> ClientResult:
    """Extract the width-p sub-model from ``global_params`` (or start from ``start``, the sub-model itself as
    :meth:`Workspace.starting_point` cuts it, e.g. received by a Flower client), run K local epochs, return Δ_i
    (packed). The task's testing faults are the caller's (:func:`~hasfl_ray.training.task.with_faults`)."""
    workspace.begin()
    masks = workspace.task_masks(task)  # unstructured sub-models: the full-shape network, w ⊙ m (else None)
    model = workspace.model_at(1.0 if masks is not None else task.width, task.depth)
    params = dict(model.named_parameters())
    initial = workspace.starting_point(task, global_params) if start is None else \
        {name: tensor.to(workspace.device) for name, tensor in start.items()}
    with torch.no_grad():
        for name, tensor in initial.items():
            params[name].copy_(tensor)
    generator = client_generator(task)
    masked = workspace.masked_labels(task)  # masked_loss: the labels the client does not hold (else None)
    objective = task.objective
    objective.masked_labels = masked
    # an objective's nested widths (FjORD) are of the client's own depth sub-model where it has one
    model_at = workspace.model_at if task.depth is None else (lambda w: workspace.model_at(w, task.depth))
    objective.setup(model, initial, task.width, generator, model_at=model_at)
    s = workspace.settings
    # clip_grad_norm_ + torch.optim.SGD, bit for bit, without their per-step Python (hasfl_ray.training.step); or
    # another torch.optim optimiser (--local-optimizer, hasfl_ray.training.local_optim)
    optimizer = local_optimizer(list(model.parameters()), task.lr, s)
    n = workspace.dataset.client_size(task.client)
    model.train()
    steps = 0
    # The losses are summed on the device in float64 (what a Python float sum of them gives), read once.
    loss_sum = torch.zeros((), dtype=torch.float64, device=workspace.device)
    # A whole step on static tensors (a CUDA graph on CUDA) for a client with at least one full batch (its
    # first batch then has the static shape) whose objective is the default one (hasfl_ray.training.graphed).
    graphed = workspace.steps is not None and n >= s.batch_size and graphable(objective) and not task.proximal and \
        builtin(s.optimizer, s.optimizer_options) and masks is None
    anchors = [(p, initial[name]) for name, p in params.items()] if task.proximal else []
    static: Optional[StaticStep] = None
    device = workspace.device if workspace.device_positions else None
    epochs, most = local_plan(s.local_epochs, s.local_steps, task.max_steps)
    for positions in client_batches(generator, n, s.batch_size, epochs, device, most):
        x, y = workspace.dataset.client_batch(task.client, positions)
        x = augmented(workspace, x, task, steps)
        if graphed:
            if static is None:
                static = workspace.steps.get(model, task.width, x, y, task.lr, s, masked)
                static.begin_client(masked)
            static.run(x, y)  # a short last batch runs eagerly on the same parameters and buffers
        else:
            optimizer.zero_grad()
            with forward_precision(workspace.device, s.precision):  # --precision bf16: autocast, else nothing
                loss = objective.loss(model, x, y)
            loss.backward()
            objective.adjust_gradients(model)
            if masks is not None:  # the gradient through w ⊙ m: g ⊙ m (w stays 0 outside m)
                masked_gradients(params, masks)
            if anchors:  # the task's proximal term: ρ (w − w_received) (FedAsync's worker)
                with torch.no_grad():
                    for param, anchor in anchors:
                        if param.grad is not None:
                            param.grad.add_(param - anchor, alpha=task.proximal)
            optimizer.step()  # clips first when s.clip_norm > 0
            loss_sum += loss.detach()
        steps += 1
    if static is not None:
        loss_sum = static.loss_sum
    update = packed_update(params, initial)
    if task.channels is not None:  # the channels it held travel as index sets
        sets = workspace.index_sets(task)
        update = {name: IndexedUpdate(tensor, sets[name]) for name, tensor in update.items()}
    if masks is not None:  # the coordinates it held travel with their bitmask
        update = {name: MaskedUpdate.gather(tensor, held_mask(objective, name, tensor, masks[name].cpu()))
                  if name in masks else tensor for name, tensor in update.items()}
    extras = objective.finish(model, initial, steps, task.lr)
    if static is None:  # the cached network keeps no gradients between clients: the LRU holds weights only
        for param in model.parameters():
            param.grad = None
    return client_result(task, update, n, float(loss_sum), steps, extras)


@torch.no_grad()
def masked_gradients(params: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor]) -> None:
    """Each masked parameter's gradient set to 0 outside its mask (the gradient of w ⊙ m with a constant m)."""
    for name, mask in masks.items():
        grad = params[name].grad
        if grad is not None:
            grad.masked_fill_(~mask, 0.0)


def held_mask(objective, name: str, delta: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The objective's held coordinates of ``name`` (:meth:`~hasfl_ray.training.task.LocalObjective.held`), checked
    to be a bool tensor of the shape within ``mask``."""
    held = objective.held(name, delta, mask)
    if not isinstance(held, torch.Tensor) or held.dtype != torch.bool or held.shape != mask.shape:
        raise ValueError(f"the objective's held() for {name} gave {type(held).__name__}; expected a bool tensor of "
                         f"shape {tuple(mask.shape)}")
    return (held.cpu() & mask)
