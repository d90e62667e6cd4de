"""ScaleFL's exit heads on the ResNets (hasfl_ray.models.depth_heads): the source's ``Classifier`` restated and
compared on the same weights, its ``_layout`` rows (slicing, depths, costs), and the choice a run's options make."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hasfl_ray.config import RunConfig
from hasfl_ray.models import extract
from hasfl_ray.models.depth import ResNetExit, depth_names
from hasfl_ray.models.depth_heads import ScaleFLExit, with_exit_heads
from hasfl_ray.models.depth_plan import exit_head
from hasfl_ray.models.resnet import PreResNet18, ResNet18, resnet_config

#: Whole at widths 1 and 1/2, so the source's int(C x scale) and the slicer's ceil(p x C) keep the same channels.
STAGES = (16, 32, 64, 128)
ARCHS = {"preresnet18": PreResNet18, "resnet18": ResNet18}


def source_classifier(x, head, scale):
    """git-disl/scale-fl c2084e461cef83751b99a958198aced66c1d7d7c, ``models/resnet.py::Classifier(in_planes,
    num_classes, num_conv_layers=3, reduction=1, scale)``, restated: ``layers`` is 3 x (``conv3x3(in_planes,
    in_planes)``: 3x3, stride 1, padding 1, no bias; ``Scaler(scale)`` where scale < 1, else Identity
    (``models/model_utils.py``: input / rate); ``BatchNorm2d(in_planes, track_running_stats=False)``; ReLU), then
    ``AdaptiveAvgPool2d((1, 1))`` and ``Flatten``; ``fc`` is ``Linear(in_planes, num_classes)``. The weights are
    ``head``'s (conv{j}, n{j}, linear)."""
    for j in (1, 2, 3):
        x = F.conv2d(x, getattr(head, f"conv{j}").weight, stride=1, padding=1)
        x = x / scale if scale < 1 else x
        norm = getattr(head, f"n{j}")
        x = F.relu(F.batch_norm(x, None, None, norm.weight, norm.bias, training=True, momentum=0.0, eps=1e-5))
    return F.linear(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1), head.linear.weight, head.linear.bias)


