"""FIARSE (Wu et al., NeurIPS 2024): importance-aware sub-model extraction, as HarliWu/FIARSE's code computes it.

Source: github.com/HarliWu/FIARSE, commit 281519c6fb9ac4846fb0098fb6db4ff41849271b:
``fiarse/model/resnet_masked.py::BetaResNet.generate_mask`` (the global threshold),
``fiarse_layerwise/model/resnet_masked.py::BetaResNet.layer_wise_generate_mask`` (the per-stage variant),
``fiarse/model/model_utils.py`` (``Bern``, ``MaskedConv2d``, ``MaskedLinear``, ``MaskedBatchNorm``) and
``fiarse/server.py::Server.simulation_exp`` (the aggregation).

The rule, read from that code:

- **Importance** is |w|. The scored parameters are the convolutions' and linear layers' weights and biases; the
  normalisation layers' parameters are not scored and never masked (their ``size`` is 0, ``to_vector`` skips them).
- **Threshold** at model size s (a fraction of the scored parameters): k = int(numel · s) and T = the k-th largest
  |w| (``torch.topk(scores, k).values[-1]``). ``generate_mask`` takes one T over every scored parameter of the
  network at once (``global``); ``layer_wise_generate_mask`` one T per stage (stem conv, layer1 .. layer4, the
  classifier: each stage's tensors scored together, not per tensor) (``stage``). The server always calls it with
  ``topk=True``; a client's size is its capacity, fixed for the run; the threshold is recomputed from the current
  global model every round.
- **Mask** of a coordinate: |w| >= T (ties at T are kept, so a size may come out a little above s). It is taken
  inside every forward pass from the *current* weight and the round's fixed T, so a weight that shrinks below T
  during local training drops out of the mask and stops moving (the mask can only shrink during local training;
  a weight outside it gets no gradient and never re-enters).
- **Gradient through the mask.** ``Bern.forward`` returns the bool tensor ``scores >= threshold``; PyTorch marks a
  bool output of an autograd Function non-differentiable, so ``Bern.backward`` (the surrogate 2T / (|w| + T)^2) is
  never called and the gradient the source trains with is the masked gradient g ⊙ m (``mask_gradient="source"``).
  The surrogate as ``Bern.backward`` writes it, which the paper describes, is available as
  ``mask_gradient="surrogate"``: d(w · m(|w|))/dw = m + |w| · 2T / (|w| + T)^2 · m. hasfl-ray's default is the
  source's.
- **Aggregation**: each client returns Δ_i = w^t − w_i (its whole state dict, norms included); the server sums the
  Δ_i and counts, per coordinate, the clients whose Δ_i is non-zero there (``tot_mask += (grad != 0)``), takes
  avg = ΣΔ / count (0 where no client changed it: ``nan_to_num``) and sets w ← w − lr_global · avg (``--lr-global``,
  default 1.0). The mean is unweighted and "held" means "changed", not "in the mask": a masked coordinate whose
  update is exactly 0 does not count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

import torch
from torch import nn

from hasfl_ray.algorithms.options import MAX_LR, check_range
from hasfl_ray.errors import ConfigError

#: How the threshold is chosen: one over the network (``generate_mask``) or one per stage (the layer-wise variant).
SCOPES = ("global", "stage")
#: The gradient through the mask: the one the source's code trains with, or ``Bern.backward``'s surrogate.
GRADIENTS = ("source", "surrogate")


@dataclass
class FIARSEOptions:
    fiarse_scope: str = "global"  # global: one threshold over the network (fiarse/); stage: one per stage
    fiarse_mask_gradient: str = "source"  # source: g * mask (Bern's backward never runs); surrogate: Bern.backward
    fiarse_lr_global: float = 1.0  # w <- w - lr_global * avg (the source's --lr-global, default 1.0)

    def __post_init__(self) -> None:
        if self.fiarse_scope not in SCOPES:
            raise ConfigError(f"fiarse_scope is {self.fiarse_scope!r}; expected global (one threshold over the "
                              "network, as fiarse/ does) or stage (one per stage, as fiarse_layerwise/ does)")
        if self.fiarse_mask_gradient not in GRADIENTS:
            raise ConfigError(f"fiarse_mask_gradient is {self.fiarse_mask_gradient!r}; expected source (the masked "
                              "gradient the source trains with) or surrogate (Bern.backward's 2T/(|w|+T)^2)")
        check_range("fiarse_lr_global", self.fiarse_lr_global, 0, MAX_LR, f"a number in (0, {MAX_LR:g}]",
                    low_open=True)


def scored_names(model: nn.Module) -> List[str]:
    """The parameters FIARSE scores and masks, in the model's order: weights and biases of every Conv and Linear
    module (normalisation layers and anything else are left whole, as the source's ``size = 0`` modules are)."""
    names = []
    for prefix, module in model.named_modules():
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
            names += [f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters(recurse=False)]
    return names


def kept_count(numel: int, size: float) -> int:
    """k = int(numel · size): how many of ``numel`` scored values the threshold at model ``size`` keeps (ties
    aside); the source's ``int(len(scores) * size)``."""
    return int(numel * size)


def threshold(scores: torch.Tensor, size: float) -> torch.Tensor:
    """T = the k-th largest of ``scores`` (1-D, |w|), k = int(numel · size): ``torch.topk(scores, k).values[-1]``."""
    check_range("model size", size, 0, 1, "a fraction of the parameters in (0, 1]", low_open=True)
    k = kept_count(scores.numel(), size)
    if k < 1:
        raise ConfigError(f"model size {size!r} keeps int({scores.numel()} x {size!r}) = 0 of {scores.numel()} "
                          "scored parameters; expected a size that keeps at least one")
    return torch.topk(scores, k).values[-1]


def thresholds(params: Mapping[str, torch.Tensor], names: Sequence[str], size: float, scope: str = "global",
               stage_of: Optional[Mapping[str, str]] = None) -> Dict[str, torch.Tensor]:
    """The threshold of every scored parameter at model ``size``: one over all ``names`` (``global``) or one per
    stage (``stage``: ``stage_of[name]`` names its stage; every tensor of a stage is scored together)."""
    if scope not in SCOPES:
        raise ConfigError(f"the threshold scope is {scope!r}; expected global or stage")
    missing = [n for n in names if n not in params]
    if missing:
        raise ConfigError(f"the parameter {missing[0]} to score is not in the model; expected one of its parameters")
    if scope == "global":
        value = threshold(torch.cat([params[n].detach().abs().reshape(-1) for n in names]), size)
        return {n: value for n in names}
    if stage_of is None:
        raise ConfigError("the stage scope needs each scored parameter's stage; expected a mapping stage_of")
    out: Dict[str, torch.Tensor] = {}
    for stage in dict.fromkeys(stage_of[n] for n in names):
        members = [n for n in names if stage_of[n] == stage]
        value = threshold(torch.cat([params[n].detach().abs().reshape(-1) for n in members]), size)
        out.update({n: value for n in members})
    return out


def masks(params: Mapping[str, torch.Tensor], limits: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """The bool mask |w| >= T of every thresholded parameter (ties at T kept)."""
    return {n: params[n].detach().abs() >= t for n, t in limits.items()}


def kept_fraction(params: Mapping[str, torch.Tensor], limits: Mapping[str, torch.Tensor]) -> float:
    """The fraction of the scored parameters a mask keeps (what ``generate_mask`` returns and prints)."""
    kept = sum(int(m.sum()) for m in masks(params, limits).values())
    return kept / sum(params[n].numel() for n in limits)


class _SurrogateMask(torch.autograd.Function):
    """m = (|w| >= T) as a float, with ``Bern.backward``'s derivative 2T / (|w| + T)^2 · m w.r.t. |w|."""

    @staticmethod
    def forward(ctx, scores, limit):
        ctx.save_for_backward(scores, limit)
        return (scores >= limit).to(scores.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        scores, limit = ctx.saved_tensors
        grad = torch.nan_to_num(2 * limit / torch.pow(scores + limit, 2), nan=0.0, posinf=0.0, neginf=0.0)
        return grad_output * grad * (scores >= limit), None


def effective_weight(weight: torch.Tensor, limit: torch.Tensor, mask_gradient: str = "source") -> torch.Tensor:
    """w ⊙ m(|w|) as a masked layer's forward takes it, differentiable into ``weight``.

    ``source``: the mask is a constant (the gradient is g ⊙ m, what the source's code computes); ``surrogate``: the
    mask carries ``Bern.backward``'s derivative, so d/dw = m + |w| · 2T/(|w|+T)^2 · m."""
    if mask_gradient == "source":
        return weight * (weight.detach().abs() >= limit)
    if mask_gradient == "surrogate":
        return weight * _SurrogateMask.apply(weight.abs(), torch.as_tensor(limit, dtype=weight.dtype))
    raise ConfigError(f"the mask gradient is {mask_gradient!r}; expected source or surrogate")


def aggregate(global_params: Mapping[str, torch.Tensor], deltas: Sequence[Mapping[str, torch.Tensor]],
              lr_global: float = 1.0) -> Dict[str, torch.Tensor]:
    """The server's step: avg = Σ_i Δ_i / #{i: Δ_i ≠ 0} per coordinate (0 where none changed it), w ← w − lr · avg.

    ``deltas`` are the clients' w^t − w_i (the source's sign), every key of ``global_params``. Running statistics,
    were there any, move by avg without lr_global, as the source does (``running_mean``, ``running_var``,
    ``num_batches_tracked``)."""
    out = {}
    for name, value in global_params.items():
        total = torch.zeros_like(value, dtype=torch.float64)
        count = torch.zeros_like(value, dtype=torch.float64)
        for delta in deltas:
            total += delta[name].to(torch.float64)
            count += (delta[name] != 0).to(torch.float64)
        avg = torch.nan_to_num(total / count, nan=0.0, posinf=0.0, neginf=0.0)
        statistics = any(key in name for key in ("running_mean", "running_var", "num_batches_tracked"))
        step = avg if statistics else lr_global * avg
        out[name] = (value.to(torch.float64) - step).to(value.dtype)
    return out


def held(delta: torch.Tensor) -> torch.Tensor:
    """The coordinates a client counts for in the mean: those its update changed (Δ ≠ 0)."""
    return delta != 0


__all__ = ["FIARSEOptions", "GRADIENTS", "SCOPES", "aggregate", "effective_weight", "held", "kept_count",
           "kept_fraction", "masks", "scored_names", "threshold", "thresholds"]
