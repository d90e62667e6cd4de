"""The initial network of HeteroFL's pre-activation ResNets (``preresnet18``, ``preresnet18-1112``) as the sources draw
it, re-implemented here from their rule, not from hasfl_ray's modules.

The sources: HeteroFL ``src/models/resnet.py::resnet18`` (commit cc40f3e46b0f; the [1, 1, 1, 2] network since
76e892a) builds ``ResNet(...)`` then ``model.apply(init_param)``; ``src/models/utils.py::init_param`` (since 3bc929c,
2020-08-29; FedRolex ``models/utils.py`` at 813510997e18 the same): every BatchNorm's weight 1 and bias 0, every
Linear's bias 0, everything else torch's default draw. The module order of construction (so of the draws): the stem
conv, then per block ``conv1``, ``conv2`` and, where the shape changes, ``shortcut``, then ``linear``."""

import math

import pytest
import torch
from torch import nn

from hasfl_ray.engine.participants import initial_parameters
from hasfl_ray.models import build_model, register_model
from hasfl_ray.models.resnet import PreResNet18, PreResNet1112, resnet_config


def source_initial(blocks, width, seed, classes=10):
    """{name: tensor} of HeteroFL's network at ``width`` drawn from ``seed``: torch's default draws in the sources'
    order, then ``init_param``."""
    torch.manual_seed(seed)
    hidden = [math.ceil(width * c) for c in (64, 128, 256, 512)]
    out = {"conv1.weight": nn.Conv2d(3, hidden[0], 3, padding=1, bias=False).weight}
    cin = hidden[0]
    for stage, (planes, count) in enumerate(zip(hidden, blocks)):
        for block in range(count):
            stride = 2 if stage and not block else 1
            prefix = f"layer{stage + 1}.{block}"
            out[f"{prefix}.n1.weight"], out[f"{prefix}.n1.bias"] = torch.ones(cin), torch.zeros(cin)
            out[f"{prefix}.conv1.weight"] = nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False).weight
            out[f"{prefix}.n2.weight"], out[f"{prefix}.n2.bias"] = torch.ones(planes), torch.zeros(planes)
            out[f"{prefix}.conv2.weight"] = nn.Conv2d(planes, planes, 3, padding=1, bias=False).weight
            if stride != 1 or cin != planes:
                out[f"{prefix}.shortcut.weight"] = nn.Conv2d(cin, planes, 1, stride=stride, bias=False).weight
            cin = planes
    out["n4.weight"], out["n4.bias"] = torch.ones(cin), torch.zeros(cin)
    linear = nn.Linear(cin, classes)
    out["linear.weight"], out["linear.bias"] = linear.weight, torch.zeros(classes)  # init_param: bias 0
    return {name: value.detach() for name, value in out.items()}


@pytest.mark.parametrize("cls, blocks", [(PreResNet18, (2, 2, 2, 2)), (PreResNet1112, (1, 1, 1, 2))])
@pytest.mark.parametrize("width", [1.0, 0.5, 0.0625])
def test_a_seed_draws_the_sources_initial_network(cls, blocks, width):
    expected = source_initial(blocks, width, seed=11)
    torch.manual_seed(11)
    ours = {name: p.detach() for name, p in cls(width=width).named_parameters()}
    assert list(ours) == list(expected)
    for name, value in expected.items():
        assert torch.equal(ours[name], value), name


def test_the_runs_initial_network_starts_its_classifier_bias_at_zero():
    """w^(0) of a run (the engine's ``initial_parameters``), the pack's network and a row's narrower global model."""
    for global_width in (1.0, 0.5):
        name, config = resnet_config("preresnet18-1112", 3, 10, 32, global_width=global_width)
        register_model(name, config)
        initial = initial_parameters(name, seed=42)
        assert torch.count_nonzero(initial["linear.bias"]) == 0
        assert torch.count_nonzero(initial["linear.weight"]) == initial["linear.weight"].numel()
        assert build_model(name).linear.bias.abs().sum() == 0
