"""Models with exits and their depth sub-models (issue 44 item 1c, hasfl_ray.models.depth)."""

from __future__ import annotations

import pytest
import torch

from hasfl_ray.config import RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import MODEL_CONFIGS, build_model_from, extract
from hasfl_ray.models.cnn import ImageCNN
from hasfl_ray.models.depth import counted_cost, depth_names
from hasfl_ray.models.depth_plan import depth_plan
from hasfl_ray.models.resnet import PreResNet18, ResNet18

SMALL = dict(stages=(4, 8, 8, 16), norm="bn")


def builders():
    return {"preresnet18": lambda **k: PreResNet18(**SMALL, **k), "resnet18": lambda **k: ResNet18(**SMALL, **k),
            "cnn": lambda **k: ImageCNN(3, 10, 16, ((6,), (8,), (8,)), 12, **k)}


@pytest.mark.parametrize("arch", ["preresnet18", "resnet18", "cnn"])
def test_without_exits_the_model_is_unchanged(arch):
    """exits=False builds the network every existing run trains: the same parameters, in the same order, drawn
    from the same seed to the same values."""
    build = builders()[arch]
    torch.manual_seed(0)
    plain = build()
    torch.manual_seed(0)
    also = build(exits=False)
    assert [(n, p.shape) for n, p in plain.named_parameters()] == [(n, p.shape) for n, p in also.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), also.parameters()))
    assert not any(name.startswith("exit") for name in plain.param_specs())


@pytest.mark.parametrize("arch", ["preresnet18", "resnet18", "cnn"])
@pytest.mark.parametrize("width", [1.0, 0.5])
def test_a_depth_sub_model_is_the_prefix_of_the_whole_network(arch, width):
    """The depth-d model at width p, given the width-p slices of the parameters of depth <= d, gives exactly the
    first d exits' logits of the whole width-p network; it holds those parameters and no other."""
    build = builders()[arch]
    full = build(exits=True)
    specs = full.param_specs()
    torch.manual_seed(1)
    global_params = {n: torch.randn(s.shape) * 0.1 for n, s in specs.items()}
    whole = build(exits=True, width=width)
    with torch.no_grad():
        for name, param in whole.named_parameters():
            param.copy_(extract(global_params[name], specs[name], width))
    size = 32 if arch != "cnn" else 16
    x = torch.randn(4, 3, size, size)
    whole.eval()
    expected = whole.forward_exits(x)
    assert len(expected) == full.num_depths
    assert torch.equal(whole(x), expected[-1])
    for depth in range(1, full.num_depths + 1):
        model = build(exits=True, width=width, depth=depth)
        names = [n for n, _ in model.named_parameters()]
        assert set(names) == set(depth_names(full, depth)) == set(model.param_specs())
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(extract(global_params[name], specs[name], width))
        model.eval()
        got = model.forward_exits(x)
        assert len(got) == depth
        for a, b in zip(got, expected[:depth]):
            assert torch.allclose(a, b, atol=1e-6)
        assert torch.equal(model(x), got[-1])


def test_the_resnet_exits_are_depthfls_bottlenecks():
    """Exit k < 4: one separable-conv block per later stage, then a linear layer from the last stage's channels
    (Flower's baselines/depthfl/depthfl/resnet.py, scala{k} and middle_fc{k}); exit 4 is the network's own head."""
    model = PreResNet18(exits=True)
    depths = model.param_depths()
    for k, blocks in ((1, 3), (2, 2), (3, 1)):
        names = [n for n, d in depths.items() if n.startswith(f"exit{k}.")]
        assert {n.split(".")[2] for n in names if ".seps." in n} == {str(j) for j in range(blocks)}
        assert tuple(model.get_submodule(f"exit{k}.linear").weight.shape) == (10, 512)
        assert all(d == k for n, d in depths.items() if n.startswith(f"exit{k}."))
    assert "exit4.linear.weight" not in depths and depths["linear.weight"] == 4
    assert model.get_submodule("exit1.seps.0.dw1").groups == 64  # depthwise


