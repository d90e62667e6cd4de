"""Local training of one client's width-p sub-model, as a trainer (local process or Ray actor) runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.models import build_model, extract, register_model
from hasfl_ray.models.slicing import ParamSpec, extract_window
from hasfl_ray.training.graphed import StaticStep, StepCache
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.seeding import STREAM_CLIENT, torch_generator
from hasfl_ray.training.step import LocalSGD


@dataclass(frozen=True)
class OptimizerSettings:
    """Local SGD of the paper: momentum 0.9, weight decay 1e-4, grad-norm clipping (0 disables)."""

    momentum: float = 0.9
    weight_decay: float = 1e-4
    clip_norm: float = 10.0
    local_epochs: int = 1
    batch_size: int = 32


class LocalObjective:
    """How a client trains: the batch loss and the gradient adjustment before each step.

    The default is plain cross-entropy. Algorithms subclass it (FedProx's proximal term, SCAFFOLD's
    control-variate correction, FjORD's ordered dropout with distillation). Instances travel to the
    trainers, so they must be picklable and hold only what the client needs.

    Batched training (:mod:`hasfl_ray.training.batched`) trains the clients of one width together and calls
    none of ``setup``, ``loss``, ``adjust_gradients`` and ``finish``: it uses the cross-entropy loss, the
    stacked form of the gradient adjustment (:meth:`gradient_terms`) and :meth:`finish_params`. An objective
    says it fits that form with ``batchable = True``; a subclass that overrides ``loss``, ``adjust_gradients``
    ``finish`` or ``setup`` without setting ``batchable`` itself is not batchable and is trained one at a time.
    """

    #: Whether batched training may train this client stacked with others (see the class docstring).
    batchable = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "batchable" not in cls.__dict__ and any(name in cls.__dict__ for name in
                                                   ("setup", "loss", "adjust_gradients", "finish")):
            cls.batchable = False

    def setup(self, model: nn.Module, initial: Mapping[str, torch.Tensor], width: float,
              generator: torch.Generator, model_at: Optional[Callable[[float], nn.Module]] = None) -> None:
        """Called once before the first step with the client's starting (sub-model) parameters.

        ``model_at(p)`` gives a (cached, shared) network of the same architecture at width p, for objectives
        that also run nested narrower widths through ``torch.func.functional_call`` (FjORD).
        """

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    def adjust_gradients(self, model: nn.Module) -> None:
        """Called after backward, before clipping and the optimiser step."""

    def finish(self, model: nn.Module, initial: Mapping[str, torch.Tensor], steps: int, lr: float) -> Dict[str, Any]:
        """Extra results for the server (e.g. SCAFFOLD's control-variate delta). Default: none."""
        return {}

    def trained_width(self) -> Optional[float]:
        """The width the client effectively trained, when it differs from the task's (FjORD's mean sampled width);
        asked after :meth:`finish` and reported as ``ClientResult.trained_width``. Default: None (the task's)."""
        return None

    def gradient_terms(self, initial: Mapping[str, torch.Tensor]
                       ) -> Tuple[float, Optional[Mapping[str, torch.Tensor]]]:
        """Batched training's form of :meth:`adjust_gradients`: ``(coef, shift)`` such that every step adds
        ``coef · (w − initial) + shift`` (shift: name -> tensor of the client's parameter shapes, or None) to the
        gradient before clipping. Default: ``(0, None)``, no adjustment."""
        return 0.0, None

    def finish_params(self, params: Mapping[str, torch.Tensor], initial: Mapping[str, torch.Tensor], steps: int,
                      lr: float) -> Dict[str, Any]:
        """Batched training's form of :meth:`finish`, given the trained parameters (name -> tensor, no grad)."""
        return {}


def graphable(objective: LocalObjective) -> bool:
    """Whether ``objective`` trains with the default loss and no gradient adjustment, so that its whole local step
    can run on static tensors (:mod:`hasfl_ray.training.graphed`)."""
    cls = type(objective)
    return all(getattr(cls, name) is getattr(LocalObjective, name) for name in ("loss", "adjust_gradients", "setup"))


@dataclass
class ClientTask:
    """One client's work in one round: everything a trainer needs besides the global parameters."""

    client: int
    round: int
    width: float
    lr: float
    seed: int
    objective: LocalObjective = field(default_factory=LocalObjective)
    #: First channel of the kept window in every scaled dim (wrapping); 0 = the leading slice (FedRolex rolls it).
    offset: int = 0
    #: Testing (``--fault-inject``): ``"nan"`` or ``"inf"`` poisons the returned update, ``"trainer"`` raises.
    fault: Optional[str] = None


def inject_fault(result: "ClientResult", fault: Optional[str]) -> "ClientResult":
    """``result`` with the first element of its update set to NaN or +Inf (``fault``), as a diverged client's."""
    if fault and result.update:
        first = next(iter(result.update))
        poisoned = result.update[first].clone()
        poisoned.view(-1)[0] = float("nan") if fault == "nan" else float("inf")
        result.update = {**result.update, first: poisoned}
    return result


class Trainer:
    """Trains clients' sub-models on one device; holds the dataset there once and reuses model buffers.

    Args:
        dataset: the federated dataset (moved to ``device``).
        model_name: key in :data:`hasfl_ray.models.MODEL_CONFIGS`.
        settings: local optimiser settings.
        device: where training runs.
        threads: intra-op CPU threads while training (fixed so results do not depend on the machine).
        cuda_graphs: train the clients whose objective allows it (:func:`~hasfl_ray.training.graphed.graphable`)
            with a whole local step on static tensors (:mod:`hasfl_ray.training.graphed`), captured as a CUDA graph
            and replayed on a CUDA device; on a CPU the same static-buffer sequence runs eagerly (same results).
    """

    def __init__(self, dataset: FederatedDataset, model_name: str, settings: OptimizerSettings,
                 device: str = "cpu", threads: int = 1, cuda_graphs: bool = False):
        self.device = torch.device(device)
        self.dataset = dataset.to(self.device)
        self.model_name, self.settings, self.threads = model_name, settings, threads
        register_model(model_name, getattr(dataset, "model_config", None))  # a dataset plug-in's own model
        self.specs: Dict[str, ParamSpec] = build_model(model_name).param_specs()
        self._models: Dict[float, nn.Module] = {}
        self.steps: Optional[StepCache] = StepCache(capture=self.device.type == "cuda") if cuda_graphs else None
        # A dataset that gathers a batch on its device from positions held there gets each epoch's order on the
        # device once (no host-to-device copy, which synchronises, per batch); others get host positions.
        self._device_positions = self.device.type != "cpu" and self.dataset.device_positions

    def model_at(self, width: float) -> nn.Module:
        """A cached width-``width`` network on this trainer's device (buffers reused across rounds)."""
        if width not in self._models:
            self._models[width] = build_model(self.model_name, width).to(self.device)
        return self._models[width]

    def release(self, keep: Iterable[float] = ()) -> None:
        """Drop cached models (and their device memory), except those of the widths in ``keep``."""
        keep = set(keep)
        for width in [w for w in self._models if w not in keep]:
            del self._models[width]
        if self.steps is not None:
            self.steps.release(keep)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @property
    def cached_widths(self) -> List[float]:
        """Widths whose networks are cached, oldest first."""
        return list(self._models)

    def train(self, task: ClientTask, global_params: Mapping[str, torch.Tensor]) -> ClientResult:
        """Extract the width-p sub-model from ``global_params``, run K local epochs, return Δ_i (packed)."""
        if task.fault == "trainer":
            raise RuntimeError(f"injected trainer failure (--fault-inject trainer-error@{task.round})")
        if self.device.type == "cpu":
            torch.set_num_threads(self.threads)
        model = self.model_at(task.width)
        params = dict(model.named_parameters())
        with torch.no_grad():
            if task.offset:
                initial = {name: extract_window(global_params[name], spec, task.width, task.offset).to(self.device)
                           for name, spec in self.specs.items()}
            else:
                initial = {name: extract(global_params[name], spec, task.width).to(self.device)
                           for name, spec in self.specs.items()}
            for name, tensor in initial.items():
                params[name].copy_(tensor)
        generator = torch_generator(task.seed, STREAM_CLIENT, task.round, task.client)
        objective = task.objective
        objective.setup(model, initial, task.width, generator, model_at=self.model_at)
        s = self.settings
        # clip_grad_norm_ + torch.optim.SGD, bit for bit, without their per-step Python (hasfl_ray.training.step).
        optimizer = LocalSGD(list(model.parameters()), task.lr, s.momentum, s.weight_decay, s.clip_norm)
        n = self.dataset.client_size(task.client)
        model.train()
        steps = 0
        # The losses are summed on the device in float64 (what a Python float sum of them gives), read once.
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        # A whole step on static tensors (a CUDA graph on CUDA) for a client with at least one full batch (its
        # first batch then has the static shape) whose objective is the default one (hasfl_ray.training.graphed).
        graphed = self.steps is not None and n >= s.batch_size and graphable(objective)
        static: Optional[StaticStep] = None
        for _ in range(s.local_epochs):
            order = torch.randperm(n, generator=generator)
            if self._device_positions:
                order = order.to(self.device)
            for start in range(0, n, s.batch_size):
                positions = order[start:start + s.batch_size]
                if positions.numel() < 2 and steps > 0:
                    continue  # a batch of one sample gives BatchNorm no batch statistics
                x, y = self.dataset.client_batch(task.client, positions)
                if graphed:
                    if static is None:
                        static = self.steps.get(model, task.width, x, y, task.lr, s)
                        static.begin_client()
                    static.run(x, y)  # a short last batch runs eagerly on the same parameters and buffers
                else:
                    optimizer.zero_grad()
                    loss = objective.loss(model, x, y)
                    loss.backward()
                    objective.adjust_gradients(model)
                    optimizer.step()  # clips first when s.clip_norm > 0
                    loss_sum += loss.detach()
                steps += 1
        if static is not None:
            loss_sum = static.loss_sum
        with torch.no_grad():
            update = {name: (params[name].detach() - initial[name]).to("cpu", torch.float32).contiguous()
                      for name in self.specs}
        extras = objective.finish(model, initial, steps, task.lr)
        return inject_fault(ClientResult(task.client, task.width, update, n, float(loss_sum) / max(steps, 1), steps, extras,
                                         offset=task.offset, trained_width=objective.trained_width()), task.fault)

    def train_group(self, tasks: Sequence[ClientTask], global_params: Mapping[str, torch.Tensor]) -> List[ClientResult]:
        """Train several clients, results in task order: the batchable clients of one width as one batched
        computation per local step (:func:`hasfl_ray.training.batched.train_batched`), every other client (and a
        width with one client) one at a time with :meth:`train`. Agrees with ``[train(t) for t in tasks]`` to
        float rounding."""
        from hasfl_ray.training.batched import group_tasks, train_batched
        for task in tasks:
            if task.fault == "trainer":
                raise RuntimeError(f"injected trainer failure (--fault-inject trainer-error@{task.round})")

        results: List[Optional[ClientResult]] = [None] * len(tasks)
        for unit in group_tasks(tasks, batching=True):
            if len(unit) == 1:
                results[unit[0]] = self.train(tasks[unit[0]], global_params)
            else:
                for position, result in zip(unit, train_batched(self, [tasks[k] for k in unit], global_params)):
                    results[position] = inject_fault(result, tasks[position].fault)
        return results
