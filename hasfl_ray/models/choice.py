"""The model a run trains, chosen at run time (``--model``): a dataset's own, or a width-sliced ResNet on its images.
Apart from :mod:`hasfl_ray.models.resnet` (which the model registry imports) because it registers the chosen
network."""

from __future__ import annotations

import copy
from typing import Optional

from hasfl_ray.errors import ConfigError
from hasfl_ray.federation import global_width_of
from hasfl_ray.models import MODEL_CONFIGS, build_model, register_model
from hasfl_ray.models.plugin import (accepted_arguments, check_width, dataset_arguments, is_plugin_kind,
                                     load_factory, model_name, plugin_config)
from hasfl_ray.models.depth_heads import with_exit_heads
from hasfl_ray.models.depth_plan import effective_sub_model, exit_head
from hasfl_ray.models.resnet import StaticBatchNorm2d, image_shape, resnet_config
from hasfl_ray.registry import is_spec


def model_dataset(dataset, config, label: str):
    """The dataset a run trains on as its model needs it (the Engine's step after loading): with ``config.model``,
    :func:`use_resnet`, or :func:`use_plugin_model` for a spec; a dataset plug-in whose own ``model_config`` names a
    plug-in model gets :func:`use_plugin_model` too, and one with ``norm: sbn`` a shallow copy whose
    :meth:`test_view` keeps the training data; anything else unchanged."""
    if config.model is not None and is_spec(config.model):
        return use_plugin_model(dataset, config.model, label)
    exits = effective_sub_model(config) != "width"  # depth sub-models: the model with exits
    if config.model is not None:
        return use_resnet(dataset, config.model, config.model_norm, config.model_scaler, label,
                          global_width_of(config.global_width, config.widths, config.width_mix), exits,
                          exit_head(config))
    if exits:
        dataset = with_exits(dataset)
    own = dict(dataset.model_config or {})
    if is_plugin_kind(own.get("kind")):
        kind = own.pop("kind")
        return use_plugin_model(dataset, kind, label, own, dataset.model)
    if (dataset.model_config or {}).get("norm") == "sbn" and not dataset.view_keeps_train:
        dataset = copy.copy(dataset)
        dataset.view_keeps_train = True
    return dataset


def with_exits(dataset):
    """A shallow copy of ``dataset`` whose image CNN has exits (``NAME+exits``, :mod:`hasfl_ray.models.depth`); the
    dataset itself where its model is no image CNN (the run's depth plan then refuses it in one sentence)."""
    own = dict(dataset.model_config or MODEL_CONFIGS.get(dataset.model) or {})
    if own.get("kind") != "cnn":
        return dataset
    adopted = copy.copy(dataset)
    adopted.model, adopted.model_config = f"{dataset.model}+exits", {**own, "exits": True}
    register_model(adopted.model, adopted.model_config)
    return adopted


def use_resnet(dataset, arch: str, norm: Optional[str], scaler: Optional[str], label: str,
               global_width: float = 1.0, exits: bool = False, head: str = "depthfl"):
    """A shallow copy of ``dataset`` (a FederatedDataset) that trains ResNet ``arch`` instead of its own model: its
    ``model`` and ``model_config`` name the network (:func:`resnet_config`, built from the dataset's input shape and
    classes), which every trainer and the server register from the dataset they are given; with ``sbn`` its
    :meth:`test_view` keeps the training data for the server's statistics pass. ``scaler``: on, off or None (on).
    ``global_width`` < 1: the narrower global network of HeteroFL's rows b, c, d, e (:func:`resnet_config`).
    ``exits``: built with exits, whose heads are ``head`` (:mod:`hasfl_ray.models.depth_heads`; ScaleFL's own in its
    runs, :func:`~hasfl_ray.models.depth_plan.exit_head`). A ConfigError sentence where the dataset's inputs are not
    1- or 3-channel images."""
    try:
        channels, size = image_shape(dataset)
    except ValueError as error:
        raise ConfigError(f"model is {arch!r} but dataset {label!r} is not an image dataset: {error}") from None
    name, config = resnet_config(arch, channels, dataset.num_classes, size, norm,
                                 None if scaler is None else scaler == "on", global_width)
    if exits:  # depth sub-models (hasfl_ray.models.depth)
        name, config = with_exit_heads(name, config, head)
    adopted = copy.copy(dataset)
    adopted.model, adopted.model_config = name, config
    adopted.view_keeps_train = config["norm"] == "sbn"
    register_model(name, config)
    return adopted


def use_plugin_model(dataset, kind, label: str, arguments=None, name=None):
    """A shallow copy of ``dataset`` that trains plug-in model ``kind`` (a ``FILE.py:Class`` / ``MODULE:Class`` spec
    or the class; docs/plugins.md#models), registered under ``name`` (default: the spec and the dataset's input
    shape and classes). Its ``model_config`` carries the class itself, so that Ray actors, given the dataset, build
    it without importing it (a file's module goes by value). ``arguments``: the constructor's (a dataset plug-in's
    ``model_config``); default, those of :data:`~hasfl_ray.models.plugin.INPUT_ARGUMENTS` its signature names. With
    static BatchNorm layers, its :meth:`test_view` keeps the training data for the server's statistics pass."""
    factory = load_factory(kind) if isinstance(kind, str) else kind
    config = plugin_config(kind, arguments)
    offered, sample = dataset_arguments(dataset)
    check_width(factory, config["spec"])
    config.update(arguments=accepted_arguments(factory, config["spec"], offered) if arguments is None else
                  dict(arguments), sample=sample)
    adopted = copy.copy(dataset)
    adopted.model = name or model_name(config["spec"], sample, dataset.num_classes)
    adopted.model_config = config
    register_model(adopted.model, config)
    adopted.view_keeps_train = dataset.view_keeps_train or any(
        isinstance(m, StaticBatchNorm2d) for m in build_model(adopted.model).modules())
    return adopted
