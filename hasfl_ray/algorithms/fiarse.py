"""FIARSE (Wu et al., NeurIPS 2024) as a run: importance-aware unstructured sub-models on parameter masks, the rules
of :mod:`hasfl_ray.algorithms.league.fiarse` (transcribed from HarliWu/FIARSE and tested there) wired onto
``Algorithm.parameter_masks``.

Per round t and model size s (a fraction of the scored parameters; with ``fiarse_size: square`` the client's width
p gives s = p², so the FIARSE pack's width ladder {1, 1/2, 1/4, 1/8} is FIARSE's sizes {1, 1/4, 1/16, 1/64}):

- the thresholds T_s from the global model w^t, once per distinct size (``fiarse_scope``: one over the network or
  one per stage, a stage being a top-level module: ResNet's stem, layer1..4 and classifier);
- the download: the bitmask |w^t| >= T_s of every scored tensor (convolutions' and linear layers' weights and
  biases), every other parameter (the norms) whole (an all-set mask, so that its update too counts where it moved);
- local training: the full-shape network, every scored weight taken as ``effective_weight(w, T_s)`` in every
  forward (re-taken from the current w, so the mask can only shrink), plain SGD as the pack's;
- the upload: Δ_i at the coordinates it changed (Δ_i ≠ 0) with their bitmask;
- the server: the mean over the clients that changed each coordinate (weights 1 each), w ← w + lr_global · mean
  (``fiarse_lr_global`` is this algorithm's server step; the source's w − lr_g · avg(w^t − w_i));
- evaluation at width p: the global model masked at size s (full shapes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.config.sparse_mix import check_sparse_config
from hasfl_ray.algorithms.league import fiarse as rules
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model
from hasfl_ray.registry import register_algorithm
from hasfl_ray.training.local import LocalObjective
from hasfl_ray.training.task import mask_logits

#: How a client's width gives its model size: ``square`` s = p² (the parameter fraction of a width-p slice; the
#: FIARSE pack's ladder), ``width`` s = p.
SIZE_RULES = ("square", "width")


@dataclass
class FIARSERunOptions(rules.FIARSEOptions):
    fiarse_size: str = "square"  # square: model size = width^2 (the pack's ladder); width: model size = width

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fiarse_size not in SIZE_RULES:
            raise ConfigError(f"fiarse_size is {self.fiarse_size!r}; expected square (a client's model size is its "
                              "width squared, the parameter fraction of a width-p slice) or width (its width)")


class FIARSEObjective(LocalObjective):
    """FIARSE's local step: cross-entropy of the network run with ``effective_weight(w, T)`` for every scored
    parameter (``limits``: name -> T), re-taken every forward; the upload holds the coordinates that changed."""

    batchable = False  # each client its own thresholds

    def __init__(self, limits: Mapping[str, float], mask_gradient: str = "source"):
        self.limits, self.mask_gradient = dict(limits), mask_gradient

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = dict(model.named_parameters())
        for name, limit in self.limits.items():
            weight = params[name]
            params[name] = rules.effective_weight(weight, torch.tensor(limit, dtype=weight.dtype, device=weight.device),
                                                  self.mask_gradient)
        return F.cross_entropy(mask_logits(functional_call(model, params, (x,)), self.masked_labels), y)

    def held(self, name: str, delta: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return rules.held(delta) & mask  # the source counts a client where its Δ is non-zero


def stage_of(names: Sequence[str]) -> Dict[str, str]:
    """Each parameter's stage for ``fiarse_scope: stage``: its top-level module (ResNet: conv1 the stem, layer1 ..
    layer4, the classifier; a CNN's features and each fully connected layer)."""
    return {name: name.split(".")[0] for name in names}


