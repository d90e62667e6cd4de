"""Server optimisers on the aggregated update (docs/algorithms.md, "Server optimisers").

Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2, with Δ_t the round's aggregated
pseudo-gradient (the coordinate-wise mean of the clients' updates w_end − w_start, times the rule's own scale):

    m_t = β1 m_{t−1} + (1 − β1) Δ_t
    v_t = v_{t−1} + Δ_t²                                   (FedAdagrad)
    v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)     (FedYogi)
    v_t = β2 v_{t−1} + (1 − β2) Δ_t²                       (FedAdam)
    x_{t+1} = x_t + η m_t / (√v_t + τ)

m and v start at 0, as Flower's strategies start them (adap/flower ``src/py/flwr/server/strategy/fedadam.py``,
``fedyogi.py``, ``fedadagrad.py``), whose defaults are taken here: FedAdam η 0.1, β1 0.9, β2 0.99, τ 1e-9;
FedYogi η 0.01, β1 0.9, β2 0.99, τ 1e-3; FedAdagrad η 0.1, β1 0 (Flower fixes it: m_t = Δ_t), τ 1e-9.

``sgd`` is today's step w ← w + η Δ̄; ``fedavgm`` (Hsu et al., 2019) is the heavy-ball step FedBuff's server momentum
already took, m ← β m + η Δ̄, w ← w + m (:func:`~hasfl_ray.aggregation.asynchronous.server_step`, one mechanism;
β 0.9 unless given).

Width masks: a coordinate no client covered this round has Δ = 0. The adaptive optimisers leave its m, v and its
parameter unchanged there (a coordinate outside every sub-model of the round keeps its moments until a client trains
it again: a round's absence is no evidence of a zero gradient, and Adam's decayed m over a grown v would otherwise keep
moving a coordinate nobody trains). FedAvgM keeps the heavy-ball rule it always had (m decays and is applied
everywhere, as FedBuff's server momentum has since it exists, so those runs keep their bits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from hasfl_ray.aggregation.asynchronous import server_step

SERVER_OPTIMIZERS = ("sgd", "fedavgm", "fedadam", "fedyogi", "fedadagrad")
ADAPTIVE = ("fedadam", "fedyogi", "fedadagrad")
#: Per adaptive optimiser, its defaults (η, β1, β2, τ), Flower's (β2 None: FedAdagrad has none).
DEFAULTS: Dict[str, Tuple[float, float, Optional[float], float]] = {
    "fedadam": (0.1, 0.9, 0.99, 1e-9), "fedyogi": (0.01, 0.9, 0.99, 1e-3), "fedadagrad": (0.1, 0.0, None, 1e-9)}
#: FedAvgM's server momentum β when none is given (Hsu et al., 2019, and Reddi et al.'s FedAvgM baseline).
FEDAVGM_MOMENTUM = 0.9

State = Dict[str, Dict[str, torch.Tensor]]  # "m" (and "v") -> parameter name -> full-shape tensor


@dataclass(frozen=True)
class ServerOptimizer:
    """A run's server optimiser (:func:`of_config`): ``name`` one of :data:`SERVER_OPTIMIZERS`; ``lr`` η of the
    adaptive ones (sgd and fedavgm fold theirs into the step the engine passes, as before); ``momentum`` β of the
    heavy-ball step (sgd with β > 0 is fedavgm); ``beta1``, ``beta2``, ``tau`` of the adaptive ones."""

    name: str = "sgd"
    lr: float = 1.0
    momentum: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    tau: float = 0.0

    @property
    def adaptive(self) -> bool:
        return self.name in ADAPTIVE

    @property
    def stateful(self) -> bool:
        """Whether it keeps a state between steps (checkpointed)."""
        return self.adaptive or self.momentum > 0

    def step_lr(self, rule_lr: float, server_lr: Optional[float]) -> float:
        """The scalar the server multiplies Δ̄ by before this optimiser: sgd and fedavgm the rule's step times
        ``server_lr`` (η_g; today's product, so default runs keep their bits), the adaptive ones the rule's step alone
        (their η is :attr:`lr`, applied after the moments)."""
        return rule_lr if self.adaptive else rule_lr * (server_lr or 1.0)


def of_config(config: Any) -> ServerOptimizer:
    """The server optimiser of a (checked) run configuration."""
    name = getattr(config, "server_optimizer", "sgd") or "sgd"
    if name not in ADAPTIVE:
        return ServerOptimizer(name, momentum=float(config.server_momentum or 0.0))
    return ServerOptimizer(name, float(config.server_lr), 0.0, float(config.server_beta1),
                           float(config.server_beta2 or 0.0), float(config.server_tau))


def adaptive_moments(name: str, beta1: float, beta2: float, delta: torch.Tensor, m: torch.Tensor, v: torch.Tensor
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 2's m_t and v_t from Δ_t = ``delta`` and the previous ``m``, ``v`` (same dtype)."""
    m_new = m.mul(beta1).add(delta, alpha=1.0 - beta1)
    square = delta.square()
    if name == "fedadagrad":
        v_new = v.add(square)
    elif name == "fedyogi":
        v_new = v.sub(square.mul(torch.sign(v - square)), alpha=1.0 - beta2)
    else:
        v_new = v.mul(beta2).add(square, alpha=1.0 - beta2)
    return m_new, v_new


def server_update(optimizer: Optional[ServerOptimizer], params: Mapping[str, torch.Tensor],
                  delta: Mapping[str, torch.Tensor], step_lr: float, state: Optional[State],
                  covered: Callable[[], Mapping[str, torch.Tensor]]
                  ) -> Tuple[Dict[str, torch.Tensor], Optional[State]]:
    """The new parameters (name -> tensor, for the names that change) and the optimiser's new state (None: it keeps
    none). ``step_lr``: :meth:`ServerOptimizer.step_lr`; ``state``: the previous one (None before the first step);
    ``covered()``: name -> bool mask of the coordinates some client covered this round (asked for by the adaptive
    optimisers only)."""
    if not isinstance(optimizer, ServerOptimizer):  # None, or a heavy-ball β as a number (FedBuff's before)
        optimizer = ServerOptimizer(momentum=float(optimizer or 0.0))
    if not optimizer.adaptive:
        last = (state or {}).get("m")
        updated, steps = server_step(params, delta, step_lr, optimizer.momentum, last)
        return updated, None if steps is None else {"m": steps}
    state = state or {}
    m_old, v_old = state.get("m", {}), state.get("v", {})
    masks = covered()
    updated: Dict[str, torch.Tensor] = {}
    new: State = {"m": dict(m_old), "v": dict(v_old)}
    for name, d in delta.items():
        x = params[name]
        mask = masks.get(name)
        if mask is None or not bool(mask.any()):
            continue  # nobody covered any of it: parameter and moments as they were
        d = d.to(x.dtype) * step_lr
        m_prev = m_old.get(name, torch.zeros_like(x))
        v_prev = v_old.get(name, torch.zeros_like(x))
        m, v = adaptive_moments(optimizer.name, optimizer.beta1, optimizer.beta2, d, m_prev, v_prev)
        step = m.mul(optimizer.lr).div(v.sqrt().add(optimizer.tau))
        new["m"][name] = torch.where(mask, m, m_prev)
        new["v"][name] = torch.where(mask, v, v_prev)
        updated[name] = torch.where(mask, x + step, x)
    return updated, new


def server_call(config: Any, rule_lr: float) -> Tuple[Any, ...]:
    """A synchronous round's ``run_round`` arguments after the weights: the scalar times Δ̄, and the server optimiser
    unless it is the plain step w + η Δ̄ (so a backend written before them, ``run_round(tasks, weights, server_lr)``,
    still runs every run that does not ask for one)."""
    optimizer = of_config(config)
    lr = optimizer.step_lr(rule_lr, config.server_lr)
    return (lr, optimizer) if optimizer.stateful else (lr,)


def server_state(engine: Any) -> Optional[Dict[str, Any]]:
    """A synchronous run's server-optimiser state now, None without one (an asynchronous run's is its loop's)."""
    stateful = engine.asynchronous is None and of_config(engine.config).stateful
    return engine.backend.server_momentum() if stateful else None


def as_state(value: Optional[Mapping[str, Any]]) -> Optional[State]:
    """A checkpoint's server-optimiser state: ``{"m": ..., "v": ...}``, or (a FedBuff checkpoint written before the
    server optimisers) the momentum buffer itself, name -> tensor, read as its ``m``."""
    if value is None:
        return None
    if value and all(isinstance(t, torch.Tensor) for t in value.values()):
        return {"m": dict(value)}
    return {key: dict(part) for key, part in value.items()}


__all__ = ["ADAPTIVE", "DEFAULTS", "FEDAVGM_MOMENTUM", "SERVER_OPTIMIZERS", "ServerOptimizer", "adaptive_moments",
           "as_state", "of_config", "server_call", "server_state", "server_update"]
