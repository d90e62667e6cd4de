"""The trainer a backend (the local process or a Ray actor) drives: trains the units a backend planned.

A backend plans a round's training units once (:func:`~hasfl_ray.training.batched.group_tasks`: one client
alone, or the batchable clients of one width together, or with ``--client-batching mixed`` of several widths) and
hands each to :meth:`Trainer.train_unit`, which trains it without grouping again: a client alone one at a time
(:mod:`hasfl_ray.training.eager`), a group of one width as one batched computation
(:mod:`hasfl_ray.training.batched`), a group of several widths as one stack padded to the widest
(:mod:`hasfl_ray.training.mixed`). The trainer's device state is its
:class:`~hasfl_ray.training.workspace.Workspace`.
"""

from __future__ import annotations

from typing import Iterable, List, Mapping, Optional, Sequence

import torch
from torch import nn

from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.training.batched import group_tasks, train_batched
from hasfl_ray.training.eager import train_eager
from hasfl_ray.training.local_optim import builtin
from hasfl_ray.training.mixed import train_mixed
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.task import ClientTask, OptimizerSettings, with_faults
from hasfl_ray.training.workspace import Workspace


class Trainer:
    """Trains clients' sub-models on one device; holds the dataset there once and reuses model buffers.

    Its arguments are its :class:`~hasfl_ray.training.workspace.Workspace`'s. With ``cuda_graphs`` it trains the
    clients whose objective allows it (:func:`~hasfl_ray.training.task.graphable`) with a whole local step on static
    tensors (:mod:`hasfl_ray.training.graphed`), captured as a CUDA graph and replayed on a CUDA device; on a CPU the
    same static-buffer sequence runs eagerly (same results).
    """

    def __init__(self, dataset: FederatedDataset, model_name: str, settings: OptimizerSettings,
                 device: str = "cpu", threads: int = 1, cuda_graphs: bool = False):
        self.workspace = Workspace(dataset, model_name, settings, device, threads, cuda_graphs)

    def train(self, task: ClientTask, global_params: Mapping[str, torch.Tensor]) -> ClientResult:
        """Train one client alone: extract the width-p sub-model from ``global_params``, run K local epochs,
        return Δ_i (packed)."""
        return with_faults([task], lambda: [train_eager(self.workspace, task, global_params)])[0]

    def train_from(self, task: ClientTask, start: Mapping[str, torch.Tensor]) -> ClientResult:
        """:meth:`train` from the client's sub-model itself (``start``, name -> tensor as
        :meth:`~hasfl_ray.training.workspace.Workspace.starting_point` cuts it from the global parameters): what a
        client that receives only its sub-model trains (:mod:`hasfl_ray.flower`), with the same result."""
        return with_faults([task], lambda: [train_eager(self.workspace, task, None, start)])[0]

    def train_unit(self, tasks: Sequence[ClientTask], global_params: Mapping[str, torch.Tensor]
                   ) -> List[ClientResult]:
        """Train one planned unit (:func:`~hasfl_ray.training.batched.group_tasks`), results in task order: a
        single client with :meth:`train`, several (batchable objectives) as one batched computation per local
        step: of one width with :func:`~hasfl_ray.training.batched.train_batched`, of several widths padded to the
        widest with :func:`~hasfl_ray.training.mixed.train_mixed`."""
        if len(tasks) == 1:
            return [self.train(tasks[0], global_params)]
        s = self.workspace.settings  # index sets, masks, another local optimiser than sgd, bf16: one at a time
        if any(task.channels is not None or task.masks is not None for task in tasks) or \
                not builtin(s.optimizer, s.optimizer_options) or s.precision != "fp32":
            return with_faults(tasks, lambda: [train_eager(self.workspace, task, global_params) for task in tasks])
        if len({float(task.width) for task in tasks}) > 1:
            return with_faults(tasks, lambda: train_mixed(self.workspace, tasks, global_params))
        return with_faults(tasks, lambda: train_batched(self.workspace, tasks, global_params))

    def train_group(self, tasks: Sequence[ClientTask], global_params: Mapping[str, torch.Tensor],
                    batching: str = "on") -> List[ClientResult]:
        """Train several clients not yet planned into units, results in task order: plans them
        (:func:`~hasfl_ray.training.batched.group_tasks` with ``batching``, on or mixed) and trains each unit with
        :meth:`train_unit`. Agrees with ``[train(t) for t in tasks]`` to float rounding. (Backends plan once and
        call :meth:`train_unit`; this is for callers holding a plain list of tasks.)"""
        results: List[Optional[ClientResult]] = [None] * len(tasks)
        for unit in group_tasks(tasks, batching=batching, pads_exactly=self.workspace.pads_exactly):
            for position, result in zip(unit, self.train_unit([tasks[k] for k in unit], global_params)):
                results[position] = result
        return results

    # The workspace's state, as the trainer's (callers read and release it through the trainer).

    def model_at(self, width: float) -> nn.Module:
        """A cached width-``width`` network on this trainer's device (buffers reused across rounds)."""
        return self.workspace.model_at(width)

    def release(self, keep: Iterable[float] = ()) -> None:
        """Drop cached models (and their device memory), except those of the widths in ``keep``."""
        self.workspace.release(keep)

    @property
    def cached_widths(self) -> List[float]:
        """Widths whose networks are cached, oldest first."""
        return self.workspace.cached_widths

    @property
    def device(self) -> torch.device:
        return self.workspace.device

    @property
    def dataset(self) -> FederatedDataset:
        return self.workspace.dataset

    @property
    def model_name(self) -> str:
        return self.workspace.model_name

    @property
    def settings(self) -> OptimizerSettings:
        return self.workspace.settings

    @property
    def threads(self) -> int:
        return self.workspace.threads

    @property
    def specs(self):
        return self.workspace.specs

    @property
    def steps(self):
        """The captured local steps (``cuda_graphs``), or None."""
        return self.workspace.steps
