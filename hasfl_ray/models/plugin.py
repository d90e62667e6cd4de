"""Bring your own model (docs/plugins.md#models): any ``nn.Module`` built with a ``width`` argument, named like an
algorithm plug-in (``--model FILE.py:Class`` or ``--model MODULE:Class``), or by a dataset plug-in's ``model_config``
(``kind`` a spec or the class itself).

The contract: ``factory(width=p, **arguments)`` returns the width-p network (``factory`` a ``nn.Module`` subclass, or
a function returning one), every width-scaled dimension of every parameter has ``ceil(p * c)`` of its ``c`` channels
(:func:`~hasfl_ray.models.slicing.width_channels`), and the parameter names are the same at every width. With
``--model``, the arguments are those of ``num_classes``, ``input_shape``, ``in_channels`` and ``image_size`` (images
of shape (C, H, W)) and ``in_features`` (flat inputs) that the factory's signature names, read off the dataset.

The slice description (a :class:`~hasfl_ray.models.slicing.ParamSpec` per parameter) is derived by building the
network at width 1 and at :data:`PROBE_WIDTHS` and reading each dimension's sizes: one that keeps its full size
``S`` at every probe is not sliced; one of ``blocks * ceil(p * S / (unit * blocks)) * unit`` at every probe is, with
the smallest ``unit`` (channels of ``unit`` consecutive positions, as a flattened feature map's) that fits, more
widths being built where two units fit the probes alike; ``blocks`` (equal parts of dimension 0 sliced separately:
an LSTM's gates, a fused q/k/v projection) is 4 for ``nn.LSTM``, 3 for ``nn.GRU`` and a ``nn.MultiheadAttention``'s
``in_proj``, and otherwise what the model declares in ``slice_blocks`` (parameter name or glob -> blocks). A model
with a ``param_specs()`` method gives its own description instead, checked against its shapes at the probes.
Anything that follows no rule is one :class:`~hasfl_ray.errors.ConfigError` sentence. Loading the factory, checking its
signature and building it at one width are :mod:`hasfl_ray.models.plugin_factory`'s (its names importable here).
"""

from __future__ import annotations

import fnmatch
import functools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from hasfl_ray.errors import ConfigError, expected_one_of
from hasfl_ray.models.plugin_factory import (CONTRACT, INPUT_ARGUMENTS, _construct, _label, accepted_arguments,
                                             check_width, dataset_arguments, is_plugin_kind, load_factory, model_name,
                                             normalise_config, plugin_config)
from hasfl_ray.models.slicing import DimSlice, ParamSpec
from hasfl_ray.registry import _message

#: Widths a plug-in model is built at, besides 1, to read how its dimensions scale: uneven fractions of most
#: channel counts, so that ceil(p * c) tells a unit of k positions per channel from single positions.
PROBE_WIDTHS = (0.5, 0.37, 0.73, 0.13, 0.91)
#: Gate blocks of dimension 0 of torch's recurrent and attention layers' parameters (by the layer's type).
LAYER_BLOCKS: Tuple[Tuple[type, str, int], ...] = (
    (nn.LSTM, "weight_*", 4), (nn.LSTM, "bias_*", 4), (nn.GRU, "weight_*", 3), (nn.GRU, "bias_*", 3),
    (nn.MultiheadAttention, "in_proj_*", 3))

_DERIVED: Dict[Any, Dict[str, ParamSpec]] = {}  # (factory, spec, arguments) -> slice description


