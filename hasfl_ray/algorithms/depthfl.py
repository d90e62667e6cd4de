"""DepthFL (Kim et al., ICLR 2023) as a registered algorithm: depth sub-models with one classifier per depth, mutual
self-distillation among the exits and FedDyn, the rules of :mod:`hasfl_ray.algorithms.league.depthfl` (transcribed
from Flower's ``baselines/depthfl``) wired onto the depth sub-models of :mod:`hasfl_ray.models.depth`.

- A client's depth is that of its capacity tier on the run's ladder (``sub_model: depth``, set by this algorithm;
  :mod:`hasfl_ray.models.depth_plan`): on a ResNet's four stages the tiers 1/4, 1/2, 3/4, 1 train depths 1-4, at
  full width.
- Its loss is :func:`~hasfl_ray.algorithms.league.depthfl.mutual_loss` over its exits with the consistency weight
  of the round, plus FedDyn's local terms (:func:`~hasfl_ray.algorithms.league.depthfl.feddyn_penalty`) with its own
  h_i; after training it returns h_i ← h_i − α (θ − θ^t) (an extra). h_i is model-sized (of the parameters its depth
  holds): the clients' h live where SCAFFOLD's control variates do (``--control-variates-dir``, else memory).
- The server averages each tensor over the clients holding it (weights 1 each), then applies FedDyn's correction
  (:meth:`DepthFL.post_aggregate`): h ← h − α k (m − θ^t) / N, θ ← m − h / α (k the holders of the tensor).
- The learning rate is lr × ``depthfl_lr_decay``^round (the run's ``lr_decay`` is set from it) and local SGD runs
  without momentum unless ``momentum`` is set (the source's optimiser has none).
- Global accuracy (``test_accuracy``) is the ensemble of the full network's exits (the mean of their logits); the
  accuracy at each depth is exit d of the depth-d network (``accuracy_at_depth``).

FedDyn's server step is defined per synchronous round over all N clients: ``--mode async`` runs DepthFL only with
``depthfl_feddyn`` false (one sentence otherwise).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import nn

from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.algorithms.fullmodel import ControlVariateStore
from hasfl_ray.algorithms.league import depthfl as rules
from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import register_algorithm
from hasfl_ray.training.local import ClientResult, LocalObjective
from hasfl_ray.training.task import mask_logits

#: The extras key under which a DepthFL client returns its new FedDyn state h_i (name -> flat float32 tensor).
FEDDYN_STATE = "depthfl_h"


class MutualObjective(LocalObjective):
    """DepthFL's local loss: the mutual self-distillation loss over the exits up to the client's depth, plus FedDyn's
    terms with the client's ``h`` (name -> flat tensor; None without FedDyn). Trained one client at a time."""

    def __init__(self, weight: float, options: rules.DepthFLOptions, h: Optional[Dict[str, torch.Tensor]]):
        self.weight, self.options, self.h = float(weight), options, h
        self._initial: Optional[Dict[str, torch.Tensor]] = None
        self._names: List[str] = []

    def setup(self, model, initial, width, generator, model_at=None) -> None:
        self._names = [name for name, _ in model.named_parameters()]
        if self.h is not None:
            self._initial = {name: initial[name].detach() for name in self._names}
            self.h = {name: self.h[name].to(initial[name].device) if name in self.h else
                      torch.zeros(initial[name].numel(), device=initial[name].device) for name in self._names}

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        o = self.options
        outputs = [mask_logits(out, self.masked_labels) for out in model.forward_exits(x)]
        loss = rules.mutual_loss(outputs, y, self.weight, o.depthfl_kd, o.depthfl_extended, o.depthfl_temperature)
        if self.h is not None:
            loss = loss + rules.feddyn_penalty(dict(model.named_parameters()), self._initial, self.h,
                                               o.depthfl_alpha).to(loss.device)
        return loss

    def finish(self, model, initial, steps, lr) -> Dict[str, Any]:
        if self.h is None:
            return {}
        params = dict(model.named_parameters())
        new = rules.feddyn_update(self.h, params, self._initial, self.options.depthfl_alpha)
        self._initial = None
        return {FEDDYN_STATE: {name: new[name].to("cpu", torch.float32) for name in self._names}}


