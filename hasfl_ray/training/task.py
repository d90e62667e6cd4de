"""What a trainer is asked to do: one client's task in one round (:class:`ClientTask`), the local optimiser's
settings (:class:`OptimizerSettings`) and how a client trains (:class:`LocalObjective`), plus the two testing
faults a task may carry (``--fault-inject``). Below every training module: it imports only :mod:`result`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from hasfl_ray.training.result import ClientResult


@dataclass(frozen=True)
class OptimizerSettings:
    """Local SGD of the paper: momentum 0.9, weight decay 1e-4, grad-norm clipping (0 disables)."""

    momentum: float = 0.9
    weight_decay: float = 1e-4
    clip_norm: float = 10.0
    local_epochs: int = 1
    batch_size: int = 32
    local_steps: Optional[int] = None  # a fixed number of local iterations in place of local_epochs
    augmentation: str = "none"  # crop_flip: RandomCrop(padding 4) and a horizontal flip on image batches
    # the local optimiser (training/local_optim.py): sgd, the step above on every path, or a torch.optim class by name
    # with its keyword options (those clients train one at a time)
    optimizer: str = "sgd"
    optimizer_options: Dict[str, Any] = field(default_factory=dict)
    # the arithmetic of the forward and loss (hasfl_ray/training/precision.py): fp32, or bf16 autocast
    precision: str = "fp32"


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
    #: With ``masked_loss`` on: bool [num_classes], True at the labels the client does not hold in its training data,
    #: set by the trainer before :meth:`setup`; None otherwise. :meth:`logits` applies it.
    masked_labels: Optional[torch.Tensor] = None

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

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``model(x)``, with ``masked_loss`` the logits of the labels the client does not hold set to 0
        (:func:`mask_logits`). An objective that overrides :meth:`loss` honours ``masked_loss`` by taking its
        logits from here."""
        return mask_logits(model(x), self.masked_labels)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(model, x), y)

    def adjust_gradients(self, model: nn.Module) -> None:
        """Called after backward, before clipping and the optimiser step."""

    def finish(self, model: nn.Module, initial: Mapping[str, torch.Tensor], steps: int, lr: float) -> Dict[str, Any]:
        """Extra results for the server (e.g. SCAFFOLD's control-variate delta). Default: none."""
        return {}

    def held(self, name: str, delta: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A masked client's (``ClientTask.masks``) held coordinates of parameter ``name``, the ones its update
        carries, given its trained ``delta`` (full shape) and its ``mask``: a bool tensor of the shape, within
        ``mask``. Default: ``mask`` (FIARSE: the coordinates its update changed)."""
        return mask

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


def mask_logits(logits: torch.Tensor, masked_labels: Optional[torch.Tensor]) -> torch.Tensor:
    """``logits`` [..., num_classes] with the columns where ``masked_labels`` (bool [num_classes]) is True set to 0:
    HeteroFL's masked cross-entropy (``masked_loss``; src/models/resnet.py, ``out.masked_fill(label_mask == 0, 0)``
    with ``label_mask`` 1 at the client's label split). ``logits`` itself where ``masked_labels`` is None."""
    return logits if masked_labels is None else logits.masked_fill(masked_labels, 0)


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
    #: The most local steps the client takes (the device clock's ``partial`` deadline policy: the steps that fit
    #: before the deadline, docs/clock.md); None: every step of its local epochs.
    max_steps: Optional[int] = None
    #: Masked cross-entropy (``masked_loss``, HeteroFL's and FedRolex's ``mask 1``): the logits of the labels the
    #: client does not hold in its training data are set to 0 in its training loss, on every training path.
    masked_loss: bool = False
    #: The weight ρ of a proximal term ρ/2 ||w − w_received||² added to the objective's (FedAsync's worker, Xie et al.
    #: 2019, Algorithm 1: ``async_rho``): ρ (w − w_received) joins each local gradient after the objective's
    #: ``adjust_gradients``, before clipping. Such a client trains one at a time, eagerly.
    proximal: float = 0.0
    #: A depth sub-model (``sub_model: depth``, :mod:`hasfl_ray.models.depth`): the client trains the first ``depth``
    #: stages of a model with exits and the exits up to it; None: the whole network (every other run).
    depth: Optional[int] = None

    #: Per channel group of the model (a sequential conv/linear chain, :func:`hasfl_ray.models.index_slicing.
    #: channel_groups`), the sorted channels the client holds, ceil(width x C) of each (FLuID-style sets): it trains
    #: the width-p network on those channels (the next layer's inputs follow) and returns
    #: :class:`~hasfl_ray.aggregation.packed.IndexedUpdate` s. None: its leading slice (or window). Trains eagerly.
    channels: Optional[Tuple[Tuple[int, ...], ...]] = None
    #: Unstructured sub-models (``Algorithm.parameter_masks``): (parameter name, its bitmask) pairs, each bitmask
    #: uint8 ceil(numel / 8) bytes in :func:`~hasfl_ray.aggregation.packed.pack_bits`'s layout. The client trains the
    #: full-shape network with w ⊙ m for each masked parameter (the others whole) and returns
    #: :class:`~hasfl_ray.aggregation.packed.MaskedUpdate` s of them. None: no masks. Trains eagerly.
    masks: Optional[Tuple[Tuple[str, torch.Tensor], ...]] = None


class ExitsObjective(LocalObjective):
    """A depth sub-model's loss (DepthFL's, without its self-distillation): the sum over the model's exits up to its
    depth of each exit's cross-entropy (``forward_exits``; the task's masked labels applied to each)."""

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return sum(F.cross_entropy(mask_logits(out, self.masked_labels), y) for out in model.forward_exits(x))


def inject_fault(result: "ClientResult", fault: Optional[str]) -> "ClientResult":
    """``result`` with the first element of its update set to NaN or +Inf (``fault``), as a diverged client's."""
    if fault and result.update:
        first = next(iter(result.update))
        packed = result.update[first]
        values = packed if isinstance(packed, torch.Tensor) else packed.values  # an index set's or mask's values
        poisoned = values.clone()
        poisoned.view(-1)[0] = float("nan") if fault == "nan" else float("inf")
        result.update = {**result.update, first: poisoned if isinstance(packed, torch.Tensor)
                         else dataclasses.replace(packed, values=poisoned)}
    return result


def with_faults(tasks: Sequence[ClientTask], train: Callable[[], List[ClientResult]]) -> List[ClientResult]:
    """``train()``'s results for ``tasks`` (in task order) with the tasks' testing faults: a ``"trainer"`` fault
    raises before anything trains, ``"nan"``/``"inf"`` poison the update (:func:`inject_fault`)."""
    for task in tasks:
        if task.fault == "trainer":
            raise RuntimeError(f"injected trainer failure (--fault-inject trainer-error@{task.round})")
    return [inject_fault(result, task.fault) for task, result in zip(tasks, train())]


def client_result(task: ClientTask, update: Dict[str, torch.Tensor], samples: int, loss_sum: float, steps: int,
                  extras: Dict[str, Any]) -> ClientResult:
    """The :class:`ClientResult` of ``task`` after ``steps`` local steps (mean loss ``loss_sum / steps``); the
    objective is asked :meth:`~LocalObjective.trained_width` after its finish."""
    return ClientResult(task.client, task.width, update, samples, loss_sum / max(steps, 1), steps, extras,
                        offset=task.offset, trained_width=task.objective.trained_width())
