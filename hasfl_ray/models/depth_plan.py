"""Which depth sub-model each client trains (``sub_model: depth`` or ``width_depth``, docs/models.md#depth-sub-models).

A run with ``sub_model: depth`` trains the model with exits (:mod:`hasfl_ray.models.depth`); a client the algorithm
allocates width p trains the depth of p on the run's ladder (``depths``, one per ladder width; without it ceil(p x
the model's stages), so the paper's tiers 0.25/0.5/0.75/1 on a ResNet's four stages give DepthFL's depths 1/2/3/4)
at full width (``depth``, DepthFL), or at width p too (``width_depth``, width and depth scaled together as ScaleFL
scales them). A width between two ladder widths takes the depth of the next one up. ``sub_model: width`` (the
default) has no plan: every client trains its width-p slice of the whole network, as every run before."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

from hasfl_ray.errors import ConfigError
from hasfl_ray.federation import ladder_of
from hasfl_ray.models import build_model
from hasfl_ray.models.depth import exit_depths

SUB_MODELS = ("width", "depth", "width_depth")


@dataclass(frozen=True)
class DepthPlan:
    """The ladder's widths (ascending), the depth of each, the model's depths, and whether width scales too."""

    widths: Tuple[float, ...]
    depths: Tuple[int, ...]
    num_depths: int
    scale_width: bool

    def depth_of(self, width: float) -> int:
        """The depth of allocated width ``width``: that of the least ladder width >= it (the deepest above all)."""
        for w, d in zip(self.widths, self.depths):
            if width <= w + 1e-12:
                return d
        return self.depths[-1]

    def shape(self, width: float) -> Tuple[float, int]:
        """(width trained, depth) of a client allocated ``width``."""
        return (float(width) if self.scale_width else 1.0), self.depth_of(width)


def depth_plan(config, model_name: str, depths_option: Optional[str] = None) -> Optional[DepthPlan]:
    """The run's :class:`DepthPlan` (None with ``sub_model: width``); one ConfigError sentence where the model has no
    exits or ``depths`` names a depth the model lacks (naming ``depths_option``, the algorithm option the algorithm
    set ``depths`` from, where it is given: ScaleFL's ``scalefl_exits``)."""
    if effective_sub_model(config) == "width":
        return None
    total = exit_depths(build_model(model_name))
    if not total:
        raise ConfigError(f"sub_model is {effective_sub_model(config)!r} but model {model_name!r} has no exits; "
                          "expected a ResNet (model preresnet18, resnet18) or a dataset's image CNN (digits, emnist, "
                          "cifar10, cifar100)")
    depths = config.depths
    bad = [d for d in depths or () if not 1 <= d <= total]
    if bad:
        given = (getattr(config, "algorithm_options", None) or {}).get(depths_option) if depths_option else None
        named = f"depths is {list(depths)!r}" if given in (None, "auto") else \
            f"{depths_option} is {given!r} (the depths {list(depths)!r})"
        raise ConfigError(f"{named} but model {model_name!r} has {total} depths (one a stage); expected each from 1 "
                          f"to {total}")
    widths, depths = ladder_depths(ladder_of(config).widths, depths, total)
    return DepthPlan(widths, depths, total, effective_sub_model(config) == "width_depth")


def ladder_depths(widths, depths, total: int) -> Tuple[Tuple[float, ...], Tuple[int, ...]]:
    """The ladder's widths ascending, each with its depth: ``depths`` one per width in the order ``widths`` gives
    them (a run's ``widths`` and ``depths``, ``cost --widths --depths``), or without them ceil(w x ``total``) (the
    model's stages). What a run trains and what ``hasfl-ray cost`` prices pair them here, once."""
    if depths is None:
        depths = [max(1, min(total, math.ceil(round(w * total, 9)))) for w in widths]
    pairs = sorted(zip(widths, depths))
    return tuple(w for w, _ in pairs), tuple(d for _, d in pairs)


def implied_sub_model(config) -> Optional[str]:
    """The sub_model a built-in algorithm sets itself (``implied_sub_model`` of its class: depthfl's depth, scalefl's
    width_depth), so that ``depths`` may come without ``sub_model``; None for every other algorithm (a plug-in's file
    is not imported here)."""
    from hasfl_ray import registry  # registered() imports the built-ins

    name = config.algorithm
    if not isinstance(name, str) or name not in registry.registered("algorithm"):
        return None
    return getattr(registry.lookup("algorithm", name), "implied_sub_model", None)


def exit_head(config) -> str:
    """The exit heads of the ResNet a run builds with exits (:mod:`hasfl_ray.models.depth_heads`): the built-in
    algorithm's choice (its class's ``exit_head(algorithm_options)``: ScaleFL's ``scalefl_exit_head``), else
    DepthFL's, as every other run (a plug-in's file is not imported here)."""
    from hasfl_ray import registry

    name = config.algorithm
    if not isinstance(name, str) or name not in registry.registered("algorithm"):
        return "depthfl"
    chosen = getattr(registry.lookup("algorithm", name), "exit_head", None)
    return chosen(getattr(config, "algorithm_options", None) or {}) if chosen is not None else "depthfl"


def effective_sub_model(config) -> str:
    """The sub_model a run trains: the one given, else the one the built-in algorithm sets (:func:`implied_sub_model`),
    else width (``sub_model`` None is "not given", so a given width is told from the default; RunConfig.resolved)."""
    given = getattr(config, "sub_model", None)
    return given if given is not None else implied_sub_model(config) or "width"


def check_sub_model_keys(config, bad) -> None:
    """Validate sub_model and depths (a comma list from the command line becomes a list of integers): depths only
    with a depth sub-model, one positive integer per ladder width. Whether the model has those depths is
    :func:`depth_plan`'s check, once the model is known."""
    if config.sub_model is not None and config.sub_model not in SUB_MODELS:
        raise bad("sub_model", config.sub_model, "width (the default: width-p slices), depth (DepthFL's depth "
                                                 "sub-models) or width_depth (width and depth, ScaleFL's)")
    sub_model = effective_sub_model(config)
    if sub_model != "width" and getattr(config, "classifier_aggregation", "all") == "label_split":
        raise ConfigError(f"classifier_aggregation is 'label_split' but sub_model is {sub_model!r}"
                          + ("" if config.sub_model else f" (set by algorithm {config.algorithm})")
                          + "; expected classifier_aggregation all with depth sub-models (their exits are several "
                            "classifiers)")
    depths = config.depths
    if depths is None:
        return
    if isinstance(depths, str):
        try:
            depths = [int(part) for part in depths.split(",")]
        except ValueError:
            raise bad("depths", config.depths, "a comma list of positive integers, one depth per ladder width") \
                from None
    widths = ladder_of(config).widths
    if not isinstance(depths, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                                        for d in depths) or len(depths) != len(widths):
        raise bad("depths", depths, f"{len(widths)} positive integers, one depth per ladder width "
                                    f"({', '.join(f'{w:g}' for w in widths)})")
    if effective_sub_model(config) == "width":
        raise ConfigError(f"depths is {list(depths)!r} but sub_model is 'width'; expected depths only with sub_model "
                          "depth or width_depth")
    object.__setattr__(config, "depths", list(depths))


__all__ = ["DepthPlan", "SUB_MODELS", "check_sub_model_keys", "depth_plan", "effective_sub_model", "exit_head",
           "implied_sub_model", "ladder_depths"]