@register_algorithm("fiarse")
class FIARSE(Algorithm):
    """FIARSE: see the module docstring."""

    name = "fiarse"
    options_class = FIARSERunOptions
    masked_submodels = True  # submodel_for_eval: the global model masked at the size, full shapes

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        check_sparse_config(config, self.name, "parameter masks")  # (FedGMR too) before anything runs
        self.server_lr = float(getattr(self.options, "fiarse_lr_global", 1.0))
        self._names: Optional[List[str]] = None
        self._round: Optional[int] = None  # the round whose global model and thresholds are cached
        self._params: Optional[Dict[str, torch.Tensor]] = None
        self._limits: Dict[float, Dict[str, torch.Tensor]] = {}

    def size(self, width: float) -> float:
        """The model size (a fraction of the scored parameters) of a client of width ``width``."""
        return float(width) ** 2 if self.options.fiarse_size == "square" else float(width)

    def scored(self) -> List[str]:
        if self._names is None:
            self._names = rules.scored_names(build_model(self.model_name))
        return self._names

    #: The option naming how a width gives the model size (FedGMR's is fedgmr_size).
    size_option = "fiarse_size"

    def check_model(self, widths: Sequence[float]) -> None:
        """Refuse a width whose model size keeps none of the scored parameters (of the network, or of a stage with
        ``fiarse_scope: stage``): its thresholds, at a round or an evaluation, would have nothing to keep."""
        specs = build_model(self.model_name).param_specs()
        names = self.scored()
        groups: Dict[str, int] = {}
        scope = getattr(self.options, "fiarse_scope", "global")
        for name, stage in stage_of(names).items():
            key = stage if scope == "stage" else ""
            groups[key] = groups.get(key, 0) + specs[name].numel(1.0)
        for width in widths:
            for stage, count in groups.items():
                check_kept(width, self.size(width), count, f"{self.name}",
                           f"{self.size_option} {getattr(self.options, self.size_option)}", stage)

    def thresholds(self, params: Mapping[str, torch.Tensor], size: float) -> Dict[str, torch.Tensor]:
        names = self.scored()
        return rules.thresholds(params, names, size, getattr(self.options, "fiarse_scope", "global"), stage_of(names))

    def _round_limits(self, round: int, width: float) -> Dict[str, torch.Tensor]:
        """The thresholds at ``width``'s size from round ``round``'s global model, once per distinct size a round."""
        if self._round != round:
            self._round, self._limits = round, {}
            self._params = {name: tensor.detach().cpu() for name, tensor in self.global_params().items()}
        size = self.size(width)
        if size not in self._limits:
            self._limits[size] = self.thresholds(self._params, size)
        return self._limits[size]

    def parameter_masks(self, round: int, client: int, width: float) -> Dict[str, torch.Tensor]:
        limits = self._round_limits(round, width)
        scored = rules.masks(self._params, limits)
        # in the model's order; the norms whole, counted where they moved
        return {name: scored[name] if name in scored else torch.ones(tensor.shape, dtype=torch.bool)
                for name, tensor in self._params.items()}

    def objective(self, round: int, client: int, width: float) -> LocalObjective:
        limits = self._round_limits(round, width)
        return FIARSEObjective({name: float(limit) for name, limit in limits.items()},
                               self.options.fiarse_mask_gradient)

    #: The config values it always runs with, whatever is given: a value given that differs is refused
    #: (config/layers.py::_check_given_defaults); its mean counts each client once.
    fixed_config = {"aggregation_weights": ("count", "the source's unweighted mean")}

    def aggregation_weights(self, clients: Sequence[int]) -> List[float]:
        return [1.0] * len(clients)  # the source's unweighted mean over the clients that changed a coordinate

    def submodel_for_eval(self, params: Dict[str, torch.Tensor], width: float) -> Dict[str, torch.Tensor]:
        """The global model masked at ``width``'s size (full shapes; the norms whole), as FIARSE evaluates it."""
        masks = rules.masks(params, self.thresholds(params, self.size(width)))
        return {name: torch.where(masks[name], tensor, 0.0) if name in masks else tensor
                for name, tensor in params.items()}


def check_kept(width: float, size: float, count: int, method: str, rule: str, stage: str = "") -> None:
    """One sentence unless FIARSE's threshold at model ``size`` (of a client of ``width``, by ``rule``) keeps one
    of ``count`` scored parameters (of ``stage``): the rule both a run (:meth:`FIARSE.check_model`) and its cost
    table (:func:`mask_cost_table`) hold it to."""
    if rules.kept_count(count, size) < 1:
        where = f" of stage {stage}" if stage else ""
        raise ConfigError(f"width {width:g} gives {method} model size {size:.3g} ({rule}), which keeps none of the "
                          f"{count} scored parameters{where}; expected widths whose size keeps at least one (size >= "
                          f"{1 / count:.3g})")


def mask_cost_table(model_name: str, widths: Sequence[float], size_rule: str = "square",
                    kept: Optional[Callable[[int, float], int]] = None, method: str = "fiarse") -> List[dict]:
    """What a FIARSE (or FedGMR) client of each width moves and computes (``hasfl-ray cost --algorithm fiarse``):
    its model size s, the values it holds (``kept(scored parameters, s)``: FIARSE's threshold rule int(n x s),
    ties aside, by default; FedGMR's ``league.fedgmr.kept_count`` at its initial density), and every norm
    parameter), the full network's MACs (and FLOPs) per sample (it trains masked dense layers), the bitmask's bytes
    (ceil(numel / 8) per parameter) and the upload in MB (4 bytes a held value plus the bitmask; the download is
    the same size)."""
    from hasfl_ray.clock.cost import BYTES_PER_PARAM

    model = build_model(model_name)
    specs = model.param_specs()
    names = set(rules.scored_names(model))
    scored = sum(spec.numel(1.0) for name, spec in specs.items() if name in names)
    whole = sum(spec.numel(1.0) for name, spec in specs.items() if name not in names)
    bitmask = sum(-(-spec.numel(1.0) // 8) for spec in specs.values())
    rows = []
    for p in widths:
        size = float(p) ** 2 if size_rule == "square" else float(p)
        check_kept(p, size, scored, method, f"size rule {size_rule}")  # its evaluation's threshold needs one
        held = (kept or rules.kept_count)(scored, size) + whole
        row = {"p": p, "size": size, "params": held, "macs": model.macs(1.0), "bitmask_bytes": bitmask,
               "upload_mb": (BYTES_PER_PARAM * held + bitmask) / 1e6}
        if hasattr(model, "flops"):
            row["flops"] = model.flops(1.0)
        rows.append(row)
    return rows
