"""A small MLP for FedProx's Synthetic(alpha, beta) data; hidden widths slice like the CNN's."""

from __future__ import annotations

from typing import Dict, Sequence

import torch
from torch import nn

from hasfl_ray.models.slicing import DimSlice, ParamSpec, width_channels


class MLP(nn.Module):
    """Input -> hidden layers (ReLU) -> classes; every hidden width is ceil(p * w)."""

    #: Zero-padded hidden units stay 0 (:func:`hasfl_ray.models.pads_exactly`).
    pads_exactly = True

    def __init__(self, in_features: int = 60, num_classes: int = 10, hidden: Sequence[int] = (128, 128),
                 width: float = 1.0):
        super().__init__()
        self.in_features, self.num_classes, self.hidden, self.width = in_features, num_classes, list(hidden), width
        sizes = [in_features] + [width_channels(width, h) for h in hidden] + [num_classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)

    def param_specs(self) -> Dict[str, ParamSpec]:
        """Slice descriptions of every trainable parameter, at full width."""
        full = [DimSlice(self.in_features, False)] + [DimSlice(h) for h in self.hidden] + \
               [DimSlice(self.num_classes, False)]
        specs = {}
        for i, (a, b) in enumerate(zip(full[:-1], full[1:])):
            specs[f"layers.{i}.weight"] = ParamSpec(f"layers.{i}.weight", (b, a))
            specs[f"layers.{i}.bias"] = ParamSpec(f"layers.{i}.bias", (b,))
        return specs

    def macs(self, p: float) -> int:
        sizes = [self.in_features] + [width_channels(p, h) for h in self.hidden] + [self.num_classes]
        return sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
