"""Finding and calling a plug-in model's factory (docs/plugins.md#models): ``FILE.py:Class`` / ``MODULE:Class``
loaded, its signature checked for ``width`` and the arguments read off the dataset, the registered ``model_config``
of a plug-in model, and one build at a width. :mod:`hasfl_ray.models.plugin` derives the slice description from
these builds (and re-exports every name here).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch
from torch import nn

from hasfl_ray.errors import ConfigError, expected_one_of
from hasfl_ray.registry import _load_module, _message, is_spec

#: Arguments ``--model`` gives a plug-in's factory, read off the dataset, where its signature names them.
INPUT_ARGUMENTS = ("num_classes", "input_shape", "in_channels", "image_size", "in_features")
CONTRACT = "__init__(self, width: float = 1.0, ...) or a function make(width, ...) returning an nn.Module"


def is_plugin_kind(kind: Any) -> bool:
    """Whether a ``model_config`` ``kind`` names a plug-in model: a spec, a class or a function."""
    return is_spec(kind) or (callable(kind) and not isinstance(kind, str))


def load_factory(spec: str) -> Callable[..., nn.Module]:
    """The class or function ``FILE.py:Name`` / ``MODULE:Name`` names (a file's module is shipped to Ray actors by
    value, as an algorithm plug-in's is); one ConfigError sentence where there is none."""
    location, _, attribute = spec.rpartition(":")
    if not location or not attribute.isidentifier():
        raise ConfigError(f"model is {spec!r}; expected preresnet18, preresnet18-1112, resnet18, or FILE.py:Class or "
                          "MODULE:Class "
                          "naming an nn.Module with a width argument")
    module = _load_module("model", spec, location)
    factory = getattr(module, attribute, None)
    if factory is None:
        names = sorted(n for n, v in vars(module).items() if callable(v) and getattr(v, "__module__", None)
                       == module.__name__)
        raise ConfigError(f"model is {spec!r} but {location!r} has no {attribute!r}; "
                          + (expected_one_of(attribute, names, "one defined there:") if names else
                             f"expected a class or function defined there, and {location!r} defines none"))
    if not callable(factory) or (isinstance(factory, type) and not issubclass(factory, nn.Module)):
        raise ConfigError(f"model is {spec!r} but {attribute} is not an nn.Module subclass or a function; expected "
                          f"{CONTRACT}")
    return factory


def _label(factory: Any, spec: Optional[str]) -> str:
    return spec or f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', factory)}"


def _signature(factory: Callable[..., Any]) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without one: take it at its word
        return None


def check_width(factory: Callable[..., Any], spec: str) -> None:
    """Refuse, in one sentence, a factory whose signature takes no ``width`` (nor ``**kwargs``)."""
    signature = _signature(factory)
    if signature is not None and "width" not in signature.parameters and not any(
            p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        raise ConfigError(f"model {spec!r} takes no width argument; expected {CONTRACT}")


def accepted_arguments(factory: Callable[..., Any], spec: str, offered: Mapping[str, Any]) -> Dict[str, Any]:
    """Of ``offered`` (:data:`INPUT_ARGUMENTS` read off a dataset), those the factory's signature takes (all, with
    ``**kwargs``); a ConfigError sentence where it takes no ``width`` or needs an argument nobody gives it."""
    signature = _signature(factory)
    if signature is None:
        return dict(offered)
    check_width(factory, spec)
    parameters = signature.parameters
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    taken = {k: v for k, v in offered.items() if k in parameters or var_keyword}
    for name, p in parameters.items():
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and \
                name != "width" and name not in taken:
            raise ConfigError(f"model {spec!r} needs argument {name!r}, which hasfl-ray does not give (it gives width "
                              f"and {', '.join(offered) or 'nothing else'}); expected a default for it")
    return taken


def dataset_arguments(dataset) -> Tuple[Dict[str, Any], dict]:
    """(:data:`INPUT_ARGUMENTS` of ``dataset``, the shape and dtype of one input) from one test sample."""
    x, _ = next(iter(dataset.test_batches(1)))
    shape = [int(s) for s in x.shape[1:]]
    offered: Dict[str, Any] = {"num_classes": int(dataset.num_classes), "input_shape": shape}
    if len(shape) == 3:
        offered["in_channels"] = shape[0]
        offered["image_size"] = shape[1] if shape[1] == shape[2] else shape[1:]
    elif len(shape) == 1 and x.is_floating_point():
        offered["in_features"] = shape[0]
    return offered, {"shape": shape, "dtype": str(x.dtype).replace("torch.", "")}


def plugin_config(kind: Any, arguments: Optional[Mapping[str, Any]] = None, sample: Optional[dict] = None) -> dict:
    """The registered ``model_config`` of a plug-in model: ``kind`` ``plugin``, its ``factory`` (the class itself,
    which travels to Ray actors with the dataset), its ``spec`` and the constructor's ``arguments``."""
    spec = kind if isinstance(kind, str) else _label(kind, None)
    factory = load_factory(kind) if isinstance(kind, str) else kind
    return dict(kind="plugin", factory=factory, spec=spec, arguments=dict(arguments or {}), sample=sample)


def normalise_config(config: Mapping[str, Any]) -> dict:
    """A dataset plug-in's ``model_config`` whose ``kind`` is a spec or a class (its other keys the constructor's
    arguments) as :func:`plugin_config`'s; any other config unchanged."""
    config = dict(config)
    if config.get("kind") == "plugin" or not is_plugin_kind(config.get("kind")):
        return config
    kind = config.pop("kind")
    return plugin_config(kind, config)


def _construct(factory: Callable[..., Any], label: str, arguments: Mapping[str, Any], width: float) -> nn.Module:
    try:
        model = factory(width=width, **arguments)
    except (KeyboardInterrupt, ConfigError):
        raise
    except BaseException as error:  # noqa: BLE001 (the plug-in's own code; SystemExit too)
        raise ConfigError(f"model {label!r} fails to build at width {width:g} ({type(error).__name__}: "
                          f"{_message(error, 160)}); expected {CONTRACT}") from None
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model {label!r} built a {type(model).__name__} at width {width:g}; expected an "
                          "nn.Module")
    check_materialised(model, label)
    return model


def check_materialised(model: nn.Module, label: str) -> None:
    """Refuse, in one sentence, a network whose parameters or buffers hold no values yet: a lazy module's
    (``nn.LazyLinear``: no shape until a forward pass) or one on the meta device (shapes, no data), and one whose
    values are not finite (a NaN in w^(0) made every update non-finite, each rejected, and the run "succeeded"
    with its first model). Every build of a plug-in model goes through here, so the slice description, ``cost``
    and training never reach them."""
    for kind, tensors in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, tensor in tensors:
            if isinstance(tensor, nn.parameter.UninitializedTensorMixin):
                raise ConfigError(f"model {label!r} has {kind} {name!r} uninitialised (a lazy module); expected "
                                  "its shape given in __init__ (the layer's input size)")
            if tensor.is_meta:
                raise ConfigError(f"model {label!r} has {kind} {name!r} on the meta device (no values); expected "
                                  "it built on the CPU")
            values = tensor.detach().reshape(-1)
            finite = torch.isfinite(values) if values.is_floating_point() or values.is_complex() else None
            if finite is not None and not bool(finite.all()):
                bad = values[~finite][0].item()
                raise ConfigError(f"model {label!r} has {kind} {name!r} holding {bad} in its initial values; "
                                  "expected finite numbers (a NaN or inf trains nothing)")


def model_name(spec: str, sample: dict, num_classes: int) -> str:
    """The registered name of plug-in ``spec`` on a dataset's inputs (like a ResNet's, it says the whole config)."""
    shape = "x".join(str(s) for s in sample["shape"])
    return f"{spec}[{shape} {sample['dtype']},{num_classes} classes]"
