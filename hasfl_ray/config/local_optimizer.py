"""The clients' local optimiser's keys, checked (``local_optimizer``, ``local_optimizer_options``; the optimiser itself:
:mod:`hasfl_ray.training.local_optim`). docs/configs.md, "Server and local optimisers": ``sgd`` (the default) is the
built-in step (:class:`~hasfl_ray.training.step.LocalSGD`: clip, then SGD with ``momentum`` and ``weight_decay``),
the one every batched and captured training path takes, bit for bit as always; any other name is a ``torch.optim``
class (matched without regard to case: ``adam``, ``AdamW``, ``RMSprop``; ``SGD`` with options is torch's own), built
per client and round on the sub-model's parameters with the round's learning rate, ``weight_decay`` (where the class
takes one and the options do not set it), torch SGD's ``momentum`` likewise, and the options; gradients are clipped
to ``clip_norm`` first, as the built-in step does. Such clients train one at a time (eagerly)."""

from __future__ import annotations

import inspect
import json
from typing import Any, Dict, Optional, Tuple

import torch

from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import shown

BUILTIN = "sgd"
#: Options the run sets itself: the parameters, and the learning rate (--lr and its schedule).
RESERVED = ("params", "lr")


def optimizer_class(name: str) -> Optional[type]:
    """The ``torch.optim`` optimiser class called ``name`` (any case), None when there is none."""
    wanted = name.strip().lower()
    for attribute in dir(torch.optim):
        value = getattr(torch.optim, attribute)
        if attribute.lower() == wanted and isinstance(value, type) and issubclass(value, torch.optim.Optimizer):
            return value
    return None


def builtin(name: str, options: Any) -> bool:
    """Whether ``name`` with ``options`` is the built-in step (``sgd`` without options)."""
    return name.strip().lower() == BUILTIN and not options


def _prepared(options: Dict[str, Any]) -> Dict[str, Any]:
    """JSON's lists as tuples (``betas: [0.9, 0.99]`` as torch's (0.9, 0.99))."""
    return {key: tuple(value) if isinstance(value, list) else value for key, value in options.items()}


def filled_options(cls: type, options: Dict[str, Any], weight_decay: float,
                   momentum: Optional[float]) -> Dict[str, Any]:
    """The keyword arguments of ``cls``: the options, plus the run's weight decay (and torch SGD's momentum) where
    the class takes them and the options leave them out."""
    accepted = inspect.signature(cls.__init__).parameters
    out = _prepared(options)
    if "weight_decay" in accepted and "weight_decay" not in out:
        out["weight_decay"] = float(weight_decay)
    if cls is torch.optim.SGD and "momentum" not in out and momentum is not None:
        out["momentum"] = float(momentum)
    return out


def check_local_optimizer(name: Any, options: Any) -> Tuple[str, Dict[str, Any]]:
    """``local_optimizer`` and ``local_optimizer_options`` (a mapping, or its JSON text) checked: the name of a
    ``torch.optim`` class (normalised to the class's own spelling; ``sgd`` without options stays the built-in step)
    whose constructor takes the options. One sentence for anything else."""
    expected = ("sgd (the built-in step) or the name of a torch.optim optimiser, e.g. Adam, AdamW, RMSprop, Adagrad "
                "(any case)")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"local_optimizer is {shown(name)}; expected {expected}")
    if isinstance(options, str):
        try:
            options = json.loads(options) if options.strip() else {}
        except ValueError:
            raise ConfigError(f"local_optimizer_options is {shown(options)}; expected a JSON object of the "
                              "optimiser's keyword options, e.g. '{\"betas\": [0.9, 0.99]}'") from None
    options = {} if options is None else options
    if not isinstance(options, dict) or not all(isinstance(key, str) for key in options):
        raise ConfigError(f"local_optimizer_options is {shown(options)}; expected a mapping of the optimiser's keyword "
                          "options, e.g. {\"betas\": [0.9, 0.99]}")
    if builtin(name, options):
        return BUILTIN, {}
    cls = optimizer_class(name)
    if cls is None:
        raise ConfigError(f"local_optimizer is {shown(name)}; expected {expected}")
    if cls is torch.optim.LBFGS:
        raise ConfigError("local_optimizer is 'LBFGS'; expected an optimiser whose step needs no closure (LBFGS "
                          "re-evaluates the loss itself)")
    reserved = [key for key in RESERVED if key in options]
    if reserved:
        raise ConfigError(f"local_optimizer_options sets {reserved[0]!r}; expected the optimiser's other options "
                          "(the learning rate is --lr with its schedule)")
    try:
        cls([torch.zeros(1, requires_grad=True)], lr=0.01, **filled_options(cls, options, 0.0, None))
    except (TypeError, ValueError, RuntimeError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise ConfigError(f"local_optimizer_options {shown(json.dumps(options))[1:-1]} are not {cls.__name__}'s "
                          f"({reason}); expected keyword options torch.optim.{cls.__name__} takes") from None
    return cls.__name__, dict(options)


__all__ = ["BUILTIN", "builtin", "check_local_optimizer", "filled_options", "optimizer_class"]