def _shapes(model: nn.Module) -> Dict[str, Tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def declared_blocks(model: nn.Module, label: str) -> Dict[str, int]:
    """Gate blocks of dimension 0 per parameter: torch's LSTM, GRU and attention layers' (:data:`LAYER_BLOCKS`),
    then the model's own ``slice_blocks`` (a mapping of parameter names or globs to block counts)."""
    names = [name for name, _ in model.named_parameters()]
    blocks: Dict[str, int] = {}
    for prefix, layer in model.named_modules():
        for kind, pattern, count in LAYER_BLOCKS:
            if isinstance(layer, kind):
                for name, _ in layer.named_parameters(recurse=False):
                    if fnmatch.fnmatchcase(name, pattern):
                        blocks[f"{prefix}.{name}" if prefix else name] = count
    declared = getattr(model, "slice_blocks", None) or {}
    if not isinstance(declared, Mapping):
        raise ConfigError(f"model {label!r} has slice_blocks {declared!r}; expected a mapping of parameter names "
                          "(or globs) to block counts")
    for pattern, count in declared.items():
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
            raise ConfigError(f"model {label!r} declares slice_blocks {pattern!r}: {count!r}; expected a positive "
                              "integer")
        matched = [n for n in names if fnmatch.fnmatchcase(n, str(pattern))]
        if not matched:
            raise ConfigError(f"model {label!r} declares slice_blocks for {pattern!r}, which names no parameter; "
                              f"{expected_one_of(str(pattern), names, 'a parameter name or glob, e.g.')}")
        blocks.update(dict.fromkeys(matched, count))
    return blocks


def _candidates(size: int, blocks: int) -> List[DimSlice]:
    if size % blocks:
        return []
    per_block = size // blocks
    return [DimSlice(size, True, unit, blocks) for unit in range(1, per_block + 1) if per_block % unit == 0]


def _breakpoint_widths(candidates: Sequence[DimSlice]) -> List[float]:
    """Widths between the steps of every candidate's sliced size, where two of them may disagree."""
    steps = sorted({k / d.channels for d in candidates for k in range(d.channels + 1)})
    return [(a + b) / 2 for a, b in zip(steps[:-1], steps[1:])]


class _Probe:
    """The model's parameter shapes at each width built so far (width 1 and the probes first)."""

    def __init__(self, factory, label: str, arguments: Mapping[str, Any]):
        self.factory, self.label, self.arguments = factory, label, arguments
        self.full = _construct(factory, label, arguments, 1.0)
        self.names = list(_shapes(self.full))
        self.shapes: Dict[float, Dict[str, Tuple[int, ...]]] = {1.0: _shapes(self.full)}
        if not self.names:
            raise ConfigError(f"model {label!r} has no parameters; expected a network with trainable parameters")

    def at(self, width: float) -> Dict[str, Tuple[int, ...]]:
        if width not in self.shapes:
            shapes = _shapes(_construct(self.factory, self.label, self.arguments, width))
            check_names(self.label, self.shapes[1.0], shapes, width)
            self.shapes[width] = shapes
        return self.shapes[width]


def check_names(label: str, full: Mapping[str, Tuple[int, ...]], shapes: Mapping[str, Tuple[int, ...]],
                width: float) -> None:
    """Refuse, in one sentence, a width-``width`` network whose parameters differ from width 1's in name or rank."""
    missing = [n for n in full if n not in shapes]
    extra = [n for n in shapes if n not in full]
    if missing or extra:
        name, which = (missing[0], "has no") if missing else (extra[0], "has a")
        raise ConfigError(f"model {label!r} cannot be sliced: its width-{width:g} network {which} parameter {name!r} "
                          f"({'the' if missing else 'no'} width-1 network has one); expected the same parameter names "
                          "at every width")
    for name, shape in shapes.items():
        if len(shape) != len(full[name]):
            raise ConfigError(f"model {label!r} cannot be sliced: parameter {name!r} has shape {shape} at width "
                              f"{width:g} but {full[name]} at width 1; expected the same number of dimensions")


def _fit(probe: _Probe, name: str, dim: int, blocks: int) -> DimSlice:
    size = probe.shapes[1.0][name][dim]

    def sizes() -> Dict[float, int]:
        return {w: shapes[name][dim] for w, shapes in probe.shapes.items() if w != 1.0}

    if all(s == size for s in sizes().values()):
        return DimSlice(size, False)
    fitting = [d for d in _candidates(size, blocks) if all(d.sliced(w) == s for w, s in sizes().items())]
    while len(fitting) > 1:  # two units fit the probes alike: build where they differ
        split = next((w for w in _breakpoint_widths(fitting) if len({d.sliced(w) for d in fitting}) > 1), None)
        if split is None:
            break
        observed = probe.at(split)[name][dim]
        fitting = [d for d in fitting if d.sliced(split) == observed]
    if fitting:
        return fitting[0]
    plain = DimSlice(size, True, 1, blocks) if size % blocks == 0 else None
    width, observed = next(((w, s) for w, s in sizes().items() if plain is None or plain.sliced(w) != s),
                           next((w, s) for w, s in sizes().items() if s != size))
    rule = f"in {blocks} blocks sliced alike (declared), " if blocks > 1 else ""
    raise ConfigError(f"model {probe.label!r} cannot be sliced: dimension {dim} of parameter {name!r} has {observed} "
                      f"of its {size} positions at width {width:g}, which follows no width rule; expected {rule}"
                      f"ceil(p * c) of its c channels (hasfl_ray.models.width_channels) or all {size} at every width")


def derive_specs(factory: Callable[..., Any], arguments: Optional[Mapping[str, Any]] = None,
                 spec: Optional[str] = None) -> Dict[str, ParamSpec]:
    """The slice description of every parameter of plug-in model ``factory`` (module docstring), in the width-1
    network's parameter order; its own ``param_specs()`` where it has one, checked at :data:`PROBE_WIDTHS`. Builds
    run with the global torch RNG forked (left as it was)."""
    arguments, label = dict(arguments or {}), _label(factory, spec)
    with torch.random.fork_rng(devices=[]):
        probe = _Probe(factory, label, arguments)
        check_buffers(probe.full, label)
        for width in PROBE_WIDTHS:
            probe.at(width)
        own = getattr(probe.full, "param_specs", None)
        if callable(own):
            specs = own()
            check_specs(label, specs, probe.shapes)
            return {name: specs[name] for name in probe.names}
        blocks = declared_blocks(probe.full, label)
        specs = {}
        for name in probe.names:
            dims = tuple(_fit(probe, name, d, blocks.get(name, 1) if d == 0 else 1)
                         for d in range(len(probe.shapes[1.0][name])))
            specs[name] = ParamSpec(name, dims)
        check_specs(label, specs, probe.shapes)  # widths built to tell units apart included
        return specs


def check_specs(label: str, specs: Any, shapes: Mapping[float, Mapping[str, Tuple[int, ...]]]) -> None:
    """Refuse, in one sentence, slice descriptions that do not give the network's shapes at every built width."""
    full = shapes[1.0]
    if not isinstance(specs, Mapping) or not all(isinstance(s, ParamSpec) for s in specs.values()):
        raise ConfigError(f"model {label!r} returned {type(specs).__name__} from param_specs(); expected a dict of "
                          "parameter names to hasfl_ray.models.ParamSpec")
    missing = [n for n in full if n not in specs]
    if missing:
        raise ConfigError(f"model {label!r} has no ParamSpec for parameter {missing[0]!r} in param_specs(); expected "
                          "one for every parameter")
    for width, at in shapes.items():
        for name, shape in at.items():
            if tuple(specs[name].sliced_shape(width)) != tuple(shape):
                raise ConfigError(f"model {label!r} cannot be sliced: parameter {name!r} has shape {tuple(shape)} at "
                                  f"width {width:g} but its ParamSpec gives {specs[name].sliced_shape(width)}; "
                                  "expected them equal at every width")


def check_buffers(model: nn.Module, label: str) -> None:
    """Refuse BatchNorm running statistics (per-trainer state that no round aggregates) and non-float32 parameters."""
    for name, layer in model.named_modules():
        if isinstance(layer, nn.modules.batchnorm._NormBase) and layer.track_running_stats:
            raise ConfigError(f"model {label!r} has norm layer {name!r} with running statistics, which federated "
                              "training never aggregates; expected track_running_stats=False (batch statistics) or "
                              "hasfl_ray.models.resnet.StaticBatchNorm2d")
    for name, param in model.named_parameters():
        if param.dtype != torch.float32:
            raise ConfigError(f"model {label!r} has parameter {name!r} of dtype {str(param.dtype)[6:]}; expected "
                              "float32")


def slice_specs(factory, spec: str, arguments: Mapping[str, Any]) -> Dict[str, ParamSpec]:
    """:func:`derive_specs`, once per (factory, spec, arguments) in a process."""
    key = (factory, spec, repr(sorted(arguments.items())))
    if key not in _DERIVED:
        _DERIVED[key] = derive_specs(factory, arguments, spec)
    return _DERIVED[key]


def measured_macs(model: nn.Module, sample: Optional[dict], label: str, width: float) -> int:
    """Multiply-accumulates per sample of ``model`` (built at ``width``) on a zero input of the dataset's shape,
    counted by torch's FLOP counter (half its FLOPs; it counts matrix multiplications and convolutions only): the
    cost of a plug-in without a ``macs(p)`` method. One forward pass over two samples, the count halved (exact: the
    counted operations scale with the batch), so that a norm layer of batch statistics sees more than one value."""
    from torch.utils.flop_counter import FlopCounterMode

    if sample is None:
        raise ConfigError(f"model {label!r} has no macs(p) method and no known input shape; expected a macs(p) "
                          "method returning its multiply-accumulates per sample at width p")
    device = next(model.parameters()).device
    x = torch.zeros((2, *sample["shape"]), dtype=getattr(torch, sample["dtype"]), device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
    except (KeyboardInterrupt, ConfigError):
        raise
    except BaseException as error:  # noqa: BLE001 (the plug-in's own forward pass; SystemExit too)
        raise ConfigError(f"model {label!r} fails on an input of shape {list(sample['shape'])} {sample['dtype']} at "
                          f"width {width:g} ({type(error).__name__}: {_message(error, 160)}); expected a forward "
                          "pass over the dataset's inputs") from None
    finally:
        model.train(was_training)
    return int(counter.get_total_flops()) // 4


def build_plugin(width: float = 1.0, factory=None, spec: str = "", arguments: Optional[Mapping[str, Any]] = None,
                 sample: Optional[dict] = None) -> nn.Module:
    """The width-``width`` network of a registered plug-in model (``MODEL_KINDS['plugin']``), its shapes checked
    against the derived slice description, with ``param_specs()`` (and, where it has none, ``macs(p)``) attached."""
    if factory is None:
        raise ConfigError(f"model_config of plug-in model {spec!r} has no factory; expected kind FILE.py:Class or "
                          "MODULE:Class (or the class itself) with the constructor's arguments beside it")
    arguments = dict(arguments or {})
    specs = slice_specs(factory, spec, arguments)
    model = _construct(factory, spec, arguments, width)
    shapes = _shapes(model)
    check_names(spec, {n: s.shape for n, s in specs.items()}, shapes, width)
    check_specs(spec, specs, {1.0: {n: s.shape for n, s in specs.items()}, width: shapes})
    if not callable(getattr(model, "param_specs", None)):
        model.param_specs = functools.partial(dict, specs)
    if not callable(getattr(model, "macs", None)):
        model.macs = functools.partial(_macs_at, factory, spec, arguments, sample)
    return model


def _macs_at(factory, spec: str, arguments: Mapping[str, Any], sample: Optional[dict], width: float) -> int:
    with torch.random.fork_rng(devices=[]):
        return measured_macs(_construct(factory, spec, arguments, width), sample, spec, width)


def describe(specs: Mapping[str, ParamSpec]) -> List[str]:
    """One line per parameter: its name, full shape and how each dimension slices (``-`` for not at all, ``c``
    channels, ``c x u`` channels of ``u`` positions, ``b * c`` blocks of ``c`` channels)."""
    def dim(d: DimSlice) -> str:
        if not d.scaled:
            return "-"
        text = f"{d.channels}" + (f"x{d.unit}" if d.unit > 1 else "")
        return f"{d.blocks}*{text}" if d.blocks > 1 else text
    width = max(len(n) for n in specs) if specs else 0
    return [f"{name:<{width}}  {str(tuple(s.shape)):<18} [{', '.join(dim(d) for d in s.dims)}]"
            for name, s in specs.items()]


__all__ = ["CONTRACT", "INPUT_ARGUMENTS", "LAYER_BLOCKS", "PROBE_WIDTHS", "accepted_arguments", "build_plugin",
           "check_width",
           "dataset_arguments", "declared_blocks", "derive_specs", "describe", "is_plugin_kind", "load_factory",
           "measured_macs", "model_name", "normalise_config", "plugin_config", "slice_specs"]
