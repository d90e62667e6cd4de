"""Plug-in models of the bring-your-own-model tests (docs/plugins.md#models): ones that slice, and one of each kind
that cannot be sliced."""

import math
from pathlib import Path

from torch import nn

from hasfl_ray.data.digits import DigitsDataset
from hasfl_ray.models import width_channels

VIT_FILE = str(Path(__file__).resolve().parents[2] / "examples" / "tiny_vit.py")


def make_mlp(width: float = 1.0, in_features: int = 64, num_classes: int = 10, hidden: int = 24):
    """A factory function (no class): flattened 8x8 digits -> hidden -> classes."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, width_channels(width, hidden)), nn.ReLU(),
                         nn.Linear(width_channels(width, hidden), num_classes))


class GatedRNN(nn.Module):
    """An nn.GRU (3 gate blocks, found by its type) on the rows of an 8x8 digit."""

    def __init__(self, width: float = 1.0, num_classes: int = 10, hidden: int = 12):
        super().__init__()
        self.gru = nn.GRU(8, width_channels(width, hidden), batch_first=True)
        self.fc = nn.Linear(width_channels(width, hidden), num_classes)

    def forward(self, x):
        out, _ = self.gru(x.flatten(1, 2).view(x.shape[0], 8, 8))
        return self.fc(out[:, -1])


class NoWidth(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.fc = nn.Linear(64, num_classes)


class NeedsDepth(nn.Module):
    def __init__(self, depth: int, width: float = 1.0):
        super().__init__()
        self.fc = nn.Linear(64, depth)


class FailsBelowOne(nn.Module):
    def __init__(self, width: float = 1.0):
        super().__init__()
        if width < 1:
            raise RuntimeError("only full width is implemented")
        self.fc = nn.Linear(64, 10)


class FloorWidth(nn.Module):
    """Rounds p * c down: 7 of 20 units at p = 0.37, where hasfl-ray slices ceil(0.37 * 20) = 8."""

    def __init__(self, width: float = 1.0):
        super().__init__()
        units = max(1, math.floor(width * 20))
        self.fc1, self.fc2 = nn.Linear(64, units), nn.Linear(units, 10)


class ExtraAtFullWidth(nn.Module):
    def __init__(self, width: float = 1.0):
        super().__init__()
        self.fc = nn.Linear(64, width_channels(width, 16))
        if width == 1.0:
            self.extra = nn.Linear(16, 10)


class RunningStats(nn.Module):
    def __init__(self, width: float = 1.0):
        super().__init__()
        self.fc, self.bn = nn.Linear(64, width_channels(width, 16)), nn.BatchNorm1d(width_channels(width, 16))


class WrongOwnSpec(nn.Module):
    """Its own param_specs says the weight does not slice, but it does."""

    def __init__(self, width: float = 1.0):
        super().__init__()
        self.fc = nn.Linear(64, width_channels(width, 16))

    def param_specs(self):
        from hasfl_ray.models import DimSlice, ParamSpec

        return {"fc.weight": ParamSpec("fc.weight", (DimSlice(16, False), DimSlice(64, False))),
                "fc.bias": ParamSpec("fc.bias", (DimSlice(16),))}


class BadBlocks(nn.Module):
    """Declares 3 blocks on a weight whose rows are 5 * ceil(p * 4)."""

    slice_blocks = {"fc.weight": 3}

    def __init__(self, width: float = 1.0):
        super().__init__()
        self.fc = nn.Linear(64, 5 * width_channels(width, 4))


class NotAModel:
    def __init__(self, width: float = 1.0):
        self.width = width


def returns_a_number(width: float = 1.0):
    return 3


class VitDigits(DigitsDataset):
    """The digits, training the example ViT that the dataset plug-in itself names in its model_config."""

    model = "digits-tiny-vit"
    model_config = dict(kind=f"{VIT_FILE}:TinyViT", in_channels=1, image_size=8, num_classes=10, patch=2,
                        heads=2, head_dim=4, depth=1)

    def load(self, config):
        dataset = super().load(config)
        dataset.model = self.model  # the loader names the digits CNN
        return dataset
