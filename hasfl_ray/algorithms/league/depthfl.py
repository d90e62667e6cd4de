"""DepthFL (Kim et al., ICLR 2023): depth sub-models with one classifier per depth and mutual self-distillation, as
Flower's DepthFL baseline (written by the paper's first author) computes it.

Source: github.com/adap/flower, commit fdef7afb1dca3030553be302366cfd285ed6632c (``baselines/depthfl`` last changed
in 7e1d22642fa084138fc293a3e1b7257881a61383): ``depthfl/models.py`` (``KLLoss``, ``_train_one_epoch``, ``test``),
``depthfl/client.py::FlowerClient.fit`` (the consistency weight, the learning-rate decay), ``depthfl/main.py`` (the
depth of each client), ``depthfl/strategy.py::aggregate`` (the server), ``depthfl/conf/config.yaml`` (defaults).

The rule, read from that code:

- **Depths.** The ResNet-18 is cut after each of its 4 stages; client ``cid`` of N holds the first
  ``cid // (N // 4) + 1`` stages, each with its own classifier (per exit an attention mask, ``attention{k}``: a
  SepConv, a norm, ReLU, a 2x upsampling and a sigmoid, multiplied into the stage's output; then a chain of SepConv
  "bottlenecks", a pool and a linear layer; the deepest exit is the network's own pooled linear head; hasfl-ray's
  ResNet exits, :class:`hasfl_ray.models.depth.ResNetExit`). With N not divisible by 4 the last clients get
  5, which builds the full network (``n_blocks > 3``): :func:`depth_of` returns 4 for them.
- **Local loss** for a client whose model has n exits with logits f_1 .. f_n, per batch:
  Σ_i [ CE(f_i, y) + Σ_{j≠i} w · KL(f_j.detach() ‖ f_i) / (n − 1) ] (the KL term only with ``kd`` and n > 1), where
  KL(t ‖ p) = T² · Σ_k q_k (log q_k − log_softmax(p / T)_k) / B, q = softmax(t / T) + 1e-7 (the 1e-7 is added after
  the softmax and not renormalised), T = 1. Without ``extended`` (InclusiveFL) only the last exit's terms are kept.
  The optimiser is SGD(lr, weight_decay 1e-3), no momentum, no gradient clipping; lr = 0.1 · 0.998^r in round r
  (0-based).
- **Consistency weight** w = exp(−5 (1 − min(max(r, 0), 300) / 300)²), r the 0-based round: a ramp from e^−5 to 1
  over 300 rounds.
- **FedDyn** (on by default, α = 0.1): the local loss also gets −⟨θ, h_i⟩ + α/2 ‖θ − θ^t‖² (θ flattened per
  parameter), and after training h_i ← h_i − α (θ − θ^t).
- **Aggregation** per tensor over the clients whose model has it (every client for the shared stages, the deep
  clients only for the deep stages and heads): the unweighted mean m over those k clients; the server's FedDyn state
  h ← h − α · k · (m − θ^t) / N (N all clients) and, for weights and biases with FedDyn, θ ← m − h / α; running
  statistics take m; a tensor no client has keeps θ^t.
- **Evaluation** takes the mean of the exits' logits (the ensemble) and each exit alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence, Tuple

import torch
from torch.nn import functional as F

from hasfl_ray.algorithms.options import FLOAT32_MAX, MAX_LR, check_count, check_range
from hasfl_ray.errors import ConfigError
from hasfl_ray.models.depth import ensemble  # noqa: F401  (the evaluation's prediction: the mean of the exits' logits)


@dataclass
class DepthFLOptions:
    depthfl_kd: bool = True  # mutual self-distillation among the exits
    depthfl_extended: bool = True  # every exit trains (false: InclusiveFL, the last exit only)
    depthfl_rampup_rounds: int = 300  # the consistency weight reaches 1 at this round
    depthfl_temperature: float = 1.0  # KLLoss's temperature (the source's is 1)
    depthfl_feddyn: bool = True  # FedDyn's dynamic regulariser and server correction
    depthfl_alpha: float = 0.1  # FedDyn's alpha
    depthfl_lr_decay: float = 0.998  # lr * decay**round

    def __post_init__(self) -> None:
        for name in ("depthfl_kd", "depthfl_extended", "depthfl_feddyn"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} is {getattr(self, name)!r}; expected true or false")
        check_count("depthfl_rampup_rounds", self.depthfl_rampup_rounds, 1, "a whole number of rounds >= 1")
        check_range("depthfl_temperature", self.depthfl_temperature, 0, FLOAT32_MAX, "a temperature > 0",
                    low_open=True)
        check_range("depthfl_alpha", self.depthfl_alpha, 0, MAX_LR, f"a number in (0, {MAX_LR:g}]", low_open=True)
        check_range("depthfl_lr_decay", self.depthfl_lr_decay, 0, 1, "a factor in (0, 1]", low_open=True)

    def inert(self, config):
        """FedDyn's alpha without FedDyn, the distillation's temperature and ramp-up without distillation."""
        out = {}
        if not self.depthfl_feddyn:
            out["depthfl_alpha"] = ("depthfl_feddyn is false (no FedDyn terms)", "depthfl_feddyn true")
        if not self.depthfl_kd:
            for name in ("depthfl_temperature", "depthfl_rampup_rounds"):
                out[name] = ("depthfl_kd is false (no distillation among the exits)", "depthfl_kd true")
        return out


def depth_of(cid: int, num_clients: int, depths: int = 4) -> int:
    """The number of stages client ``cid`` holds: ``cid // (num_clients // depths) + 1``, at most ``depths``."""
    if num_clients < depths:
        raise ConfigError(f"DepthFL's depths need at least {depths} clients; got {num_clients} (num_clients // "
                          f"{depths} would be 0)")
    return min(cid // (num_clients // depths) + 1, depths)


def consistency_weight(round: int, rampup_rounds: int = 300) -> float:
    """w = exp(−5 (1 − clip(round, 0, rampup) / rampup)²), round 0-based."""
    current = min(max(float(round), 0.0), float(rampup_rounds))
    phase = 1.0 - current / rampup_rounds
    return float(math.exp(-5.0 * phase * phase))


def learning_rate(round: int, lr: float = 0.1, decay: float = 0.998) -> float:
    """lr · decay^round, round 0-based."""
    return lr * decay ** round


def kl_loss(pred: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``KLLoss``: T² · Σ q (log q − log_softmax(pred / T)) / B with q = softmax(teacher / T) + 1e-7, detached."""
    predict = F.log_softmax(pred / temperature, dim=1)
    target = (F.softmax(teacher / temperature, dim=1) + 1e-7).detach()
    return temperature * temperature * (target * (target.log() - predict)).sum(1).sum() / target.size()[0]


def mutual_loss(outputs: Sequence[torch.Tensor], labels: torch.Tensor, weight: float, kd: bool = True,
                extended: bool = True, temperature: float = 1.0) -> torch.Tensor:
    """One batch's loss over the exits' logits ``outputs`` (shallowest first), FedDyn's terms aside."""
    loss = torch.zeros((), dtype=outputs[-1].dtype)
    n = len(outputs)
    for i, branch in enumerate(outputs):
        if not extended and i != n - 1:
            continue
        loss = loss + F.cross_entropy(branch, labels)
        if kd and n > 1:
            for j, other in enumerate(outputs):
                if j != i:
                    loss = loss + weight * kl_loss(branch, other.detach(), temperature) / (n - 1)
    return loss


def feddyn_penalty(params: Mapping[str, torch.Tensor], global_params: Mapping[str, torch.Tensor],
                   prev_grads: Mapping[str, torch.Tensor], alpha: float) -> torch.Tensor:
    """The local loss's FedDyn terms: Σ_k (−⟨θ_k, h_k⟩ + α/2 ‖θ_k − θ^t_k‖²), each flattened."""
    total = torch.zeros(())
    for name, value in params.items():
        flat = value.reshape(-1)
        total = total - torch.dot(flat, prev_grads[name]) + alpha / 2.0 * torch.sum((flat - global_params[name]
                                                                                     .reshape(-1)) ** 2)
    return total


def feddyn_update(prev_grads: Mapping[str, torch.Tensor], params: Mapping[str, torch.Tensor],
                  global_params: Mapping[str, torch.Tensor], alpha: float) -> Dict[str, torch.Tensor]:
    """A client's h after training: h − α (θ − θ^t), flattened."""
    return {name: prev_grads[name] - alpha * (params[name].detach().reshape(-1) - global_params[name].reshape(-1))
            for name in prev_grads}


def is_weight(name: str) -> bool:
    """The tensors FedDyn corrects on the server: state-dict keys with ``weight`` or ``bias`` in them."""
    return "weight" in name or "bias" in name


def aggregate(origin: Mapping[str, torch.Tensor], clients: Sequence[Mapping[str, torch.Tensor]],
              h: Mapping[str, torch.Tensor], alpha: float, num_clients: int,
              feddyn: bool = True) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
    """``strategy.py::aggregate``: (the new global tensors, the new server h), float64.

    ``clients`` are the clients' state dicts: each has the tensors of its depth (a name it lacks it does not
    hold)."""
    new, new_h = {}, {}
    for name, value in origin.items():
        holders = [c[name].to(torch.float64) for c in clients if name in c]
        base = value.to(torch.float64)
        if not holders:
            new[name], new_h[name] = base.clone(), h[name].to(torch.float64).clone()
            continue
        mean = sum(holders) / len(holders)
        new_h[name] = h[name].to(torch.float64) - alpha * len(holders) * (mean - base) / num_clients
        new[name] = mean - new_h[name] / alpha if (is_weight(name) and feddyn) else mean
    return new, new_h


def exits_held(depth: int, exit_names: Sequence[Sequence[str]]) -> List[str]:
    """The exit-head tensors a depth-``depth`` client holds: those of exits 1 .. depth (``exit_names[d-1]`` lists
    exit d's)."""
    if not 1 <= depth <= len(exit_names):
        raise ConfigError(f"depth {depth!r} is not one of the model's depths; expected 1 to {len(exit_names)}")
    return [name for names in exit_names[:depth] for name in names]


__all__ = ["DepthFLOptions", "aggregate", "consistency_weight", "depth_of", "ensemble", "exits_held",
           "feddyn_penalty", "feddyn_update", "is_weight", "kl_loss", "learning_rate", "mutual_loss"]
