"""Models of the paper, built at any width p, with the slice descriptions that drive sub-model training."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from torch import nn

from hasfl_ray.models.cnn import ImageCNN
from hasfl_ray.models.depth import check_depth, counted_cost, depth_names, exit_depths
from hasfl_ray.models.lstm import CharLSTM
from hasfl_ray.models.mlp import MLP
from hasfl_ray.models.plugin import build_plugin, is_plugin_kind, normalise_config
from hasfl_ray.models.resnet import NORMS, RESNETS, PreResNet18, PreResNet1112, ResNet18, resnet_config
from hasfl_ray.models.slicing import DimSlice, ParamSpec, extract, gate_blocks_of, insert_, mask, region, width_channels

PAPER_STAGES = ((64, 64), (128, 128), (256, 256))

#: Architecture of the model each dataset trains (docs/design.md, "Models").
MODEL_CONFIGS: Dict[str, dict] = {
    "cifar10": dict(kind="cnn", in_channels=3, num_classes=10, image_size=32, stages=PAPER_STAGES, fc_width=512),
    "cifar100": dict(kind="cnn", in_channels=3, num_classes=100, image_size=32, stages=PAPER_STAGES, fc_width=512),
    "emnist": dict(kind="cnn", in_channels=1, num_classes=62, image_size=28, stages=PAPER_STAGES, fc_width=512),
    "digits": dict(kind="cnn", in_channels=1, num_classes=10, image_size=8, stages=((32,), (64,)), fc_width=128),
    "shakespeare": dict(kind="lstm", vocab_size=95, embed_dim=8, hidden=256, layers=2, seq_len=80),
    "synthetic": dict(kind="mlp", in_features=60, num_classes=10, hidden=(128, 128)),
}

MODEL_NAMES = tuple(MODEL_CONFIGS)  # the built-in models
MODEL_KINDS = {"cnn": ImageCNN, "lstm": CharLSTM, "mlp": MLP, **RESNETS, "plugin": build_plugin}


def register_model(name: str, config: Optional[Mapping[str, Any]]) -> None:
    """Make ``name`` buildable from ``config`` (a dataset plug-in's ``model_config``: ``kind`` one of cnn, lstm,
    mlp, and that class's arguments; or a plug-in model, ``kind`` a ``FILE.py:Class`` / ``MODULE:Class`` spec or the
    class itself, its slice description derived here: :mod:`hasfl_ray.models.plugin`). Registering the same config
    again is a no-op; None leaves ``name`` as is."""
    from hasfl_ray.errors import ConfigError

    if config is None:
        return
    config = normalise_config(config) if is_plugin_kind(config.get("kind")) else dict(config)
    if MODEL_CONFIGS.get(name) == config:
        return
    if name in MODEL_NAMES:
        raise ConfigError(f"model is {name!r} with a model_config, but {name!r} is a built-in model; expected a new "
                          "model name for a new architecture")
    if config.get("kind") not in MODEL_KINDS:
        raise ConfigError(f"model_config kind is {config.get('kind')!r}; expected one of "
                          f"{', '.join(k for k in MODEL_KINDS if k != 'plugin')}, or a plug-in model's FILE.py:Class "
                          "or MODULE:Class")
    try:
        build_model_from(config)
    except TypeError as error:
        raise ConfigError(f"model_config of {name!r} is {config!r} ({error}); expected the arguments of the "
                          f"{config['kind']} model") from None
    MODEL_CONFIGS[name] = config


def build_model_from(config: Mapping[str, Any], width: float = 1.0, depth: Optional[int] = None) -> nn.Module:
    config = dict(config)
    if depth is not None:  # a depth sub-model of a model with exits (hasfl_ray.models.depth)
        config["depth"] = depth
    return MODEL_KINDS[config.pop("kind")](width=width, **config)


def build_model(name: str, width: float = 1.0, depth: Optional[int] = None) -> nn.Module:
    """The model of dataset ``name`` as a physically width-``width`` network (``depth``: its first ``depth`` stages
    and their exits, a model with exits only: :mod:`hasfl_ray.models.depth`)."""
    if name not in MODEL_CONFIGS:
        raise ValueError(f"model {name!r} is unknown; expected one of {', '.join(MODEL_CONFIGS)}")
    return build_model_from(MODEL_CONFIGS[name], width, depth)


def pads_exactly(model: nn.Module) -> bool:
    """Whether ``model``'s width-p networks are its widest network with the parameters zero-padded: every padded
    channel (zero weights and biases at the trailing indices of each sliced dim, inside each gate block) stays
    exactly 0 through the forward pass and never touches a kept one, so clients of different widths can train as
    one stack padded to the widest (``--client-batching mixed``, :mod:`hasfl_ray.training.mixed`). A model says so
    with a ``pads_exactly`` attribute (the paper's CNN, MLP and LSTM: True; the ResNets without the Scaler and
    GroupNorm); a model that does not (a plug-in, unless it declares it) is taken to depend on its width, and its
    clients are batched by width."""
    return bool(getattr(model, "pads_exactly", False))


def cost_table(name: str, widths=(0.25, 0.5, 0.75, 1.0)) -> List[dict]:
    """Params, MACs per sample and fp32 upload MB of model ``name`` at each width (the paper's Table 2); a model
    with a ``flops`` method (the ResNets: HeteroFL's counter, :mod:`hasfl_ray.models.resnet_cost`) adds FLOPs per
    sample."""
    model = build_model(name)
    specs = model.param_specs()
    rows = []
    for p in widths:
        params = sum(spec.numel(p) for spec in specs.values())
        rows.append({"p": p, "params": params, "macs": model.macs(p), "upload_mb": params * 4 / 1e6})
        if hasattr(model, "flops"):
            rows[-1]["flops"] = model.flops(p)
    return rows


def depth_cost_table(name: str, depths, widths) -> List[dict]:
    """Params, MACs and FLOPs per sample and fp32 upload MB of the depth-d sub-model at width p of model ``name``
    (built with exits, :mod:`hasfl_ray.models.depth`) for every (d, p), in the order given: the parameters it holds
    (:func:`~hasfl_ray.models.depth.depth_names`, each its width-p slice) and its training forward (every exit up to
    d, :func:`~hasfl_ray.models.depth.counted_cost`); a ValueError sentence for a depth the model lacks."""
    import torch

    full = build_model(name)
    total, specs, config = exit_depths(full), full.param_specs(), MODEL_CONFIGS[name]
    size = config.get("image_size", 32)
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    sample = torch.zeros(2, config.get("in_channels", 3), h, w)
    rows = []
    for depth in depths:
        check_depth(depth, total, f"model {name!r}")
        held = depth_names(full, depth)
        for p in widths:
            params = sum(specs[n].numel(p) for n in held)
            macs, flops = counted_cost(build_model_from(config, p, depth=depth), sample)
            rows.append({"depth": depth, "p": p, "params": params, "macs": macs, "flops": flops,
                         "upload_mb": params * 4 / 1e6})
    return rows


def resnet_cost_table(arch: str, dataset: str = "cifar10", widths=(1.0, 0.5, 0.25, 0.125, 0.0625),
                      norm: Optional[str] = None) -> List[dict]:
    """:func:`cost_table` of ResNet ``arch`` (preresnet18, resnet18, preresnet18-1112) on the inputs and classes of
    built-in image dataset ``dataset`` (cifar10: 3x32x32, 10 classes; cifar100: 100 classes), by default at HeteroFL's
    levels a-e."""
    config = MODEL_CONFIGS[dataset]
    name, model_config = resnet_config(arch, config["in_channels"], config["num_classes"], config["image_size"], norm)
    register_model(name, model_config)
    return cost_table(name, widths)


__all__ = ["CharLSTM", "DimSlice", "ImageCNN", "MLP", "MODEL_CONFIGS", "MODEL_KINDS", "MODEL_NAMES", "NORMS",
           "ParamSpec", "PreResNet1112", "PreResNet18", "RESNETS", "ResNet18", "build_model", "build_model_from",
           "cost_table", "depth_cost_table", "extract", "gate_blocks_of", "insert_", "mask", "pads_exactly", "region",
           "register_model", "resnet_config", "resnet_cost_table", "width_channels"]
