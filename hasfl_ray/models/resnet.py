"""Width-sliced ResNet-18s of the sub-model literature (docs/models.md), at any width p.

* :class:`PreResNet18`: HeteroFL's pre-activation ResNet-18 (Diao et al., ICLR 2021; FedRolex's code uses the same
  layout). A 3x3 stem conv to 64 channels, four stages of 64, 128, 256, 512 channels, each two pre-activation basic
  blocks (norm, ReLU, 3x3 conv, norm, ReLU, 3x3 conv, plus the shortcut), strides 1, 2, 2, 2, a 1x1 shortcut conv
  applied to the block's pre-activated input where the shape changes, then norm, ReLU, global average pool, linear.
* :class:`PreResNet1112`: HeteroFL's published network, the same with 1, 1, 1, 2 blocks in the four stages (its
  ``resnet18`` from 2020-08-28 to 2021-02-18, the network of the authors' CIFAR-10 table).
* :class:`ResNet18`: the post-activation ResNet-18 of FjORD (Horvath et al., NeurIPS 2021) with the CIFAR 3x3 stem:
  conv, norm, ReLU, then blocks of (3x3 conv, norm, ReLU, 3x3 conv, norm) plus the shortcut (identity, or 1x1 conv
  and norm where the shape changes), ReLU after the sum; global average pool, linear.

``stages`` (default 64, 128, 256, 512) are the width-1 channels of the four stages. Every hidden width is ceil(p * c)
channels (:func:`~hasfl_ray.models.slicing.width_channels`, HeteroFL's ``int(np.ceil(rate * c))``); the input
channels and the classes never scale, the classifier's input does. Convs
have no bias (HeteroFL's and FjORD's layout); the linear layer has one, which :class:`PreResNet18` (without exits)
starts at 0 as HeteroFL's and FedRolex's ``init_param`` does (the weights keep torch's default draws, in the
sources' order, so a seed gives the sources' initial network).

Normalisation (``norm``): ``sbn`` static BatchNorm (HeteroFL's sBN: batch statistics in training, no running
statistics, the evaluated model's statistics from a pass over the training data, :func:`sbn_statistics`), ``bn`` the
project's batch-statistics BatchNorm (batch statistics in training and evaluation, as the paper's CNN), ``gn``
GroupNorm of 4 groups (gcd(4, channels) where a sliced layer has fewer or indivisible channels), ``none``. The
``scaler`` divides the output of every conv that feeds a norm by p in training only (HeteroFL's Scaler).
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hasfl_ray.models.resnet_cost import ResNetCost, _halve, _sizes, _stage_plan  # noqa: F401 (importable here)
from hasfl_ray.models.sbn_pass import SBN_STREAM, training_batches  # noqa: F401 (importable here)
from hasfl_ray.models import ghost_norm
from hasfl_ray.models.ghost_norm import ghost_forward, stacked_batches
from hasfl_ray.models.depth import ResNetExits, check_depth, dwconv_spec
from hasfl_ray.models.depth_heads import check_exit_head
from hasfl_ray.models.resnet_groups import resnet_group_labels
from hasfl_ray.models.slicing import DimSlice, ParamSpec, width_channels
from hasfl_ray.models.unfilled import unfilled_memory

#: Channels of the four stages at width 1.
STAGES = (64, 128, 256, 512)
#: Basic blocks per stage (ResNet-18).
BLOCKS = (2, 2, 2, 2)
#: The normalisations a ResNet takes (docs/models.md).
NORMS = ("sbn", "bn", "gn", "none")
#: Groups of ``gn`` (HeteroFL's ``nn.GroupNorm(4, c)``).
GN_GROUPS = 4


class StaticBatchNorm2d(nn.BatchNorm2d):
    """HeteroFL's static BatchNorm: no running statistics while training (every forward normalises with its batch's
    statistics, so nothing but the affine weight and bias is trained or aggregated); :func:`sbn_statistics` gives
    the evaluated model running statistics from a pass over the training data, as HeteroFL computes them."""

    #: The sizes of the source's batches stacked in the current forward of :func:`sbn_statistics` (each normalised
    #: and counted as its own batch: :func:`~hasfl_ray.models.ghost_norm.ghost_forward`); None: a plain BatchNorm.
    ghost_sizes: Optional[List[int]] = None

    def __init__(self, channels: int):
        super().__init__(channels, momentum=None, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ghost_sizes is not None and self.training:
            return ghost_forward(self, x, self.ghost_sizes)
        return super().forward(x)


class Scaler(nn.Module):
    """HeteroFL's Scaler: ``x / rate`` in training, ``x`` in evaluation (``rate`` = the model's width p)."""

    def __init__(self, rate: float):
        super().__init__()
        self.rate = float(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.rate if self.training else x

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


def norm_layer(norm: str, channels: int) -> nn.Module:
    """The normalisation ``norm`` (one of :data:`NORMS`) of a ``channels``-channel activation."""
    if norm == "sbn":
        return StaticBatchNorm2d(channels)
    if norm == "bn":
        return nn.BatchNorm2d(channels, track_running_stats=False)
    if norm == "gn":
        return nn.GroupNorm(math.gcd(GN_GROUPS, channels), channels)
    if norm == "none":
        return nn.Identity()
    raise ValueError(f"norm is {norm!r}; expected one of {', '.join(NORMS)}")


def _check(norm: str, width: float) -> None:
    if norm not in NORMS:
        raise ValueError(f"norm is {norm!r}; expected one of {', '.join(NORMS)}")
    width_channels(width, 1)  # (0, 1]


class _Base(ResNetExits, ResNetCost, nn.Module):
    """What the ResNets share: widths, the spec of every parameter, and the cost model
    (:class:`~hasfl_ray.models.resnet_cost.ResNetCost`).

    Subclasses list their parameters as (name, kind, out channels, in channels, kernel) entries in
    :meth:`_layout` (kind ``conv``, ``norm`` or ``linear``; channels at width 1, ``None`` for an unscaled dim) and
    build themselves from it."""

    #: Basic blocks per stage.
    blocks: Tuple[int, ...] = BLOCKS

    def __init__(self, in_channels: int, num_classes: int, image_size, norm: str, scaler: bool, width: float,
                 stages: Sequence[int] = STAGES, exits: bool = False, depth: Optional[int] = None,
                 exit_head: str = "depthfl"):
        super().__init__()
        _check(norm, width)
        if len(stages) != len(self.blocks):
            raise ValueError(f"stages is {list(stages)!r}; expected the width-1 channels of {len(self.blocks)} stages")
        self.in_channels, self.num_classes, self.image_size = int(in_channels), int(num_classes), image_size
        self.norm, self.scaler, self.width = norm, bool(scaler), float(width)
        self.stages = tuple(int(c) for c in stages)
        # depth sub-models (hasfl_ray.models.depth): an exit after every stage; built at depth d, stages 1..d only
        self.exits, self.num_depths, self.exit_head = bool(exits), len(self.stages), check_exit_head(exit_head)
        if depth is not None and not self.exits:
            raise ValueError(f"depth is {depth!r} but the model has no exits; expected depth only with exits")
        self.depth = check_depth(depth, self.num_depths) or self.num_depths
        self._arguments = dict(in_channels=in_channels, num_classes=num_classes, image_size=image_size, norm=norm,
                               scaler=scaler, stages=stages, exits=exits, depth=depth, exit_head=exit_head)

    def _c(self, channels: int) -> int:
        return width_channels(self.width, channels)

    @property
    def pads_exactly(self) -> bool:
        """Whether the width-p network is the widest one with its parameters zero-padded
        (:func:`hasfl_ray.models.pads_exactly`): not with the Scaler (it divides by the network's own p) nor with
        GroupNorm (a group's statistics, and the groups themselves, span the padded channels)."""
        return not self.scaler and self.norm != "gn"

    def _norm(self, channels: int) -> nn.Module:
        return norm_layer(self.norm, channels)

    def _scale(self) -> nn.Module:
        return Scaler(self.width) if self.scaler else nn.Identity()

    def _layout(self) -> List[Tuple[str, str, Optional[int], Optional[int], int]]:
        raise NotImplementedError

    def param_specs(self) -> Dict[str, ParamSpec]:
        """Slice descriptions of every trainable parameter, at full width (norm layers: weight and bias)."""
        specs: Dict[str, ParamSpec] = {}
        for name, kind, out, cin, kernel in self._layout():
            # channel index sets' groups (hasfl_ray.models.resnet_groups): one per residual stream and block inner
            group = resnet_group_labels(name, kind, self.pre_activation, len(self.stages)) + (None,)
            if kind == "conv":
                dims = (DimSlice(out, group=group[0]), DimSlice(cin or self.in_channels, cin is not None,
                                                                group=group[1]),
                        DimSlice(kernel, False), DimSlice(kernel, False))
                specs[f"{name}.weight"] = ParamSpec(f"{name}.weight", dims)
            elif kind == "dwconv":
                specs[f"{name}.weight"] = dwconv_spec(f"{name}.weight", out, kernel)
            elif kind == "norm":
                if self.norm != "none":
                    for field in ("weight", "bias"):
                        specs[f"{name}.{field}"] = ParamSpec(f"{name}.{field}", (DimSlice(out, group=group[0]),))
            else:
                classes = DimSlice(self.num_classes, False)
                specs[f"{name}.weight"] = ParamSpec(f"{name}.weight", (classes, DimSlice(cin, group=group[1])))
                specs[f"{name}.bias"] = ParamSpec(f"{name}.bias", (classes,))
        return specs

class PreResNet18(_Base):
    """HeteroFL's pre-activation ResNet-18 at width p (module docstring). Parameter names: ``conv1``,
    ``layer{1-4}.{0,1}.{n1,conv1,n2,conv2,shortcut}``, ``n4``, ``linear``."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, image_size=32, norm: str = "sbn",
                 scaler: bool = True, width: float = 1.0, stages: Sequence[int] = STAGES, exits: bool = False,
                 depth: Optional[int] = None, exit_head: str = "depthfl"):
        super().__init__(in_channels, num_classes, image_size, norm, scaler, width, stages, exits, depth, exit_head)
        self.conv1 = nn.Conv2d(self.in_channels, self._c(self.stages[0]), 3, padding=1, bias=False)
        for stage in self._stages_built():
            self.add_module(f"layer{stage + 1}", nn.Sequential())
        for stage, _, cin, cout, stride in _stage_plan(self.stages, self.blocks):
            if stage < self.depth:
                getattr(self, f"layer{stage + 1}").append(_PreActBlock(self, cin, cout, stride))
        self.scale = self._scale()
        if self.depth == self.num_depths:
            self.n4 = norm_layer(norm, self._c(self.stages[-1]))
            self.linear = nn.Linear(self._c(self.stages[-1]), self.num_classes)
            if not self.exits:  # HeteroFL's init_param (src/models/utils.py, FedRolex's too): the bias starts at 0
                nn.init.zeros_(self.linear.bias)
        self._add_exits()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exits:
            return self.deepest_exit(x)
        out = self.conv1(x)
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = F.relu(self.n4(self.scale(out)))
        return self.linear(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv1(x)

    def _head(self, out: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.n4(self.scale(out)))
        return self.linear(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))

    def _layout(self):
        layout = [("conv1", "conv", self.stages[0], None, 3)]
        for stage, block, cin, cout, stride in _stage_plan(self.stages, self.blocks):
            prefix = f"layer{stage + 1}.{block}"
            layout += [(f"{prefix}.n1", "norm", cin, None, 0), (f"{prefix}.conv1", "conv", cout, cin, 3),
                       (f"{prefix}.n2", "norm", cout, None, 0), (f"{prefix}.conv2", "conv", cout, cout, 3)]
            if stride != 1 or cin != cout:
                layout.append((f"{prefix}.shortcut", "conv", cout, cin, 1))
        return self._with_exits(layout + [("n4", "norm", self.stages[-1], None, 0),
                                          ("linear", "linear", None, self.stages[-1], 0)])


class PreResNet1112(PreResNet18):
    """HeteroFL's published network (module docstring): :class:`PreResNet18` with one block in each of the first
    three stages and two in the last, ``Block, [1, 1, 1, 2]`` in HeteroFL's ``src/models/resnet.py``
    (``resnet18``) from 2020-08-28 to 2021-02-18. Parameter names: ``layer{1-3}.0``, ``layer4.{0,1}``."""

    blocks = (1, 1, 1, 2)


class _PreActBlock(nn.Module):
    def __init__(self, owner: _Base, cin: int, cout: int, stride: int):
        super().__init__()
        self.n1 = norm_layer(owner.norm, owner._c(cin))
        self.conv1 = nn.Conv2d(owner._c(cin), owner._c(cout), 3, stride=stride, padding=1, bias=False)
        self.n2 = norm_layer(owner.norm, owner._c(cout))
        self.conv2 = nn.Conv2d(owner._c(cout), owner._c(cout), 3, padding=1, bias=False)
        self.scale = owner._scale()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(owner._c(cin), owner._c(cout), 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.n1(self.scale(x)))
        shortcut = self.shortcut(out) if hasattr(self, "shortcut") else x
        out = self.conv2(F.relu(self.n2(self.scale(self.conv1(out)))))
        return out + shortcut


class ResNet18(_Base):
    """FjORD's post-activation ResNet-18 with the CIFAR 3x3 stem at width p (module docstring). Parameter names:
    ``conv1``, ``n1``, ``layer{1-4}.{0,1}.{conv1,n1,conv2,n2,shortcut,shortcut_norm}``, ``linear``."""

    pre_activation = False

    def __init__(self, in_channels: int = 3, num_classes: int = 10, image_size=32, norm: str = "sbn",
                 scaler: bool = True, width: float = 1.0, stages: Sequence[int] = STAGES, exits: bool = False,
                 depth: Optional[int] = None, exit_head: str = "depthfl"):
        super().__init__(in_channels, num_classes, image_size, norm, scaler, width, stages, exits, depth, exit_head)
        self.conv1 = nn.Conv2d(self.in_channels, self._c(self.stages[0]), 3, padding=1, bias=False)
        self.n1 = norm_layer(norm, self._c(self.stages[0]))
        self.scale = self._scale()
        for stage in self._stages_built():
            self.add_module(f"layer{stage + 1}", nn.Sequential())
        for stage, _, cin, cout, stride in _stage_plan(self.stages, self.blocks):
            if stage < self.depth:
                getattr(self, f"layer{stage + 1}").append(_PostActBlock(self, cin, cout, stride))
        if self.depth == self.num_depths:
            self.linear = nn.Linear(self._c(self.stages[-1]), self.num_classes)
        self._add_exits()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exits:
            return self.deepest_exit(x)
        out = F.relu(self.n1(self.scale(self.conv1(x))))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return self.linear(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.n1(self.scale(self.conv1(x))))

    def _head(self, out: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))

    def _layout(self):
        layout = [("conv1", "conv", self.stages[0], None, 3), ("n1", "norm", self.stages[0], None, 0)]
        for stage, block, cin, cout, stride in _stage_plan(self.stages, self.blocks):
            prefix = f"layer{stage + 1}.{block}"
            layout += [(f"{prefix}.conv1", "conv", cout, cin, 3), (f"{prefix}.n1", "norm", cout, None, 0),
                       (f"{prefix}.conv2", "conv", cout, cout, 3), (f"{prefix}.n2", "norm", cout, None, 0)]
            if stride != 1 or cin != cout:
                layout += [(f"{prefix}.shortcut", "conv", cout, cin, 1),
                           (f"{prefix}.shortcut_norm", "norm", cout, None, 0)]
        return self._with_exits(layout + [("linear", "linear", None, self.stages[-1], 0)])


class _PostActBlock(nn.Module):
    def __init__(self, owner: _Base, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(owner._c(cin), owner._c(cout), 3, stride=stride, padding=1, bias=False)
        self.n1 = norm_layer(owner.norm, owner._c(cout))
        self.conv2 = nn.Conv2d(owner._c(cout), owner._c(cout), 3, padding=1, bias=False)
        self.n2 = norm_layer(owner.norm, owner._c(cout))
        self.scale = owner._scale()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(owner._c(cin), owner._c(cout), 1, stride=stride, bias=False)
            self.shortcut_norm = norm_layer(owner.norm, owner._c(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.n1(self.scale(self.conv1(x))))
        out = self.n2(self.scale(self.conv2(out)))
        shortcut = self.shortcut_norm(self.scale(self.shortcut(x))) if hasattr(self, "shortcut") else x
        return F.relu(out + shortcut)


@torch.no_grad()
def sbn_statistics(model: nn.Module, batches: Iterable[Tuple[torch.Tensor, torch.Tensor]],
                   stack: Optional[int] = None) -> bool:
    """HeteroFL's sBN statistics: every :class:`StaticBatchNorm2d` of ``model`` gets running statistics from one
    pass over ``batches`` (inputs on any device), with momentum None (the cumulative average of the batches' means
    and unbiased variances), and keeps them: ``model.eval()`` then normalises with them. Called again, it starts
    over. Only the norms run in training mode during the pass (the Scaler and anything else as in evaluation, so
    the statistics are those of the activations evaluation sees: at width 1, where the Scaler divides by 1,
    exactly HeteroFL's pass). The batches run ``stack`` samples at a time (default
    :data:`~hasfl_ray.models.ghost_norm.STACK_SAMPLES`), whole batches stacked into one forward in which each norm
    runs each batch through its own BatchNorm forward (:mod:`hasfl_ray.models.ghost_norm`: the same statistics up to
    the convolutions' float rounding at another batch size; ``stack`` 1: one forward a batch). Returns False (and
    does nothing) for a model without static BatchNorm."""
    layers = [m for m in model.modules() if isinstance(m, StaticBatchNorm2d)]
    if not layers:
        return False
    first = next(model.parameters())
    device, dtype = first.device, first.dtype
    for layer in layers:
        layer.track_running_stats = True
        layer.register_buffer("running_mean", torch.zeros(layer.num_features, device=device, dtype=dtype))
        layer.register_buffer("running_var", torch.ones(layer.num_features, device=device, dtype=dtype))
        layer.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long, device=device))
    model.eval()
    for layer in layers:
        layer.train()
    seen = 0
    try:
        with unfilled_memory():
            for x, sizes in stacked_batches(batches, ghost_norm.STACK_SAMPLES if stack is None else stack):
                for layer in layers:  # one batch: the plain BatchNorm, as the source runs it
                    layer.ghost_sizes = sizes if len(sizes) > 1 else None
                model(x.to(device))
                seen += len(sizes)
    finally:
        for layer in layers:
            layer.ghost_sizes = None
    model.eval()
    if not seen:
        raise ValueError("static BatchNorm needs training data for its statistics, and none was given; expected a "
                         "dataset whose test_view keeps its training data (view_keeps_train)")
    return True


RESNETS = {"preresnet18": PreResNet18, "resnet18": ResNet18, "preresnet18-1112": PreResNet1112}


def resnet_config(arch: str, in_channels: int, num_classes: int, image_size, norm: Optional[str] = None,
                  scaler: Optional[bool] = None, global_width: float = 1.0) -> Tuple[str, dict]:
    """The model name and ``model_config`` of ResNet ``arch`` for these inputs and options (norm default sbn,
    scaler default on: HeteroFL's). ``global_width`` g < 1: the network of HeteroFL's level g as the global model,
    its stages ceil(g * c) channels (``resnet18(model_rate=global_model_rate)``, src/models/resnet.py). The name says
    everything the config does, so the same name is the same network in every process."""
    norm = "sbn" if norm is None else norm
    scaler = True if scaler is None else bool(scaler)
    size = image_size if isinstance(image_size, int) else list(image_size)
    shape = f"{size}x{size}" if isinstance(size, int) else f"{size[0]}x{size[1]}"
    name = f"{arch}[{in_channels}x{shape},{num_classes} classes,{norm},scaler {'on' if scaler else 'off'}]"
    config = dict(kind=arch, in_channels=int(in_channels), num_classes=int(num_classes), image_size=size,
                  norm=norm, scaler=scaler)
    if global_width < 1:
        config["stages"] = [width_channels(global_width, c) for c in STAGES]
        name = f"{name[:-1]},stages {'/'.join(map(str, config['stages']))}]"
    return name, config


def image_shape(dataset) -> Tuple[int, object]:
    """(channels, image size: an int when square, else [height, width]) of ``dataset``'s inputs, from one test
    sample; a ValueError sentence where its inputs are not 1- or 3-channel images."""
    x, _ = next(iter(dataset.test_batches(1)))
    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise ValueError(f"its inputs have shape {tuple(x.shape[1:])}; expected 1- or 3-channel images "
                         "(channels, height, width)")
    h, w = int(x.shape[2]), int(x.shape[3])
    return int(x.shape[1]), (h if h == w else [h, w])


__all__ = ["GN_GROUPS", "NORMS", "PreResNet1112", "PreResNet18", "RESNETS", "ResNet18", "Scaler", "StaticBatchNorm2d",
           "image_shape", "norm_layer", "resnet_config", "sbn_statistics", "training_batches"]