def randomised(model):
    """``model`` with every norm's weight and bias drawn too (the defaults 1 and 0 would hide a swapped pair)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".n" in name:
                param.copy_(torch.randn_like(param))
    return model


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("width", [1.0, 0.5])
def test_each_exit_is_the_sources_classifier_on_the_stages_output(arch, width):
    """Exit k < 4 reads stage k's output and computes the source's Classifier at the model's width (in_planes the
    stage's scaled channels; the Scaler dividing by the width, in training, where the source's runs), with the
    model's ``bn`` (batch statistics, the source's ``track_running_stats=False``) and its Scaler."""
    torch.manual_seed(4)
    model = randomised(ARCHS[arch](stages=STAGES, exits=True, exit_head="scalefl", norm="bn", width=width))
    model.train()
    x = torch.randn(3, 3, 32, 32)
    out, logits = model._stem(x), model.forward_exits(x)
    for k in (1, 2, 3):
        out = getattr(model, f"layer{k}")(out)
        head = getattr(model, f"exit{k}")
        c = int(STAGES[k - 1] * width)
        assert isinstance(head, ScaleFLExit) and out.shape[1] == c
        shapes = [tuple(p.shape) for _, p in head.named_parameters()]
        assert shapes == [(c, c, 3, 3)] * 3 + [(c,)] * 6 + [(10, c), (10,)]
        assert torch.allclose(logits[k - 1], source_classifier(out, head, width), rtol=1e-5, atol=1e-6)
        alone = torch.randn(2, c, 8, 8)
        assert torch.allclose(head(alone), source_classifier(alone, head, width), rtol=1e-5, atol=1e-6)


def test_a_head_draws_its_weights_in_the_sources_order():
    """The source builds its three convs, then its norms, then ``fc``: one seed gives the same weights."""
    owner = PreResNet18(stages=STAGES, norm="bn", width=0.5)
    torch.manual_seed(11)
    convs = [nn.Conv2d(8, 8, 3, padding=1, bias=False) for _ in range(3)]
    fc = nn.Linear(8, 10)
    torch.manual_seed(11)
    head = ScaleFLExit(owner, 0)
    for j, conv in enumerate(convs, start=1):
        assert torch.equal(getattr(head, f"conv{j}").weight, conv.weight)
    assert torch.equal(head.linear.weight, fc.weight) and torch.equal(head.linear.bias, fc.bias)


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("width", [1.0, 0.5, 0.25])
def test_the_layout_rows_slice_the_heads_at_every_width_and_depth(arch, width):
    """The head's ``_layout`` rows (convs scaled in and out, norms, the linear layer's input) describe the built
    width-p depth-d model's parameters exactly, each at depth k; a depth-d model given the width-p slices of the whole
    network's parameters gives that network's first d exits."""
    full = ARCHS[arch](stages=STAGES, exits=True, exit_head="scalefl", norm="bn")
    specs, depths = full.param_specs(), full.param_depths()
    assert all(depths[n] == int(n.split(".")[0][4:]) for n in specs if n.startswith("exit"))
    norms = {f"exit1.n{j}.{field}" for j in (1, 2, 3) for field in ("weight", "bias")}
    assert {n for n in specs if n.startswith("exit1.")} == {
        *(f"exit1.conv{j}.weight" for j in (1, 2, 3)), *norms, "exit1.linear.weight", "exit1.linear.bias"}
    torch.manual_seed(2)
    global_params = {n: torch.randn(s.shape) * 0.1 for n, s in specs.items()}
    whole = ARCHS[arch](stages=STAGES, exits=True, exit_head="scalefl", norm="bn", width=width)
    with torch.no_grad():
        for name, param in whole.named_parameters():
            param.copy_(extract(global_params[name], specs[name], width))
    whole.eval()
    x = torch.randn(2, 3, 32, 32)
    expected = whole.forward_exits(x)
    for depth in (1, 2, 3, 4):
        model = ARCHS[arch](stages=STAGES, exits=True, exit_head="scalefl", norm="bn", width=width, depth=depth)
        held = dict(model.named_parameters())
        assert set(held) == set(depth_names(full, depth)) == set(model.param_specs())
        assert all(tuple(p.shape) == specs[n].sliced_shape(width) for n, p in held.items())
        with torch.no_grad():
            for name, param in held.items():
                param.copy_(extract(global_params[name], specs[name], width))
        model.eval()
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(model.forward_exits(x), expected[:depth]))


@pytest.mark.parametrize("width", [1.0, 0.5])
def test_the_cost_model_counts_each_head(width):
    """MACs and FLOPs per sample with ScaleFL's heads: the network's own plus, per exit k at c = ceil(p x C_k)
    channels on an h x w map, three 3x3 convs (9 c^2 h w MACs each), three affine norms (4 c h w FLOPs each) and
    the linear layer (10 c MACs, twice that in FLOPs)."""
    plain = PreResNet18(stages=STAGES, norm="bn")
    model = PreResNet18(stages=STAGES, norm="bn", exits=True, exit_head="scalefl")
    heads = [(int(c * width), side * side) for c, side in zip(STAGES, (32, 16, 8))]
    assert model.macs(width) == plain.macs(width) + sum(3 * 9 * c * c * hw + 10 * c for c, hw in heads)
    assert model.flops(width) == plain.flops(width) + sum(3 * 9 * c * c * hw + 3 * 4 * c * hw + 2 * 10 * c
                                                          for c, hw in heads)


def test_depthfls_heads_stay_the_default_and_a_bad_head_is_one_sentence():
    assert isinstance(PreResNet18(stages=STAGES, exits=True).exit1, ResNetExit)
    name, config = resnet_config("preresnet18", 1, 10, 8)
    assert with_exit_heads(name, config) == (f"{name[:-1]},exits]", {**config, "exits": True})
    assert with_exit_heads(name, config, "scalefl") == (f"{name[:-1]},exits,scalefl heads]",
                                                        {**config, "exits": True, "exit_head": "scalefl"})
    with pytest.raises(ValueError, match=r"^exit_head is 'scale'; expected one of depthfl, scalefl \(DepthFL's"):
        PreResNet18(exits=True, exit_head="scale")


@pytest.mark.parametrize("keys, head", [
    (dict(algorithm="scalefl"), "scalefl"),
    (dict(algorithm="scalefl", algorithm_options={"scalefl_exit_head": "depthfl"}), "depthfl"),
    (dict(algorithm="depthfl"), "depthfl"),
    (dict(algorithm="heterofl", sub_model="width_depth"), "depthfl"),
])
def test_a_run_builds_the_heads_its_algorithm_chooses(keys, head):
    """ScaleFL's runs build the source's heads unless ``scalefl_exit_head: depthfl``; DepthFL's and every other
    depth run DepthFL's."""
    assert exit_head(RunConfig(dataset="digits", model="preresnet18", **keys)) == head
