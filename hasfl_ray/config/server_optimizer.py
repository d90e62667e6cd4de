"""The server optimiser's config keys, checked and normalised (docs/algorithms.md, "Server optimisers"):
``server_optimizer`` (sgd, fedavgm, fedadam, fedyogi, fedadagrad; :mod:`hasfl_ray.aggregation.server_optim`),
``server_lr`` η, ``server_momentum`` β (sgd and fedavgm), ``server_beta1``, ``server_beta2`` and ``server_tau`` (the
adaptive ones), in both run modes. Pure values only."""

from __future__ import annotations

from typing import Any, Dict, Optional

from hasfl_ray.aggregation.server_optim import ADAPTIVE, DEFAULTS, FEDAVGM_MOMENTUM, SERVER_OPTIMIZERS
from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import FLOAT32_MAX, MAX_LR, finite_number, shown

#: The keys this module checks.
SERVER_KEYS = ("server_optimizer", "server_lr", "server_momentum", "server_beta1", "server_beta2", "server_tau")
_ADAPTIVE_ONLY = ("server_beta1", "server_beta2", "server_tau")


def _refuse(name: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{name} is {shown(value)}; expected {expected}")


def _number(name: str, value: Any, low: float, high: float, expected: str, low_open: bool = False) -> float:
    if not finite_number(value) or value > high or value < low or (low_open and value == low):
        raise _refuse(name, value, expected)
    return float(value)


def check_server_keys(values: Dict[str, Any], mode: str, rule: Optional[str]) -> Dict[str, Any]:
    """The server-optimiser keys of ``values`` checked, their defaults filled; ``mode`` sync or async, ``rule`` the
    asynchronous rule (fedbuff or fedasync; None in sync mode). sgd keeps what the keys were (a synchronous run leaves
    ``server_lr`` and ``server_momentum`` unset; FedBuff fills 1 and 0, as it always has); one sentence for a bad
    value or a key the optimiser does not take."""
    name = values.get("server_optimizer")
    name = "sgd" if name is None else name
    if name not in SERVER_OPTIMIZERS:
        raise _refuse("server_optimizer", name, "sgd (w + eta Delta, the default), fedavgm, fedadam, fedyogi or "
                                                "fedadagrad (Reddi et al., 2021)")
    out: Dict[str, Any] = {"server_optimizer": name}
    lr, momentum = values.get("server_lr"), values.get("server_momentum")
    if name not in ADAPTIVE:
        for key in _ADAPTIVE_ONLY:
            if values.get(key) is not None:
                raise ConfigError(f"{key} is {shown(values[key])} but server_optimizer is {shown(name)}; expected it "
                                  "only with fedadam, fedyogi or fedadagrad")
        if name == "fedavgm" and rule == "fedasync":
            raise ConfigError("server_optimizer is 'fedavgm' but async_rule is 'fedasync'; expected sgd or an adaptive "
                              "one with fedasync (FedAsync's step is the mixing weight alpha s(tau))")
        if name == "fedavgm" and momentum is None:
            momentum = FEDAVGM_MOMENTUM
        if rule == "fedasync":  # FedBuff's defaults, as a FedBuff run's config.yaml writes them, are no step at all
            for key, value, default in (("server_lr", lr, 1.0), ("server_momentum", momentum, 0.0)):
                if value is not None and not (finite_number(value) and value == default):
                    raise ConfigError(f"{key} is {shown(value)} but async_rule is 'fedasync'; expected it only with "
                                      "fedbuff or with an adaptive server_optimizer (FedAsync's step is the mixing "
                                      "weight alpha s(tau))")
            return out
        if rule == "fedbuff":
            lr, momentum = (1.0 if lr is None else lr), (0.0 if momentum is None else momentum)
        if lr is not None:
            out["server_lr"] = _number("server_lr", lr, 0.0, MAX_LR, f"a number > 0 and at most {MAX_LR:g} (the "
                                       "server learning rate)", low_open=True)
        if momentum is not None:
            out["server_momentum"] = _number("server_momentum", momentum, 0.0, 1.0, "a number in [0, 1) (the server "
                                             "momentum)")
            if out["server_momentum"] == 1.0:
                raise _refuse("server_momentum", momentum, "a number in [0, 1) (the server momentum)")
        return out
    if momentum is not None:
        raise ConfigError(f"server_momentum is {shown(momentum)} but server_optimizer is {shown(name)}; expected it "
                          "only with sgd or fedavgm (the adaptive optimisers' momentum is server_beta1)")
    eta, beta1, beta2, tau = DEFAULTS[name]
    given = {key: values.get(key) for key in ("server_lr", *_ADAPTIVE_ONLY)}
    if name == "fedadagrad" and given["server_beta2"] is not None:
        raise ConfigError(f"server_beta2 is {shown(given['server_beta2'])} but server_optimizer is 'fedadagrad'; "
                          "expected it only with fedadam or fedyogi (Adagrad's v sums every squared update)")
    out["server_lr"] = _number("server_lr", eta if lr is None else lr, 0.0, MAX_LR,
                               f"a number > 0 and at most {MAX_LR:g} (the server learning rate eta)", low_open=True)
    for key, default in (("server_beta1", beta1), ("server_beta2", beta2)):
        if default is None:
            continue
        value = _number(key, default if given[key] is None else given[key], 0.0, 1.0, "a number in [0, 1)")
        if value == 1.0:
            raise _refuse(key, given[key], "a number in [0, 1)")
        out[key] = value
    out["server_tau"] = _number("server_tau", tau if given["server_tau"] is None else given["server_tau"], 0.0,
                                FLOAT32_MAX, "a number > 0 (the adaptivity tau in eta m / (sqrt(v) + tau))",
                                low_open=True)
    return out
