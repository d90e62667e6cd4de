"""Depth sub-models (issue 44, shape (c)): a prefix of a network's stages plus one exit classifier per depth.

A model built with ``exits=True`` (the ResNets, :class:`~hasfl_ray.models.cnn.ImageCNN`) has ``num_depths`` stages
and an exit classifier after each; the classifier after the last stage is the network's own head, so depth
``num_depths`` is the whole network. Built with ``depth=d`` it holds only the first d stages and the exits 1..d;
``forward`` gives exit d's logits and ``forward_exits`` every exit's, shallowest first (what self-distillation
reads). Every parameter belongs to the shallowest depth that needs it (``param_depths``), so a client's depth-d
sub-model at width p is the width-p slices of the parameters of depth <= d (:func:`depth_names`): it travels packed
as always, the parameters it does not hold are simply absent from its update, and the aggregation (the fused kernel,
whose entries are per (parameter, client holding it)) averages each coordinate over the clients holding it.

The ResNets' exit k < 4 is DepthFL's bottleneck classifier (Flower's ``baselines/depthfl/depthfl/resnet.py``,
``attention{k}``, ``scala{k}`` and ``middle_fc{k}``): the attention mask (a separable-conv block keeping the stage's
channels, norm, ReLU, 2x bilinear upsampling, sigmoid) multiplied into the stage's output, then one separable-conv
block (depthwise 3x3 stride 2, pointwise 1x1, norm, ReLU, depthwise 3x3, pointwise 1x1 to the next stage's channels,
norm, ReLU) per later stage, a global average pool and a linear layer (the mask's upsampling is to the stage's own
size, the source's 2x on even sizes). Built with ``exit_head="scalefl"`` (ScaleFL's runs), exit k is ScaleFL's
``Classifier`` instead (:mod:`hasfl_ray.models.depth_heads`). The CNN's exit after stage k < last is a global average
pool and a linear layer.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.nn import functional as F

from hasfl_ray.models.depth_heads import ScaleFLExit, scalefl_exit_layout
from hasfl_ray.models.resnet_cost import _sizes
from hasfl_ray.models.slicing import DimSlice, ParamSpec


def check_depth(depth: Optional[int], depths: int, what: str = "the model") -> Optional[int]:
    """``depth`` as an int in 1..``depths`` (None stays None); a ValueError sentence otherwise."""
    if depth is None:
        return None
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= depths:
        raise ValueError(f"depth is {depth!r}, which {what} lacks; expected an integer from 1 to {depths} (its "
                         f"stages)")
    return int(depth)


class SepConv(nn.Module):
    """DepthFL's bottleneck block at width p: depthwise 3x3 (stride 2), pointwise 1x1, norm, ReLU, depthwise 3x3,
    pointwise 1x1 to ``cout``, norm, ReLU; the norm's input divided by p in training (HeteroFL's Scaler) where the
    owner has one."""

    def __init__(self, owner, cin: int, cout: int):
        super().__init__()
        c, o = owner._c(cin), owner._c(cout)
        self.dw1 = nn.Conv2d(c, c, 3, stride=2, padding=1, groups=c, bias=False)
        self.pw1 = nn.Conv2d(c, c, 1, bias=False)
        self.n1 = owner._norm(c)
        self.dw2 = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.pw2 = nn.Conv2d(c, o, 1, bias=False)
        self.n2 = owner._norm(o)
        self.scale = owner._scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.n1(self.scale(self.pw1(self.dw1(x)))))
        return F.relu(self.n2(self.scale(self.pw2(self.dw2(x)))))


class ResNetExit(nn.Module):
    """The ResNets' exit after stage ``stage`` (0-based, not the last): DepthFL's attention mask (``attention{k}``:
    a :class:`SepConv` keeping the stage's channels, norm, ReLU, 2x bilinear upsampling, sigmoid) multiplied into the
    stage's output, then a :class:`SepConv` per later stage, global average pool, linear to the classes."""

    def __init__(self, owner, stage: int):
        super().__init__()
        chain = owner.stages[stage:]
        self.att = SepConv(owner, chain[0], chain[0])
        self.att_norm = owner._norm(owner._c(chain[0]))
        self.att_scale = owner._scale()
        self.seps = nn.Sequential(*(SepConv(owner, cin, cout) for cin, cout in zip(chain, chain[1:])))
        self.linear = nn.Linear(owner._c(owner.stages[-1]), owner.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = F.relu(self.att_norm(self.att_scale(self.att(x))))
        # the source's nn.Upsample(scale_factor=2, bilinear, align_corners=False): the same map onto an even size; the
        # stage's own size on odd ones (7x7 on 28x28 inputs), where the source's product would not match
        mask = torch.sigmoid(F.interpolate(mask, size=x.shape[-2:], mode="bilinear", align_corners=False))
        return self.linear(torch.flatten(F.adaptive_avg_pool2d(self.seps(mask * x), 1), 1))


class ResNetExits:
    """What a ResNet with exits adds (a mixin of the ResNets' base class, ahead of their cost model): it reads
    ``exits``, ``exit_head``, ``depth``, ``num_depths``, ``stages``, ``_arguments``, ``_stem``, ``_head`` and
    ``layer{k}``."""

    def _stages_built(self) -> range:
        return range(self.depth)

    def _add_exits(self) -> None:
        """Exits 1..min(depth, last - 1), after every other module (so a model without exits is built as always)."""
        if self.exits:
            head = ScaleFLExit if self.exit_head == "scalefl" else ResNetExit  # (hasfl_ray.models.depth_heads)
            for stage in range(min(self.depth, self.num_depths - 1)):
                self.add_module(f"exit{stage + 1}", head(self, stage))

    def forward_exits(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Every exit's logits up to the model's depth, shallowest first (the model with exits)."""
        out, logits = self._stem(x), []
        for stage in self._stages_built():
            out = getattr(self, f"layer{stage + 1}")(out)
            last = stage + 1 == self.num_depths
            logits.append(self._head(out) if last else getattr(self, f"exit{stage + 1}")(out))
        return logits

    def deepest_exit(self, x: torch.Tensor) -> torch.Tensor:
        """The deepest exit's logits alone (``forward``; the earlier exits are not computed)."""
        out = self._stem(x)
        for stage in self._stages_built():
            out = getattr(self, f"layer{stage + 1}")(out)
        return self._head(out) if self.depth == self.num_depths else getattr(self, f"exit{self.depth}")(out)

    def param_depths(self) -> Dict[str, int]:
        """Parameter name -> the shallowest depth holding it (hasfl_ray.models.depth)."""
        return {name: resnet_param_depth(name, self.num_depths) for name in self.param_specs()}

    def _with_exits(self, layout):
        """``layout`` (the backbone's rows) with the exits' rows, cut to the model's depth."""
        if not self.exits:
            return layout
        rows = scalefl_exit_layout if self.exit_head == "scalefl" else resnet_exit_layout
        for stage in range(self.num_depths - 1):
            layout += rows(self.stages, stage)
        return [row for row in layout if resnet_param_depth(row[0], self.num_depths) <= self.depth]

    def macs(self, p: float) -> int:
        if not self.exits:
            return super().macs(p)
        return self._counted(p)[0]

    def flops(self, p: float) -> int:
        if not self.exits:
            return super().flops(p)
        return self._counted(p)[1]

    def _counted(self, p: float) -> Tuple[int, int]:
        """(MACs, FLOPs) per sample of the width-p network with exits, every exit up to its depth counted."""
        h, w = _sizes(self.image_size)
        return counted_cost(type(self)(**{**self._arguments, "width": p}), torch.zeros(2, self.in_channels, h, w))


def resnet_exit_layout(stages: Sequence[int], stage: int) -> List[Tuple[str, str, Optional[int], Optional[int], int]]:
    """The ResNets' ``_layout`` rows of exit ``stage + 1``'s parameters (kind ``dwconv`` a depthwise conv)."""
    chain = list(stages[stage:])
    prefix = f"exit{stage + 1}"
    rows = sep_layout(f"{prefix}.att", chain[0], chain[0]) + [(f"{prefix}.att_norm", "norm", chain[0], None, 0)]
    for j, (cin, cout) in enumerate(zip(chain, chain[1:])):
        rows += sep_layout(f"{prefix}.seps.{j}", cin, cout)
    return rows + [(f"{prefix}.linear", "linear", None, stages[-1], 0)]


def sep_layout(sep: str, cin: int, cout: int) -> List[Tuple[str, str, Optional[int], Optional[int], int]]:
    """The ``_layout`` rows of a :class:`SepConv` named ``sep``."""
    return [(f"{sep}.dw1", "dwconv", cin, None, 3), (f"{sep}.pw1", "conv", cin, cin, 1),
            (f"{sep}.n1", "norm", cin, None, 0), (f"{sep}.dw2", "dwconv", cin, None, 3),
            (f"{sep}.pw2", "conv", cout, cin, 1), (f"{sep}.n2", "norm", cout, None, 0)]


def dwconv_spec(name: str, channels: int, kernel: int) -> ParamSpec:
    """A depthwise conv's weight (channels, 1, k, k): only dim 0 shrinks with width."""
    return ParamSpec(name, (DimSlice(channels), DimSlice(1, False), DimSlice(kernel, False), DimSlice(kernel, False)))


def resnet_param_depth(name: str, stages: int) -> int:
    """The shallowest depth (1-based) of a ResNet with exits that holds parameter ``name``."""
    head = name.split(".", 1)[0]
    if head.startswith("layer"):
        return int(head[len("layer"):])
    if head.startswith("exit"):
        return int(head[len("exit"):])
    if head in ("conv1", "n1"):
        return 1
    return stages  # n4, linear: the last stage's own head


def depth_names(model: nn.Module, depth: Optional[int], names=None) -> List[str]:
    """The parameters (of ``names``, default the model's specs, in their order) a depth-``depth`` sub-model holds
    (every one where depth is None)."""
    names = list(model.param_specs()) if names is None else list(names)
    if depth is None:
        return names
    depths = model.param_depths()
    return [name for name in names if depths[name] <= depth]


def ensemble(outputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The mean of the exits' logits (DepthFL's evaluation: ``test`` in Flower's ``baselines/depthfl/depthfl/
    models.py``; :mod:`hasfl_ray.algorithms.league.depthfl` re-exports it)."""
    return torch.stack(list(outputs), dim=2).sum(dim=2) / len(outputs)


def exit_depths(model: nn.Module) -> int:
    """How many depths a model offers (its ``num_depths``; 0 without exits)."""
    return int(getattr(model, "num_depths", 0) or 0) if getattr(model, "exits", False) else 0


_COUNTED = (nn.Conv2d, nn.Linear, nn.BatchNorm2d)


@torch.no_grad()
def counted_cost(model: nn.Module, sample: torch.Tensor) -> Tuple[int, int]:
    """(MACs, FLOPs) per sample of every exit of ``model`` (its ``forward_exits`` on ``sample``, a batch of at least
    two, in training mode as HeteroFL's counter runs): a conv's MACs its weight's elements times its output positions, a
    linear layer's its weight's elements; FLOPs as HeteroFL's counter (docs/models.md#costs): the convs' MACs, the
    linear layers' twice, 4 per element an affine BatchNorm normalises."""
    macs = flops = 0

    def hook(module, inputs, output):
        nonlocal macs, flops
        if isinstance(module, nn.Conv2d):
            count = module.weight.numel() * output.shape[2] * output.shape[3]
            macs, flops = macs + count, flops + count
        elif isinstance(module, nn.Linear):
            macs, flops = macs + module.weight.numel(), flops + 2 * module.weight.numel()
        elif module.affine:
            flops += 4 * inputs[0][0].numel()

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, _COUNTED)]
    was = model.training
    model.train()
    try:
        model.forward_exits(sample) if getattr(model, "exits", False) else model(sample)
    finally:
        model.train(was)
        for handle in handles:
            handle.remove()
    return macs, flops


__all__ = ["ResNetExit", "ResNetExits", "SepConv", "check_depth", "counted_cost", "depth_names", "ensemble",
           "dwconv_spec", "exit_depths", "resnet_exit_layout", "resnet_param_depth", "sep_layout"]
