"""The paper's image CNN (3x3 convs + BatchNorm, three pooled stages, FC 512) at any width p."""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from hasfl_ray.models.depth import check_depth, counted_cost
from hasfl_ray.models.slicing import DimSlice, ParamSpec, width_channels


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` that, without autograd on a CPU, pools an NCHW input in channels-last order: the same values
    bit for bit (a maximum is exact, and both kernels visit each window in the same order), 3-4x faster on the
    large evaluation batches (the digits CNN's full-width pass over its test set: 13.2 -> 7.5 ms). Training, where
    the NCHW kernel is the faster one at small batches, is unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() and x.dim() == 4 and x.device.type == "cpu" and x.is_contiguous():
            return super().forward(x.contiguous(memory_format=torch.channels_last)).contiguous()
        return super().forward(x)


class BatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` that, without autograd on a CPU and normalising with its batch's statistics (no running
    statistics: the CNN's policy), writes its output over its input, the convolution's output just before it, which
    nothing else reads (issue 46 item 3): the same kernel (``native_batch_norm``'s out form: the statistics, then each
    element ``x * alpha + beta`` of its own channel, read before it is written) into the same layout, so the same
    bits (tests/models/test_cnn_inplace_norm.py), without a new tensor the size of every activation it normalises.
    A digits round's test passes (four widths) so touch ~1,000-1,150 fewer pages, which glibc's once-a-round
    ``malloc_trim`` (hasfl_ray/allocator.py) handed back and the next round faulted in again. Only a dense input (in
    either layout) is written over. Training (autograd
    keeps the input for the backward pass) and running statistics are ``nn.BatchNorm2d``'s own path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.device.type != "cpu" or self.running_mean is not None or x.dim() != 4 or \
                (self.weight is not None and x.dtype != self.weight.dtype) or x.requires_grad or \
                not (x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last)):
            return super().forward(x)
        saved = (x.new_empty(0), x.new_empty(0))
        torch.ops.aten.native_batch_norm.out(x, self.weight, self.bias, None, None, True, 0.0, self.eps, out=x,
                                             save_mean=saved[0], save_invstd=saved[1])
        return x