@register_algorithm("depthfl")
class DepthFL(Algorithm):
    """DepthFL: each client trains the depth of its capacity tier with every exit up to it (module docstring)."""

    #: The sub_model it sets (``resolve_config``), so that ``--depths`` may be given without ``--sub-model``.
    implied_sub_model = "depth"
    options_class = rules.DepthFLOptions
    #: test_accuracy is the ensemble of the full network's exits (hasfl_ray.engine.evaluating.global_evaluation).
    global_ensemble = True

    @classmethod
    def resolve_config(cls, config) -> Dict[str, Any]:
        """Depth sub-models (``sub_model: depth``), lr × depthfl_lr_decay^round, and no momentum unless set."""
        options = rules.DepthFLOptions(**config.algorithm_options)
        if config.sub_model not in (None, "depth"):  # given (width included: None is unset), never replaced
            raise ConfigError(f"sub_model is {config.sub_model!r} but algorithm depthfl trains depth sub-models at "
                              "full width; expected sub_model depth (or left unset)")
        if config.mode == "async" and options.depthfl_feddyn:
            raise ConfigError("mode is 'async' but DepthFL's FedDyn server correction is defined per synchronous "
                              "round over all clients; expected --mode sync, or depthfl_feddyn false")
        # given (0.995 included: None is unset, RunConfig.resolved), and it would be replaced unsaid
        if config.lr_decay is not None and config.lr_decay != options.depthfl_lr_decay:
            raise ConfigError(f"lr_decay is {config.lr_decay!r} but algorithm depthfl decays the learning rate by "
                              f"depthfl_lr_decay ({options.depthfl_lr_decay!r}), the source's; expected --algo-opt "
                              f"depthfl_lr_decay={config.lr_decay!r} in its place")
        updates: Dict[str, Any] = {"sub_model": "depth", "lr_decay": options.depthfl_lr_decay}
        if config.momentum is None:
            updates["momentum"] = 0.0
        return updates

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        self.server_h: Optional[Dict[str, torch.Tensor]] = None  # FedDyn's server state, name -> full shape
        self.client_h = ControlVariateStore(config.control_variates_dir)  # h_i, flat over the client's names
        self.client_depths: Dict[int, int] = {}  # the depth whose names each stored h_i is laid out over
        self._names: Dict[int, List[str]] = {}
        self._full = None  # the model with exits, built at first use (_model)

    @property
    def post_aggregate_active(self) -> bool:
        """Without FedDyn the count mean is the new global model: the engine need not read it (post_aggregate)."""
        return bool(self.options.depthfl_feddyn)

    #: The config values it always runs with, whatever is given: a value given that differs is refused
    #: (config/layers.py::_check_given_defaults); its mean counts each client once.
    fixed_config = {"aggregation_weights": ("count", "the source's unweighted mean")}

    def aggregation_weights(self, clients: Sequence[int]) -> List[float]:
        """1 each: the source's unweighted mean over the clients holding a tensor."""
        return [1.0] * len(clients)

    def client_cost(self, round, client, width, cost):
        """The device clock's DepthFL: what the depth sub-model holds and trains (its stages and exits: the clock's
        base cost already), plus FedDyn's two local terms −⟨θ, h_i⟩ + α/2 ‖θ − θ^t‖², two multiply-adds a parameter
        it holds every local step (docs/clock.md). The mutual distillation reads the exits' logits of the one
        forward pass: nothing more."""
        if not self.options.depthfl_feddyn:
            return cost
        depth = self.depth_plan.depth_of(float(self.p_current[client]))  # ``width`` is the trained one: 1
        return cost.plus(step_macs=2 * self.clock.costs.params(1.0, depth))

    def _model(self):
        """The run's model with exits at full width, built once (its names, shapes and depths)."""
        if getattr(self, "_full", None) is None:
            from hasfl_ray.models import build_model

            self._full = build_model(self.model_name)
            self._shapes = {name: spec.shape for name, spec in self._full.param_specs().items()}
            self._depths = self._full.param_depths()
        return self._full

    def held_names(self, depth: int) -> List[str]:
        """The parameters a depth-``depth`` client holds, in the model's order."""
        if depth not in self._names:
            from hasfl_ray.models.depth import depth_names

            self._names[depth] = depth_names(self._model(), depth)
        return self._names[depth]

    def objective(self, round: int, client: int, width: float) -> LocalObjective:
        o = self.options
        weight = rules.consistency_weight(round, o.depthfl_rampup_rounds)
        return MutualObjective(weight, o, self.h_of(client) if o.depthfl_feddyn else None)

    def h_of(self, client: int) -> Dict[str, torch.Tensor]:
        """Client ``client``'s h_i, name -> flat tensor (empty where it never trained: zeros)."""
        flat = self.client_h.get(client)
        if flat is None:
            return {}
        out, start = {}, 0
        for name, size in self._sizes(self.client_depths[client]):
            out[name] = flat[start:start + size].clone()
            start += size
        return out

    def _sizes(self, depth: int):
        self._model()
        return [(name, int(np.prod(self._shapes[name]))) for name in self.held_names(depth)]

    def post_aggregate(self, round, before, after, results: Sequence[ClientResult]):
        """FedDyn's server correction over the count mean ``after`` (tensors no accepted client holds keep θ^t)."""
        o = self.options
        if not o.depthfl_feddyn:
            return None
        if self.server_h is None:
            self.server_h = {name: torch.zeros_like(value, dtype=torch.float32) for name, value in before.items()}
        holders = {name: sum(1 for r in results if name in r.extras.get(FEDDYN_STATE, {})) for name in after}
        new = {}
        for name, mean in after.items():
            k = holders[name]
            if k == 0:
                new[name] = before[name].clone()
                continue
            self.server_h[name] = self.server_h[name] - o.depthfl_alpha * k * (mean - before[name]) / self.num_clients
            new[name] = mean - self.server_h[name] / o.depthfl_alpha if rules.is_weight(name) else mean
        return new

    def observe(self, round, results, aggregate) -> None:
        for result in results:
            state = result.extras.get(FEDDYN_STATE)
            if not state:
                continue
            self._model()
            depth = max(self._depths[name] for name in state)
            self.client_h.put(result.client, torch.cat([state[name].reshape(-1) for name in self.held_names(depth)]))
            self.client_depths[result.client] = depth

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(),
                "server_h": None if self.server_h is None else {k: v.clone() for k, v in self.server_h.items()},
                "client_h": self.client_h.state_dict(), "client_depths": dict(self.client_depths)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        server = state["server_h"]
        self.server_h = None if server is None else {k: v.clone() for k, v in server.items()}
        self.client_h.load_state_dict(state["client_h"])
        self.client_depths = {int(k): int(v) for k, v in state["client_depths"].items()}


__all__ = ["DepthFL", "FEDDYN_STATE", "MutualObjective"]
