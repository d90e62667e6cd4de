"""Batched local training: the clients of one width trained together, one stacked computation per local step.

:func:`train_batched` reproduces one-at-a-time training (:func:`hasfl_ray.training.eager.train_eager`) for
several clients at once, up to float rounding. Every client keeps its own state and trajectory:

- parameters, SGD momentum buffers and the initial point are stacked on a leading client dim;
- the per-client loss and gradient come from ``torch.func``: ``vmap(grad_and_value(loss))`` over
  ``functional_call`` of the width-p network, so BatchNorm normalises each client's batch with that batch's own
  statistics (the LSTM, whose ``aten::lstm`` has no vmap batching rule, runs its cell loop on the stacked tensors
  with batched matmuls instead: :func:`batched_step`);
- each client draws its data order from its own generator (``torch_generator(seed, STREAM_CLIENT, round,
  client)``, one ``randperm`` per epoch), cuts it into batches of ``batch_size`` and skips a batch of one
  sample after its first step, exactly as one-at-a-time training does;
- local step k trains the clients that have a k-th batch; clients whose k-th batches differ in size (a last,
  short batch) are trained as separate sub-stacks of one batch size each, and clients without a k-th batch
  (fewer samples) stop while the others go on (ragged clients);
- with ``masked_loss`` each client's logits of the labels it does not hold are set to 0 before its cross-entropy
  (its stacked row of label masks, :meth:`~hasfl_ray.training.workspace.Workspace.masked_labels`);
- the objective's gradient terms (FedProx's μ (w − w⁰), SCAFFOLD's c − c_i) are stacked tensor ops; the
  per-client gradient-norm clip and the SGD update are :class:`~hasfl_ray.training.step.StackedSGD`, the stacked
  layout of the one rule :class:`~hasfl_ray.training.step.LocalSGD` also follows.

Objectives that cannot be stacked (``LocalObjective.batchable`` is False: FjORD's ordered dropout with per-step
sampled widths, or a user objective that overrides ``loss``/``adjust_gradients``/``finish`` without the stacked
hooks) are trained one at a time; :func:`group_tasks` decides which clients go together.

The loop itself is :func:`train_stacked`, which also trains clients of several widths padded to the widest
(:mod:`hasfl_ray.training.mixed`, ``--client-batching mixed``): the stack's :class:`Layout` says where each
client's coordinates lie, and a padded layout's masks zero the gradients outside them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn import functional as F

from hasfl_ray.models.lstm import CharLSTM
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.step import StackedSGD, common_or_vector, per_client
from hasfl_ray.training.task import ClientTask, client_result, mask_logits
from hasfl_ray.training.augment import augmented
from hasfl_ray.training.workspace import Workspace, client_batches, client_generator, local_plan, packed_update

#: Most clients trained in one stacked computation (bounds a trainer's memory; a larger group is split in task
#: order, so the grouping depends only on the round's tasks, never on the number of trainers).
MAX_GROUP = 64
#: What :func:`group_tasks` takes as ``batching`` (``--client-batching`` once ``auto`` is resolved).
BATCHING_MODES = ("off", "on", "mixed")


Params = Dict[str, torch.Tensor]


def group_tasks(tasks: Sequence[ClientTask], batching: Union[bool, str], max_group: int = MAX_GROUP,
                pads_exactly: bool = True) -> List[List[int]]:
    """Positions of ``tasks`` in training units: with ``batching`` True or ``"on"``, the batchable clients of one
    width together; with ``"mixed"``, the batchable clients of every width together (trained padded to the widest:
    :mod:`hasfl_ray.training.mixed`), or of one width where the model's forward depends on its width
    (``pads_exactly`` False: :func:`hasfl_ray.models.pads_exactly`); in task order, at most ``max_group`` per unit.
    Every other client (a task with a ``proximal`` term or a ``depth`` among them), and every client with ``batching``
    False or ``"off"``, alone. Units are ordered by their first position, so results can be put back in task order."""
    mode = ("on" if batching else "off") if isinstance(batching, bool) else batching
    if mode not in BATCHING_MODES:
        raise ValueError(f"batching is {batching!r}; expected one of {', '.join(BATCHING_MODES)} (or a bool)")
    if mode == "off":
        return [[k] for k in range(len(tasks))]
    mixed = mode == "mixed" and pads_exactly
    units: List[List[int]] = []
    by_width: "OrderedDict[Optional[float], List[int]]" = OrderedDict()
    for k, task in enumerate(tasks):
        if getattr(task.objective, "batchable", False) and not task.proximal and task.depth is None and \
                getattr(task, "masks", None) is None:
            by_width.setdefault(None if mixed else float(task.width), []).append(k)
        else:
            units.append([k])
    for members in by_width.values():
        units += [members[i:i + max_group] for i in range(0, len(members), max_group)]
    return sorted(units, key=lambda unit: unit[0])


StepFunction = Callable[..., Tuple[Params, torch.Tensor]]


def batched_step(model: nn.Module, masked: bool = False) -> StepFunction:
    """``step(params, x, y) -> (grads, losses)`` for stacked clients: ``params`` name -> [C, ...], ``x`` [C, B, ...],
    ``y`` [C, B]; client c's gradient of its own mean cross-entropy, and the [C] losses. With ``masked``
    (``masked_loss``) ``step(params, x, y, masked_labels)``: each client's logits at the True columns of its row of
    ``masked_labels`` (bool [C, num_classes]) set to 0 before its cross-entropy
    (:func:`~hasfl_ray.training.task.mask_logits`).

    CNN and MLP: ``vmap(grad_and_value(...))`` over ``functional_call`` (convolutions become one grouped
    convolution, BatchNorm takes each client's batch statistics). LSTM: ``aten::lstm`` has no vmap batching rule
    (vmap would loop over clients), so the cell loop is written on the stacked tensors with batched matmuls, and
    autograd of the summed losses gives each client's gradient (the clients share no parameter).
    """
    if isinstance(model, CharLSTM):
        return lambda params, x, y, masked_labels=None: _stacked_lstm_step(model, params, x, y, masked_labels)

    def client_loss(client_params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, client_params, (x,)), y)

    def masked_client_loss(client_params: Params, x: torch.Tensor, y: torch.Tensor,
                           masked_labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(mask_logits(functional_call(model, client_params, (x,)), masked_labels), y)

    return vmap(grad_and_value(masked_client_loss if masked else client_loss))


def _stacked_lstm_step(model: CharLSTM, params: Params, x: torch.Tensor, y: torch.Tensor,
                       masked_labels: Optional[torch.Tensor] = None) -> Tuple[Params, torch.Tensor]:
    names = list(params)
    leaves = {n: params[n].detach().requires_grad_(True) for n in names}
    with torch.enable_grad():
        logits = stacked_lstm_forward(model, leaves, x)
        if masked_labels is not None:  # [C, V] -> each client's rows of its [B, V] logits
            logits = mask_logits(logits, masked_labels.unsqueeze(1))
        count, batch = y.shape
        losses = F.cross_entropy(logits.reshape(count * batch, -1), y.reshape(-1), reduction="none")
        losses = losses.reshape(count, batch).mean(dim=1)
        grads = torch.autograd.grad(losses.sum(), [leaves[n] for n in names])
    return dict(zip(names, grads)), losses.detach()


def stacked_lstm_forward(model: CharLSTM, params: Params, x: torch.Tensor) -> torch.Tensor:
    """:meth:`CharLSTM.forward` of C clients at once: stacked ``params`` (name -> [C, ...]), ``x`` [C, B, T] ->
    logits [C, B, V]; the cell ops of ``nn.LSTM`` (gate order i, f, g, o) with batched matmuls."""
    count, batch, steps = x.shape
    embedding = params["embedding.weight"]
    clients = torch.arange(count, device=x.device).reshape(count, 1, 1)
    inputs = embedding[clients, x]  # [C, B, T, E]
    h = None
    for layer in range(model.layers):
        w_ih, w_hh = params[f"lstm.weight_ih_l{layer}"], params[f"lstm.weight_hh_l{layer}"]
        b_ih, b_hh = params[f"lstm.bias_ih_l{layer}"], params[f"lstm.bias_hh_l{layer}"]
        hidden = w_hh.shape[2]
        # every step's input projection at once: [C, B*T, In] x [C, In, 4H]
        projected = torch.baddbmm(b_ih.unsqueeze(1), inputs.reshape(count, batch * steps, -1),
                                  w_ih.transpose(1, 2)).reshape(count, batch, steps, 4 * hidden)
        w_hh_t, b_hh = w_hh.transpose(1, 2), b_hh.unsqueeze(1)
        h = projected.new_zeros(count, batch, hidden)
        c = projected.new_zeros(count, batch, hidden)
        outputs = []
        for t in range(steps):
            gates = projected[:, :, t] + torch.baddbmm(b_hh, h, w_hh_t)
            i, f, g, o = gates.chunk(4, dim=2)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            if layer + 1 < model.layers:
                outputs.append(h)
        if layer + 1 < model.layers:
            inputs = torch.stack(outputs, dim=2)
    return torch.baddbmm(params["fc.bias"].unsqueeze(1), h, params["fc.weight"].transpose(1, 2))


def client_schedule(task: ClientTask, size: int, batch_size: int, epochs: int,
                    local_steps: Optional[int] = None) -> List[torch.Tensor]:
    """The positions of every batch the client trains on, in order (:func:`~hasfl_ray.training.workspace.client_batches`
    of its own generator, all at once: batched training's objectives draw nothing from it; ``local_steps``: as
    :func:`~hasfl_ray.training.workspace.local_plan`)."""
    epochs, most = local_plan(epochs, local_steps, task.max_steps)
    return list(client_batches(client_generator(task), size, batch_size, epochs, max_steps=most))


def check_batchable(tasks: Sequence[ClientTask]) -> None:
    """A ValueError naming the first client whose objective cannot be stacked."""
    for task in tasks:
        if not getattr(task.objective, "batchable", False):
            raise ValueError(f"client {task.client}'s objective {type(task.objective).__name__} is not batchable; "
                             "train it with Trainer.train")


def train_batched(workspace: Workspace, tasks: Sequence[ClientTask],
                  global_params: Mapping[str, torch.Tensor]) -> List[ClientResult]:
    """Train ``tasks`` (one width, batchable objectives) together on ``workspace``'s device (a
    :class:`~hasfl_ray.training.trainer.Trainer` stands for its own workspace); results in task order, without the
    tasks' testing faults (the caller's: :func:`~hasfl_ray.training.task.with_faults`).

    Each result agrees with one-at-a-time training of the task to float rounding (the per-client arithmetic is the
    same; only kernels differ), and two calls give bit-identical results. (Clients of several widths:
    :func:`hasfl_ray.training.mixed.train_mixed`.)
    """
    if not tasks:
        return []
    workspace = getattr(workspace, "workspace", workspace)
    width = float(tasks[0].width)
    if any(float(t.width) != width for t in tasks):
        raise ValueError("train_batched trains clients of one width; group them with group_tasks")
    check_batchable(tasks)
    workspace.begin()
    names = list(workspace.specs)
    starts = [workspace.starting_point(task, global_params) for task in tasks]
    with torch.no_grad():
        initial = {n: torch.stack([start[n] for start in starts]) for n in names}
    del starts
    masked_labels = workspace.stacked_masked_labels(tasks)
    return train_stacked(workspace, tasks, workspace.model_at(width), initial, masked_labels=masked_labels)


class Layout:
    """How stacked clients' parameters lie in the stack: here each client's own packed tensors (one width); a
    padded layout (:class:`hasfl_ray.training.mixed.Padding`) puts clients of several widths in the widest one's
    shapes and keeps each client's 0/1 mask."""

    #: name -> [C, ...] 0/1 mask of each client's own coordinates in the stack (None: every coordinate is).
    masks: Optional[Params] = None

    def own(self, c: int, stacked: Params) -> Params:
        """Client ``c``'s tensors, in its own packed shapes, from the stack."""
        return {n: t[c] for n, t in stacked.items()}

    def pad(self, c: int, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Client ``c``'s tensor ``name`` (its packed shape) in the stack's shape."""
        return tensor


def train_stacked(workspace: Workspace, tasks: Sequence[ClientTask], model: nn.Module, initial: Params,
                  layout: Optional[Layout] = None, masked_labels: Optional[torch.Tensor] = None) -> List[ClientResult]:
    """Train ``tasks`` from their stacked starting points ``initial`` (name -> [C, ...], laid out as ``layout``
    says: by default each client's packed tensors) with ``model``'s forward; results in task order.
    ``masked_labels``: ``masked_loss``'s stacked label masks
    (:meth:`~hasfl_ray.training.workspace.Workspace.stacked_masked_labels`), or None."""
    layout = Layout() if layout is None else layout
    device, s = workspace.device, workspace.settings
    names = list(initial)
    count = len(tasks)
    params = {n: t.clone() for n, t in initial.items()}
    optimizer = StackedSGD([initial[n] for n in names], [t.lr for t in tasks], s.momentum, s.weight_decay,
                           s.clip_norm)

    # The objectives' gradient terms: grad += coef_i (w − w⁰_i) + shift_i.
    terms = [task.objective.gradient_terms(layout.own(c, initial)) for c, task in enumerate(tasks)]
    coefs = [float(coef) for coef, _ in terms]
    coef_common, coef_vector = common_or_vector(coefs, device)
    has_coef = any(coef != 0 for coef in coefs)
    shift: Optional[Params] = None
    if any(shift_c is not None for _, shift_c in terms):
        shift = {n: torch.stack([layout.pad(c, n, shift_c[n].to(device, initial[n].dtype)) if shift_c is not None
                                 else torch.zeros_like(initial[n][c]) for c, (_, shift_c) in enumerate(terms)])
                 for n in names}
    masks = layout.masks

    sizes = [workspace.dataset.client_size(task.client) for task in tasks]
    schedules = [client_schedule(task, sizes[c], s.batch_size, s.local_epochs, s.local_steps)
                 for c, task in enumerate(tasks)]
    model.train()
    step = batched_step(model, masked=masked_labels is not None)
    losses: List[Tuple[List[int], torch.Tensor]] = []
    longest = max((len(schedule) for schedule in schedules), default=0)
    for k in range(longest):
        by_size: "OrderedDict[int, List[int]]" = OrderedDict()
        for c, schedule in enumerate(schedules):
            if k < len(schedule):
                by_size.setdefault(int(schedule[k].numel()), []).append(c)
        for members in by_size.values():
            whole = len(members) == count
            index = None if whole else torch.tensor(members, dtype=torch.int64, device=device)

            def pick(tensor: torch.Tensor) -> torch.Tensor:
                return tensor if index is None else tensor.index_select(0, index)

            batches = [workspace.dataset.client_batch(tasks[c].client, schedules[c][k]) for c in members]
            x = torch.stack([augmented(workspace, xb, tasks[c], k) for c, (xb, _) in zip(members, batches)])
            y = torch.stack([yb for _, yb in batches])
            sub = {n: pick(params[n]) for n in names}
            grads, loss = step(sub, x, y) if masked_labels is None else step(sub, x, y, pick(masked_labels))
            losses.append((members, loss.detach()))
            with torch.no_grad():
                if has_coef:  # FedProx: μ (w − w⁰)
                    for n in names:
                        diff = sub[n] - pick(initial[n])
                        if coef_common is not None:
                            grads[n].add_(diff, alpha=coef_common)
                        else:
                            grads[n].add_(diff * per_client(pick(coef_vector), diff))
                if shift is not None:  # SCAFFOLD: c − c_i
                    for n in names:
                        grads[n].add_(pick(shift[n]))
                if masks is not None:  # padded coordinates: no gradient, whatever was added to it
                    for n in names:
                        grads[n].mul_(pick(masks[n]))
                # every client takes its first step at step 0
                optimizer.step([sub[n] for n in names], [grads[n] for n in names], index, first=k == 0)
                if index is not None:
                    for n in names:
                        params[n].index_copy_(0, index, sub[n])

    loss_sums = [0.0] * count
    for members, values in losses:
        for c, value in zip(members, values.to("cpu").tolist()):
            loss_sums[c] += value
    results = []
    with torch.no_grad():
        for c, task in enumerate(tasks):
            steps = len(schedules[c])
            trained = layout.own(c, params)
            start = layout.own(c, initial)
            update = packed_update(trained, start)
            extras = task.objective.finish_params(trained, start, steps, task.lr)
            results.append(client_result(task, update, sizes[c], loss_sums[c], steps, extras))
    return results
