"""ScaleFL (Ilhan et al., CVPR 2023) as a registered algorithm: width and depth scaled together, early exits and
self-distillation, the rules of :mod:`hasfl_ray.algorithms.league.scalefl` (transcribed from git-disl/scale-fl) wired
onto the depth sub-models of :mod:`hasfl_ray.models.depth` (``sub_model: width_depth``, set by this algorithm).

- **Levels.** Level ℓ is the ℓ-th width of the run's ladder (v_ℓ; a client's level is its capacity tier) with
  ``scalefl_exits``[ℓ] exits (h_ℓ, the source's ``--horizontal_scale_ratios``; default ``auto``, ceil(v_ℓ x
  stages) as the depth plan's default, which is the source's 1,2,3,4 on a four-stage ResNet with the four-width
  ladder, and ``--depths`` may set them then): the client trains
  the width-v_ℓ slices of the stages up to exit h_ℓ and exits 1..h_ℓ. The source assigns levels by a seeded
  permutation cut by ``--client_split_ratios`` (a client left over trains as the last level); here the capacity
  tiers (their mix, ``tier_counts``) take that role, so every client has a level of its own.
- **Width.** The source keeps int(v · C) (floor) leading channels, hasfl-ray's slicer ceil(v · C): the same wherever
  v · C is whole (the ladders 1/4, 1/2, 3/4, 1 and 1/2^k on the ResNets' 64..512 and the CNNs' channels), one channel
  more elsewhere (a documented departure, docs/algorithms.md#scalefl).
- **Exits.** On a ResNet, exit k < last is the source's ``Classifier`` (three 3x3 convs at the stage's width, each
  with the Scaler, the model's norm and ReLU, then pool and linear: :mod:`hasfl_ray.models.depth_heads`), or with
  ``scalefl_exit_head: depthfl`` DepthFL's exits; the image CNNs' exits are a pool and a linear layer either way.
- **Loss**: :func:`~hasfl_ray.algorithms.league.scalefl.exit_loss` over the client's exits, with the distillation
  term (γ = ``scalefl_kd_gamma``, T = ``scalefl_kd_temperature``) from round index > ``scalefl_kd_start`` × rounds.
- **Aggregation**: per coordinate the unweighted mean over the clients that trained it (weights 1 each; every
  tensor a client holds gets a gradient, since its loss reads every exit it holds).
- **Evaluation**: the global model's deepest exit is ``test_accuracy``; each level's sub-model (its width at its
  exit) is ``accuracy_at_width`` at v_ℓ, and a client's local accuracy is its level's.

In ``--mode async`` the round index is the server's model version (the distillation starts after
``scalefl_kd_start`` × rounds server updates).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.algorithms.league import scalefl as rules
from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import register_algorithm
from hasfl_ray.training.local import LocalObjective
from hasfl_ray.training.task import mask_logits


class ExitLossObjective(LocalObjective):
    """ScaleFL's local loss over the exits up to the client's level's exit. Trained one client at a time."""

    def __init__(self, gamma: float, temperature: float, active: bool):
        self.gamma, self.temperature, self.active = float(gamma), float(temperature), bool(active)

    def loss(self, model, x, y):
        outputs = [mask_logits(out, self.masked_labels) for out in model.forward_exits(x)]
        return rules.exit_loss(outputs, y, self.gamma, self.temperature, self.active)


def check_levels(widths: Sequence[float], exits: List[int], given: str) -> None:
    """One sentence where a wider level would exit earlier than a narrower one (ScaleFL's levels grow in width and
    depth together): ``--depths`` pair with ``widths`` in the order the ladder gives them, which need not be
    ascending (``--widths 1,0.5 --depths 1,2`` gave width 1 one exit and width 0.5 two)."""
    pairs = sorted(zip(widths, exits))
    for (narrow, shallow), (wide, deep) in zip(pairs, pairs[1:]):
        if deep < shallow:
            raise ConfigError(f"{given}, which gives width {wide:g} fewer exits ({deep}) than the narrower width "
                              f"{narrow:g} ({shallow}); expected exits non-decreasing with the width (ScaleFL's "
                              "levels; --depths pairs with --widths in its order)")


@register_algorithm("scalefl")
class ScaleFL(Algorithm):
    """ScaleFL: each client trains its tier's width up to its level's exit (module docstring)."""

    #: The sub_model it sets (``resolve_config``), so that ``--depths`` may be given without ``--sub-model``.
    implied_sub_model = "width_depth"
    #: The option it sets ``depths`` from (``resolve_config``), named where a depth the model lacks is refused.
    depths_option = "scalefl_exits"
    options_class = rules.ScaleFLOptions

    @classmethod
    def resolve_config(cls, config) -> Dict[str, Any]:
        """Width and depth sub-models (``sub_model: width_depth``) whose depths are the levels' exits."""
        from hasfl_ray.federation import ladder_of

        options = rules.ScaleFLOptions(**config.algorithm_options)
        if config.sub_model not in (None, "width_depth"):  # given (width included: None is unset), never replaced
            raise ConfigError(f"sub_model is {config.sub_model!r} but algorithm scalefl scales width and depth "
                              "together; expected sub_model width_depth (or left unset)")
        widths = ladder_of(config).widths
        if options.scalefl_exits == "auto":  # the depth plan's default: ceil(v x stages) per ladder width
            if config.depths is not None and len(config.depths) == len(widths):  # (a count is the plan's sentence)
                check_levels(widths, list(config.depths), f"depths is {list(config.depths)!r}")
            return {"sub_model": "width_depth"}
        exits = rules.parse_exits(options.scalefl_exits)
        if len(exits) != len(widths):
            raise ConfigError(f"scalefl_exits is {options.scalefl_exits!r} ({len(exits)} levels) but the width "
                              f"ladder has {len(widths)} widths ({', '.join(f'{w:g}' for w in widths)}); expected "
                              "one number of exits per ladder width, shallowest level first")
        # level l is the l-th narrowest width (shallowest level first), whatever order the ladder lists them in
        narrowest_first = sorted(range(len(widths)), key=lambda i: widths[i])
        depths = [0] * len(widths)
        for level, index in enumerate(narrowest_first):
            depths[index] = exits[level]
        if config.depths is not None and list(config.depths) != depths:
            raise ConfigError(f"depths is {config.depths!r} but scalefl_exits gives the levels' exits "
                              f"{options.scalefl_exits!r}; expected depths left unset")
        return {"sub_model": "width_depth", "depths": depths}  # (one per ladder width, in its order)

    #: The config values it always runs with, whatever is given: a value given that differs is refused
    #: (config/layers.py::_check_given_defaults); its mean counts each client once.
    fixed_config = {"aggregation_weights": ("count", "the source's average_weights")}

    @staticmethod
    def exit_head(options) -> str:
        """The ResNets' exit heads its runs build (hasfl_ray.models.depth_plan.exit_head): ScaleFL's ``Classifier``
        (``scalefl_exit_head: source``, the default) or DepthFL's (``depthfl``)."""
        return rules.EXIT_HEAD_CHOICES[options.get("scalefl_exit_head", "source")]

    def aggregation_weights(self, clients: Sequence[int]) -> List[float]:
        """1 each: ``average_weights``' unweighted mean over the clients that trained a coordinate."""
        return [1.0] * len(clients)

    def objective(self, round: int, client: int, width: float) -> LocalObjective:
        o = self.options
        return ExitLossObjective(o.scalefl_kd_gamma, o.scalefl_kd_temperature,
                                 rules.distillation_active(round, self.config.rounds, o.scalefl_kd_start))


__all__ = ["ExitLossObjective", "ScaleFL"]