@pytest.mark.parametrize("arch", ["preresnet18", "resnet18"])
def test_a_resnet_exit_multiplies_depthfls_attention_mask_into_the_stage(arch):
    """Flower's baselines/depthfl/depthfl/resnet.py (adap/flower fdef7afb1dca), ``MultiResnet``: exit k reads
    ``attention{k}(x) * x``, where ``attention{k}`` is a SepConv keeping the stage's channels, a norm, a ReLU, a 2x
    bilinear upsampling (align_corners False) and a sigmoid, and only then ``scala{k}`` and ``middle_fc{k}``. Here the
    expected logits are composed from the exit's own blocks by that rule (no Scaler, batch statistics)."""
    torch.manual_seed(3)
    model = builders()[arch](exits=True, scaler=False)
    model.train()
    for k, (channels, size) in enumerate(((4, 16), (8, 8), (8, 4)), start=1):
        exit_ = model.get_submodule(f"exit{k}")
        x = torch.randn(3, channels, size, size)
        mask = torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)(
            torch.relu(exit_.att_norm(exit_.att(x))))
        features = exit_.seps(torch.sigmoid(mask) * x)
        want = exit_.linear(torch.nn.AdaptiveAvgPool2d(1)(features).flatten(1))
        assert torch.allclose(exit_(x), want, atol=1e-6)
        assert {n for n, _ in exit_.named_parameters() if n.startswith("att")} >= {"att.dw1.weight", "att_norm.weight"}


@pytest.mark.parametrize("model", [PreResNet18(), ResNet18(), PreResNet18(norm="gn")])
def test_the_hook_counter_agrees_with_heterofls_counter(model):
    """The counter that prices depth sub-models gives the ResNets' own MACs and FLOPs (HeteroFL's counter) on the
    networks without exits."""
    assert counted_cost(model, torch.zeros(2, 3, 32, 32)) == (model.macs(1.0), model.flops(1.0))


def test_a_deeper_sub_model_costs_more_and_holds_more():
    model = PreResNet18(exits=True)
    specs = model.param_specs()
    params = [sum(specs[n].numel(1.0) for n in depth_names(model, d)) for d in (1, 2, 3, 4)]
    macs = [PreResNet18(exits=True, depth=d).macs(1.0) for d in (1, 2, 3, 4)]
    assert params == sorted(params) and len(set(params)) == 4 and params[-1] == sum(s.numel(1.0) for s in
                                                                                      specs.values())
    assert macs == sorted(macs) and len(set(macs)) == 4
    assert macs[-1] == model.macs(1.0) > PreResNet18().macs(1.0)  # every exit trained at depth 4


@pytest.mark.parametrize("depth", [0, 5, 2.5, True])
def test_a_depth_the_model_lacks_is_one_sentence(depth):
    with pytest.raises(ValueError, match=r"^depth is .* which the model lacks; expected an integer from 1 to 4"):
        PreResNet18(exits=True, depth=depth)
    with pytest.raises(ValueError, match="no exits"):
        PreResNet18(depth=2)


def test_the_depth_plan_maps_ladder_widths_to_depths():
    config = dict(MODEL_CONFIGS["cifar10"], exits=True)
    from hasfl_ray.models import register_model

    register_model("cifar10+exits", config)
    plan = depth_plan(RunConfig(dataset="cifar10", sub_model="depth"), "cifar10+exits")
    assert plan.depths == (1, 2, 3, 3) and plan.num_depths == 3  # ceil(p x 3) on the paper's tiers
    assert plan.shape(0.25) == (1.0, 1) and plan.shape(0.6) == (1.0, 3) and plan.shape(1.0) == (1.0, 3)
    both = depth_plan(RunConfig(dataset="cifar10", sub_model="width_depth", depths=[1, 1, 2, 3]), "cifar10+exits")
    assert both.shape(0.5) == (0.5, 1) and both.shape(0.75) == (0.75, 2)
    assert depth_plan(RunConfig(dataset="cifar10"), "cifar10") is None
    with pytest.raises(ConfigError, match=r"^depths is \[1, 2, 3, 4\] but model 'cifar10\+exits' has 3 depths"):
        depth_plan(RunConfig(dataset="cifar10", sub_model="depth", depths=[1, 2, 3, 4]), "cifar10+exits")
    with pytest.raises(ConfigError, match="^sub_model is 'depth' but model 'shakespeare' has no exits"):
        depth_plan(RunConfig(dataset="shakespeare", sub_model="depth"), "shakespeare")
    assert build_model_from(config, 0.5, depth=2).num_depths == 3


@pytest.mark.parametrize("keys, message", [
    (dict(sub_model="deep"), "^sub_model is 'deep'; expected width"),
    (dict(sub_model="depth", depths=[1, 2]), r"^depths is \[1, 2\]; expected 4 positive integers"),
    (dict(sub_model="depth", depths="1,x,2,3"), "^depths is '1,x,2,3'; expected a comma list"),
    (dict(depths=[1, 2, 3, 4]), r"^depths is \[1, 2, 3, 4\] but sub_model is 'width'"),
    (dict(sub_model="depth", classifier_aggregation="label_split"),
     "^classifier_aggregation is 'label_split' but sub_model is 'depth'"),
])
def test_bad_sub_model_keys_are_one_sentence(keys, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(dataset="digits", **keys)