class ImageCNN(nn.Module):
    """Width-p CNN: stages of 3x3 pad-1 conv + BatchNorm + ReLU, max-pool after each stage, FC, FC.

    Every hidden width (conv channels and the FC hidden layer) is ceil(p * w); the input channels
    and the classes are never sliced. Pooling is ceil-mode so 28x28 inputs go 28 -> 14 -> 7 -> 4.

    BatchNorm policy: no running statistics (``track_running_stats=False``). Every forward pass,
    training and evaluation alike, normalises with the statistics of its own batch, so a
    sub-model never carries statistics of a different width and the full-width global model
    needs no server-side calibration pass; evaluation uses large fixed batches (see
    :mod:`hasfl_ray.training.evaluate`).

    Args:
        in_channels: image channels (3 for CIFAR-10, 1 for EMNIST and digits).
        num_classes: output classes.
        image_size: input height = width.
        stages: conv widths per pooled stage, e.g. ``[[64, 64], [128, 128], [256, 256]]``.
        fc_width: hidden FC width (512 in the paper).
        width: the sub-model width p in (0, 1].
    """

    #: The width-p network is the widest one with its parameters zero-padded (a padded channel stays 0 through
    #: conv, batch-statistics BatchNorm, ReLU and pooling), so clients of different widths can train as one
    #: padded stack (``--client-batching mixed``, :func:`hasfl_ray.models.pads_exactly`).
    pads_exactly = True

    def __init__(self, in_channels: int, num_classes: int, image_size: int,
                 stages: Sequence[Sequence[int]], fc_width: int, width: float = 1.0, exits: bool = False,
                 depth: Optional[int] = None):
        super().__init__()
        self.in_channels, self.num_classes, self.image_size = in_channels, num_classes, image_size
        self.stages = [list(s) for s in stages]
        self.fc_width, self.width = fc_width, width
        # depth sub-models (hasfl_ray.models.depth): an exit (global average pool, linear) after every stage but the
        # last, whose exit is fc1, fc2; built at depth d, the first d stages and exits 1..d only
        self.exits, self.num_depths = bool(exits), len(self.stages)
        if depth is not None and not self.exits:
            raise ValueError(f"depth is {depth!r} but the model has no exits; expected depth only with exits")
        self.depth = check_depth(depth, self.num_depths) or self.num_depths
        layers, self._ends = [], []
        cin = in_channels
        spatial = image_size
        for stage in self.stages[:self.depth]:
            for w in stage:
                cout = width_channels(width, w)
                layers += [nn.Conv2d(cin, cout, 3, padding=1), BatchNorm2d(cout, track_running_stats=False),
                           nn.ReLU(inplace=True)]
                cin = cout
            layers.append(MaxPool2d(2, ceil_mode=True))
            self._ends.append(len(layers))
            spatial = math.ceil(spatial / 2)
        self.features = nn.Sequential(*layers)
        self.spatial = spatial
        if self.depth == self.num_depths:
            self.fc1 = nn.Linear(cin * spatial * spatial, width_channels(width, fc_width))
            self.fc2 = nn.Linear(width_channels(width, fc_width), num_classes)
        for k in range(min(self.depth, self.num_depths - 1)) if self.exits else ():
            self.add_module(f"exit{k + 1}", nn.Linear(width_channels(width, self.stages[k][-1]), num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exits:  # the deepest exit alone
            x = self.features(x)
            if self.depth < self.num_depths:
                return getattr(self, f"exit{self.depth}")(x.mean(dim=(2, 3)))
            return self.fc2(torch.relu(self.fc1(x.flatten(1))))
        x = self.features(x).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))

    def forward_exits(self, x: torch.Tensor) -> List[torch.Tensor]:
        """Every exit's logits up to the model's depth, shallowest first (the model with exits)."""
        logits, start = [], 0
        for k, end in enumerate(self._ends):
            for layer in self.features[start:end]:
                x = layer(x)
            start = end
            if k + 1 < self.num_depths:
                logits.append(getattr(self, f"exit{k + 1}")(x.mean(dim=(2, 3))))
            else:
                logits.append(self.fc2(torch.relu(self.fc1(x.flatten(1)))))
        return logits

    def param_specs(self) -> Dict[str, ParamSpec]:
        """Slice descriptions of every trainable parameter, at full width."""
        specs: Dict[str, ParamSpec] = {}
        cin, scaled_in = self.in_channels, False
        index = 0
        for stage in self.stages:
            for w in stage:
                conv, bn = f"features.{index}", f"features.{index + 1}"
                specs[f"{conv}.weight"] = ParamSpec(f"{conv}.weight", (DimSlice(w), DimSlice(cin, scaled_in),
                                                                       DimSlice(3, False), DimSlice(3, False)))
                specs[f"{conv}.bias"] = ParamSpec(f"{conv}.bias", (DimSlice(w),))
                specs[f"{bn}.weight"] = ParamSpec(f"{bn}.weight", (DimSlice(w),))
                specs[f"{bn}.bias"] = ParamSpec(f"{bn}.bias", (DimSlice(w),))
                cin, scaled_in = w, True
                index += 3
            index += 1
        area = self._full_spatial() ** 2
        specs["fc1.weight"] = ParamSpec("fc1.weight", (DimSlice(self.fc_width), DimSlice(cin * area, unit=area)))
        specs["fc1.bias"] = ParamSpec("fc1.bias", (DimSlice(self.fc_width),))
        specs["fc2.weight"] = ParamSpec("fc2.weight", (DimSlice(self.num_classes, False), DimSlice(self.fc_width)))
        specs["fc2.bias"] = ParamSpec("fc2.bias", (DimSlice(self.num_classes, False),))
        for k in range(self.num_depths - 1) if self.exits else ():
            classes, channels = DimSlice(self.num_classes, False), DimSlice(self.stages[k][-1])
            specs[f"exit{k + 1}.weight"] = ParamSpec(f"exit{k + 1}.weight", (classes, channels))
            specs[f"exit{k + 1}.bias"] = ParamSpec(f"exit{k + 1}.bias", (classes,))
        if self.depth < self.num_depths:  # a depth sub-model's own parameters only
            return {name: spec for name, spec in specs.items() if self._depth_of(name) <= self.depth}
        return specs

    def _full_spatial(self) -> int:
        spatial = self.image_size
        for _ in self.stages:
            spatial = math.ceil(spatial / 2)
        return spatial

    def _depth_of(self, name: str) -> int:
        head, _, rest = name.partition(".")
        if head.startswith("exit"):
            return int(head[4:])
        if head == "features":
            index, position = int(rest.split(".")[0]), 0
            for k, stage in enumerate(self.stages):
                position += 3 * len(stage) + 1
                if index < position:
                    return k + 1
        return self.num_depths

    def param_depths(self) -> Dict[str, int]:
        """Parameter name -> the shallowest depth holding it (hasfl_ray.models.depth)."""
        return {name: self._depth_of(name) for name in self.param_specs()}

    def macs(self, p: float) -> int:
        """Multiply-accumulates per sample of the width-p network (conv and FC weights; with exits, every exit up to
        its depth, :func:`~hasfl_ray.models.depth.counted_cost`)."""
        if self.exits:
            model = ImageCNN(self.in_channels, self.num_classes, self.image_size, self.stages, self.fc_width, p, True,
                             self.depth)
            return counted_cost(model, torch.zeros(2, self.in_channels, self.image_size, self.image_size))[0]
        total, cin, spatial = 0, self.in_channels, self.image_size
        for stage in self.stages:
            for w in stage:
                cout = width_channels(p, w)
                total += cin * cout * 9 * spatial * spatial
                cin = cout
            spatial = math.ceil(spatial / 2)
        hidden = width_channels(p, self.fc_width)
        return total + cin * spatial * spatial * hidden + hidden * self.num_classes
