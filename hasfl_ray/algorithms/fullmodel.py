"""Full-model methods (p = 1 for every client): FedAvg, FedProx and SCAFFOLD."""

from __future__ import annotations

import io
import logging
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.algorithms.options import FLOAT32_MAX, MAX_LR, check_range
from hasfl_ray.files import atomic_write, claim_folder
from hasfl_ray.registry import register_algorithm
from hasfl_ray.training.local import ClientResult, LocalObjective

logger = logging.getLogger(__name__)

#: Local SGD momentum of SCAFFOLD when ``momentum`` is left unset: its control variates diverge under momentum.
SCAFFOLD_MOMENTUM = 0.0

#: The extras key under which a SCAFFOLD client returns (x − y_i) / (K η).
SCAFFOLD_DRIFT = "scaffold_drift"


@register_algorithm("fedavg")
class FedAvg(Algorithm):
    """FedAvg (McMahan et al., 2017): every client trains the full model, whatever its capacity."""

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        self.p_current = self.capacity_allocation(self.p_max)

    def capacity_allocation(self, p_max: np.ndarray) -> np.ndarray:
        return np.ones(len(p_max), dtype=np.float64)


class ProximalObjective(LocalObjective):
    """FedProx's local objective F_i(w) + μ/2 ||w − w^t||², applied as its gradient μ (w − w^t).

    The reported loss is the data loss only; the proximal term enters through :meth:`adjust_gradients`
    (batched training: :meth:`gradient_terms`, μ (w − w^t) on the stacked parameters).
    """

    batchable = True

    def __init__(self, mu: float):
        self.mu = mu
        self._pairs: List[Tuple[nn.Parameter, torch.Tensor]] = []

    def setup(self, model, initial, width, generator, model_at=None) -> None:
        self._pairs = [(p, initial[name]) for name, p in model.named_parameters()]

    def adjust_gradients(self, model: nn.Module) -> None:
        with torch.no_grad():
            for param, anchor in self._pairs:
                if param.grad is not None:
                    param.grad.add_(param - anchor, alpha=self.mu)

    def finish(self, model, initial, steps, lr) -> Dict[str, Any]:
        self._pairs = []
        return {}

    def gradient_terms(self, initial):
        return self.mu, None


@dataclass
class FedProxOptions:
    mu: float = 1.0  # weight of the proximal term mu/2 ||w - w^t||^2

    def __post_init__(self) -> None:
        check_range("mu", self.mu, 0, FLOAT32_MAX, "a number >= 0")


@register_algorithm("fedprox")
class FedProx(FedAvg):
    """FedProx (Li et al., 2020): FedAvg with the proximal term μ/2 ||w − w^t||² (``mu``, default 1.0)."""

    options_class = FedProxOptions

    def objective(self, round: int, client: int, width: float) -> LocalObjective:
        return ProximalObjective(self.options.mu)

    def client_cost(self, round, client, width, cost):
        """The device clock's FedProx: the proximal gradient μ (w − w^t) is one multiply-add a parameter every local
        step (docs/clock.md)."""
        return cost.plus(step_macs=self.clock.costs.params(width))


class ControlVariateObjective(LocalObjective):
    """SCAFFOLD's local step y ← y − η (g_i(y) − c_i + c), then option II's (x − y_i) / (K η) as an extra.

    Args:
        correction: name -> c − c_i (full shape, float32), or None while both are zero.

    Batched training adds the stacked corrections (:meth:`gradient_terms`) and computes the same extra from
    the trained parameters (:meth:`finish_params`).
    """

    batchable = True

    def __init__(self, correction: Optional[Dict[str, torch.Tensor]]):
        self.correction = correction
        self._pairs: List[Tuple[nn.Parameter, torch.Tensor]] = []

    def setup(self, model, initial, width, generator, model_at=None) -> None:
        if self.correction is not None:
            self._pairs = [(p, self.correction[name].to(p.device)) for name, p in model.named_parameters()]

    def adjust_gradients(self, model: nn.Module) -> None:
        with torch.no_grad():
            for param, correction in self._pairs:
                if param.grad is not None:
                    param.grad.add_(correction)

    def finish(self, model, initial, steps, lr) -> Dict[str, Any]:
        self._pairs = []
        return self.finish_params({name: p.detach() for name, p in model.named_parameters()}, initial, steps, lr)

    def gradient_terms(self, initial):
        return 0.0, self.correction

    def finish_params(self, params, initial, steps, lr) -> Dict[str, Any]:
        scale = 1.0 / (max(steps, 1) * lr)
        with torch.no_grad():
            drift = {name: ((initial[name] - p) * scale).to("cpu", torch.float32) for name, p in params.items()}
        return {SCAFFOLD_DRIFT: drift}


