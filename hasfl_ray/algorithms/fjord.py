"""FjORD (Horváth et al., 2021): ordered dropout inside each client's p_i^max model, with self-distillation (the
default) or without it (``fjord_kd: false``: each local step trains the drawn nested width alone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.algorithms.options import FLOAT32_MAX, check_range
from hasfl_ray.errors import ConfigError
from hasfl_ray.federation import ladder_of
from hasfl_ray.models.slicing import region
from hasfl_ray.registry import register_algorithm
from hasfl_ray.training.local import LocalObjective
from hasfl_ray.training.seeding import STREAM_ALGORITHM, stream_seed
from hasfl_ray.training.task import mask_logits


def nested_parameters(model: nn.Module, width: float) -> Dict[str, torch.Tensor]:
    """The width-``width`` sub-network's parameters as differentiable slices of a wider ``model``'s.

    ``model.param_specs()`` describes the full-width model, so the slice of every parameter is the
    absolute ceil(width · C) leading channels (inside each gate block), the same coordinates as
    :func:`hasfl_ray.models.extract` takes from the global model.
    """
    params = dict(model.named_parameters())
    out = {}
    for name, spec in model.param_specs().items():
        shape = spec.sliced_shape(width)
        out[name] = region(params[name], shape, spec.gate_blocks).reshape(shape)
    return out


class OrderedDropoutObjective(LocalObjective):
    """FjORD's local step. With ``kd`` (the default): loss = CE(f_{p_max}(x), y) + λ · KL(softmax f_{p_max}(x)
    detached ‖ softmax f_p(x)); without: loss = CE(f_p(x), y) (FjORD's ordered dropout without distillation).
    With ``masked_loss`` every f here is the network's output with the logits of the client's absent labels set to
    0 (:meth:`~hasfl_ray.training.task.LocalObjective.logits`), as HeteroFL masks its forward's output.

    At every step a width p is drawn uniformly from ``widths`` (the tiers ≤ p_i^max); f_p is the nested
    sub-network of the client's model (its leading channels), run with the same parameters through
    ``torch.func.functional_call``, so one backward and one optimiser step train both (with ``kd``) or the
    width-p coordinates only (without: the gradient of every coordinate outside f_p is zero). With ``kd``, when
    p = p_i^max the distillation term is identically zero and is skipped; without, p = p_i^max trains f_{p_max}.

    Args:
        widths: the widths to sample from (ascending; the largest is the client's model width).
        distill_weight: λ (unused without ``kd``).
        seed: seed of the width draws (a stream of its own, so batch order matches other algorithms).
        kd: self-distillation (True) or the drawn width's cross-entropy alone (False).

    Not batchable: each client draws its own width every step, so stacked clients would run different
    sub-networks; batched training trains FjORD's clients one at a time.
    """

    batchable = False

    def __init__(self, widths: Sequence[float], distill_weight: float, seed: int, kd: bool = True):
        self.widths = [float(w) for w in widths]
        self.distill_weight = float(distill_weight)
        self.seed = int(seed)
        self.kd = bool(kd)
        self.sampled: List[float] = []
        self._rng: Optional[np.random.Generator] = None
        self._model_at = None
        self._width = 1.0

    def setup(self, model, initial, width, generator, model_at=None) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._model_at = model_at
        self._width = float(width)
        self.sampled = []

    def sample_width(self) -> float:
        width = self.widths[int(self._rng.integers(len(self.widths)))]
        self.sampled.append(width)
        return width

    def nested_logits(self, model: nn.Module, width: float, x: torch.Tensor) -> torch.Tensor:
        """f_width(x): the width-``width`` sub-network of ``model`` on ``x``, differentiable into ``model``'s slices."""
        if self._model_at is None:
            raise RuntimeError("FjORD needs the trainer's model_at to run nested widths")
        return mask_logits(functional_call(self._model_at(width), nested_parameters(model, width), (x,)),
                           self.masked_labels)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not self.kd:  # ordered dropout without distillation: the drawn width's cross-entropy alone
            width = self.sample_width()
            return F.cross_entropy(self.logits(model, x) if width >= self._width else
                                   self.nested_logits(model, width, x), y)
        logits = self.logits(model, x)
        loss = F.cross_entropy(logits, y)
        width = self.sample_width()
        if width < self._width and self.distill_weight > 0:
            sub_logits = self.nested_logits(model, width, x)
            teacher = F.log_softmax(logits.detach(), dim=1)
            distill = F.kl_div(F.log_softmax(sub_logits, dim=1), teacher, log_target=True, reduction="batchmean")
            loss = loss + self.distill_weight * distill
        return loss

    def finish(self, model, initial, steps, lr) -> Dict[str, Any]:
        self._model_at = None
        return {"sampled_widths": list(self.sampled)}

    def trained_width(self) -> float:
        """The mean sampled width (``ClientResult.trained_width``, what FjORD's avg_p reports)."""
        return float(np.mean(self.sampled)) if self.sampled else self._width


@dataclass
class FjORDOptions:
    fjord_distill_weight: float = 1.0  # weight of the self-distillation term (KL to the max-width output)
    fjord_kd: bool = True  # false: FjORD's OD without KD (each step trains the drawn width's CE alone)

    def __post_init__(self) -> None:
        if not isinstance(self.fjord_kd, bool):
            raise ConfigError(f"fjord_kd is {self.fjord_kd!r}; expected true or false")
        check_range("fjord_distill_weight", self.fjord_distill_weight, 0, FLOAT32_MAX, "a number >= 0")

    def inert(self, config):
        """Without KD each step trains the drawn width's cross-entropy alone: no distillation term to weigh."""
        if self.fjord_kd:
            return {}
        return {"fjord_distill_weight": ("fjord_kd is false (no distillation term)", "fjord_kd true")}


@register_algorithm("fjord")
class FjORD(Algorithm):
    """Client i trains its p_i^max model; each local step adds a uniformly drawn nested width ≤ p_i^max
    distilled from the max-width output (``fjord_kd``, the default), or, with ``fjord_kd`` false, trains that drawn
    width alone with cross-entropy. avg_p reports the mean sampled width.

    The sampled widths are the federation's capacity tiers (the width ladder's: the protocol's 0.25/0.5/0.75/1.0
    by default, and any other p^max present) up to p_i^max. BatchNorm: the models normalise with the statistics of each
    forward pass's own batch (no running statistics), so every sampled width uses its own statistics and
    shares the affine parameters of its leading channels (FjORD keeps per-width statistics and shared
    affine parameters: the same separation, without stored statistics).
    """

    options_class = FjORDOptions

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        widths = ladder_of(config).widths  # the paper's tiers by default
        self.tiers = sorted(set(float(t) for t in widths) | set(float(p) for p in np.unique(self.p_max)))

    def widths_for(self, client: int) -> List[float]:
        """The widths client ``client`` samples from: every tier ≤ its p^max."""
        return [t for t in self.tiers if t <= self.p_max[client] + 1e-12]

    def client_cost(self, round: int, client: int, width: float, cost):
        """The device clock's FjORD: each local step that draws a nested width q below the client's (the same draws
        as its objective's, from the same seed) and distils runs the width-q network forward and backward on the
        batch too, TRAIN_FACTOR x its forward MACs a sample; the teacher is the step's own forward (docs/clock.md).
        Without KD (``fjord_kd`` false) a step runs the width-q network only: its width-``width`` training MACs are
        replaced by width q's."""
        from hasfl_ray.clock.cost import TRAIN_FACTOR

        widths = self.widths_for(client)
        rng = np.random.default_rng(stream_seed(self.config.seed, STREAM_ALGORITHM, round, client))
        drawn = [widths[int(rng.integers(len(widths)))] for _ in range(cost.steps)]  # one draw a step, as loss()
        macs = self.clock.costs.macs
        if not self.options.fjord_kd:
            extra = [TRAIN_FACTOR * (macs(q) - macs(width)) * int(batch) if q < width else 0
                     for q, batch in zip(drawn, cost.batches)]
            return cost.plus(step_macs=np.asarray(extra, dtype=np.int64))
        if self.options.fjord_distill_weight <= 0:
            return cost
        extra = [TRAIN_FACTOR * macs(q) * int(batch) if q < width else 0
                 for q, batch in zip(drawn, cost.batches)]
        return cost.plus(step_macs=np.asarray(extra, dtype=np.int64))

    def objective(self, round: int, client: int, width: float) -> LocalObjective:
        seed = stream_seed(self.config.seed, STREAM_ALGORITHM, round, client)
        return OrderedDropoutObjective(self.widths_for(client), self.options.fjord_distill_weight, seed,
                                       kd=self.options.fjord_kd)
