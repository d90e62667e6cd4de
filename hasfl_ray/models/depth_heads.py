"""The ResNets' exit heads (:mod:`hasfl_ray.models.depth`): which classifier follows stage k < last.

* ``depthfl`` (the default; DepthFL's, and every ``--sub-model depth|width_depth`` run's other than ScaleFL's):
  :class:`~hasfl_ray.models.depth.ResNetExit`, DepthFL's attention mask and separable-conv bottlenecks.
* ``scalefl`` (ScaleFL's own, the default of ``--algorithm scalefl``, ``scalefl_exit_head: source``):
  :class:`ScaleFLExit`, the ``Classifier`` of git-disl/scale-fl (commit c2084e461cef83751b99a958198aced66c1d7d7c,
  ``models/resnet.py``; ``Scaler`` and ``conv3x3`` from ``models/model_utils.py``) as ``_make_layer`` builds it for a
  ResNet of basic blocks (``reduction`` = the block's expansion, 1): three times (3x3 conv from the stage's channels
  to the same, stride 1, padding 1, no bias; the Scaler; a BatchNorm; ReLU), then a global average pool, a flatten
  and a linear layer from the stage's channels to the classes. Its ``in_planes`` is the stage's width at the model's
  scale, so the head's channels shrink with the backbone's: here ceil(p x C) (the model's own widths), its convs
  sliced in and out, its norms and the linear layer's input too. Its norms and Scaler are the model's own (``norm``,
  ``scaler``): the source's ``BatchNorm2d(track_running_stats=False)`` is ``norm: bn``; the Scaler divides by the
  width in training only, as the backbone's (HeteroFL's), where the source's divides in evaluation too, ahead of a
  norm of batch statistics that undoes the division up to its epsilon.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn import functional as F

#: The exit heads a ResNet with exits takes (``exit_head``), the default first.
EXIT_HEADS = ("depthfl", "scalefl")
#: The source's ``num_conv_layers`` (its default, which ``_make_layer`` keeps).
SCALEFL_CONVS = 3

Row = Tuple[str, str, Optional[int], Optional[int], int]


def check_exit_head(head: str) -> str:
    """``head`` if it is one of :data:`EXIT_HEADS`; a ValueError sentence otherwise."""
    if head not in EXIT_HEADS:
        raise ValueError(f"exit_head is {head!r}; expected one of {', '.join(EXIT_HEADS)} (DepthFL's bottleneck "
                         "exits or ScaleFL's Classifier)")
    return head


class ScaleFLExit(nn.Module):
    """ScaleFL's ``Classifier`` after stage ``stage`` (0-based, not the last) of ``owner`` at its width (module
    docstring): ``conv{1-3}`` (3x3, the stage's channels in and out), ``n{1-3}`` (the owner's norm), the owner's
    Scaler before each norm, then pool and ``linear``. Built in the source's order: the convs, the norms, the
    linear layer."""

    def __init__(self, owner, stage: int):
        super().__init__()
        c = owner._c(owner.stages[stage])
        for j in range(1, SCALEFL_CONVS + 1):
            self.add_module(f"conv{j}", nn.Conv2d(c, c, 3, padding=1, bias=False))
        for j in range(1, SCALEFL_CONVS + 1):
            self.add_module(f"n{j}", owner._norm(c))
        self.scale = owner._scale()
        self.linear = nn.Linear(c, owner.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for j in range(1, SCALEFL_CONVS + 1):
            x = F.relu(getattr(self, f"n{j}")(self.scale(getattr(self, f"conv{j}")(x))))
        return self.linear(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def scalefl_exit_layout(stages: Sequence[int], stage: int) -> List[Row]:
    """The ``_layout`` rows of exit ``stage + 1``'s :class:`ScaleFLExit` (in its parameters' order)."""
    prefix, c = f"exit{stage + 1}", stages[stage]
    convs = [(f"{prefix}.conv{j}", "conv", c, c, 3) for j in range(1, SCALEFL_CONVS + 1)]
    norms = [(f"{prefix}.n{j}", "norm", c, None, 0) for j in range(1, SCALEFL_CONVS + 1)]
    return convs + norms + [(f"{prefix}.linear", "linear", None, c, 0)]


def with_exit_heads(name: str, config: dict, head: str = "depthfl"):
    """(name, model_config) of ResNet ``name`` / ``config`` (:func:`~hasfl_ray.models.resnet.resnet_config`) built
    with exits whose heads are ``head``: the default's are as before (``,exits]``, no ``exit_head`` key, so a
    DepthFL run's model is unchanged), ScaleFL's say so in the name (``,exits,scalefl heads]``) and the config."""
    check_exit_head(head)
    if head == "depthfl":
        return f"{name[:-1]},exits]", {**config, "exits": True}
    return f"{name[:-1]},exits,{head} heads]", {**config, "exits": True, "exit_head": head}


__all__ = ["EXIT_HEADS", "SCALEFL_CONVS", "ScaleFLExit", "check_exit_head", "scalefl_exit_layout",
           "with_exit_heads"]