class ControlVariateStore:
    """Per-client control variates c_i, each one flat float32 tensor, kept only for clients that participated.

    Args:
        directory: keep them on disk there (one ``client_<i>.pt`` each) instead of in memory; for
            federations where N model copies do not fit in memory. The engine checks, makes and marks the folder
            before the run starts (``--control-variates-dir``: a folder of the user's files is refused, never
            written); nothing is made here until a c_i is written.
    """

    def __init__(self, directory: Optional[str] = None):
        self.directory = directory
        self._memory: Dict[int, torch.Tensor] = {}
        self._clients: set = set()

    def __contains__(self, client: int) -> bool:
        return client in self._clients

    def clients(self) -> List[int]:
        return sorted(self._clients)

    def _path(self, client: int) -> str:
        return os.path.join(self.directory, f"client_{client}.pt")

    def get(self, client: int) -> Optional[torch.Tensor]:
        """c_i of ``client`` (flat), or None where it never participated (c_i = 0)."""
        if client not in self._clients:
            return None
        if self.directory:
            return torch.load(self._path(client), weights_only=True)
        return self._memory[client]

    def put(self, client: int, value: torch.Tensor) -> None:
        value = value.detach().to("cpu", torch.float32).contiguous()
        self._clients.add(client)
        if self.directory:
            if not os.path.isdir(self.directory):  # a store used without the engine: made and marked as the engine does
                claim_folder(self.directory, "control variates")
            buffer = io.BytesIO()
            torch.save(value, buffer)
            atomic_write(self._path(client), buffer.getvalue())  # never a half-written c_i
        else:
            self._memory[client] = value

    def state_dict(self) -> Dict[int, torch.Tensor]:
        return {client: self.get(client).clone() for client in self.clients()}

    def load_state_dict(self, state: Mapping[int, torch.Tensor]) -> None:
        self._memory.clear()
        self._clients.clear()
        for client, value in state.items():
            self.put(int(client), value)


@dataclass
class ScaffoldOptions:
    scaffold_global_lr: float = 1.0  # eta_g in x <- x + eta_g * mean update

    def __post_init__(self) -> None:
        check_range("scaffold_global_lr", self.scaffold_global_lr, 0, MAX_LR,
                    f"a number > 0 and at most {MAX_LR:g}", low_open=True)


@register_algorithm("scaffold")
class SCAFFOLD(FedAvg):
    """SCAFFOLD (Karimireddy et al., 2020) with option II control variates.

    Client i corrects every local gradient by c − c_i and returns Δy_i and (x − y_i)/(K η) (K its local
    steps, η its learning rate). The server applies x ← x + η_g Δ̄ (``scaffold_global_lr``, default 1,
    Δ̄ the protocol's n_i-weighted mean), sets c_i⁺ = c_i − c + (x − y_i)/(K η) for each participant and
    c ← c + (1/N) Σ_i (c_i⁺ − c_i). All variates start at zero. Local SGD runs without momentum unless
    ``momentum`` is set: with the paper's momentum 0.9 the corrected steps diverge.
    """

    options_class = ScaffoldOptions

    @classmethod
    def resolve_config(cls, config) -> Dict[str, Any]:
        """Momentum left unset means vanilla SGD (:data:`SCAFFOLD_MOMENTUM`), not the paper's 0.9."""
        return {"momentum": SCAFFOLD_MOMENTUM} if config.momentum is None else {}

    def __init__(self, config, p_max, num_samples):
        super().__init__(config, p_max, num_samples)
        self.server_lr = float(self.options.scaffold_global_lr)
        if config.momentum:
            logger.warning("SCAFFOLD with momentum %s: its control variates assume vanilla SGD and diverge under "
                           "momentum (the paper runs it with momentum 0)", config.momentum)
        self.layout: Optional[List[Tuple[str, Tuple[int, ...]]]] = None
        self.server_control: Optional[torch.Tensor] = None
        self.client_controls = ControlVariateStore(config.control_variates_dir)

    def _unflatten(self, flat: torch.Tensor) -> Dict[str, torch.Tensor]:
        out, start = {}, 0
        for name, shape in self.layout:
            size = int(np.prod(shape))
            out[name] = flat[start:start + size].view(shape)
            start += size
        return out

    def _flatten(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([tensors[name].reshape(-1).to(torch.float32) for name, _ in self.layout])

    def client_cost(self, round, client, width, cost):
        """The device clock's SCAFFOLD: the server's control variate c goes down with the model and the client's
        drift (x − y_i)/(K η) comes back with its update, each one float32 a parameter; every local step adds c − c_i
        to the gradient, one multiply-add a parameter (docs/clock.md)."""
        size = self.clock.costs.model_bytes(width)
        return cost.plus(bytes_down=size, bytes_up=size, step_macs=self.clock.costs.params(width))

    def objective(self, round: int, client: int, width: float) -> LocalObjective:
        if self.server_control is None:
            return ControlVariateObjective(None)
        own = self.client_controls.get(client)
        correction = self.server_control if own is None else self.server_control - own
        return ControlVariateObjective(self._unflatten(correction.clone()))

    def observe(self, round: int, results: Sequence[ClientResult], aggregate: AggregateResult) -> None:
        if not results:
            return
        if self.layout is None:
            first = results[0].extras[SCAFFOLD_DRIFT]
            self.layout = [(name, tuple(t.shape)) for name, t in first.items()]
            self.server_control = torch.zeros(sum(int(np.prod(s)) for _, s in self.layout), dtype=torch.float32)
        total = torch.zeros_like(self.server_control)
        for result in results:
            drift = self._flatten(result.extras[SCAFFOLD_DRIFT])
            old = self.client_controls.get(result.client)
            new = drift - self.server_control if old is None else old - self.server_control + drift
            total += new if old is None else new - old
            self.client_controls.put(result.client, new)
        self.server_control = self.server_control + total / self.num_clients

    def state_dict(self) -> Dict[str, Any]:
        return {**super().state_dict(), "layout": None if self.layout is None else list(self.layout),
                "server_control": None if self.server_control is None else self.server_control.clone(),
                "client_controls": self.client_controls.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        layout = state["layout"]
        self.layout = None if layout is None else [(name, tuple(shape)) for name, shape in layout]
        control = state["server_control"]
        self.server_control = None if control is None else control.clone()
        self.client_controls.load_state_dict(state["client_controls"])
