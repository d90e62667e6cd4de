"""The width-sliced ResNet-18s (hasfl_ray/models/resnet.py, docs/models.md): specs against the modules, sliced
sub-models against the masked full network (leading slices and FedRolex windows), sBN statistics against their
definition, the Scaler, the cost table against HeteroFL's published figures, and the options' bad input."""

import json

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.engine import RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model, resnet_cost_table
from hasfl_ray.models.choice import model_dataset, use_resnet
from hasfl_ray.models.resnet import (NORMS, RESNETS, PreResNet18, Scaler, StaticBatchNorm2d, resnet_config,
                                     sbn_statistics, training_batches)
from hasfl_ray.models.slicing import extract_window, window_linear_index

SMALL = dict(in_channels=3, num_classes=5, image_size=8, stages=(4, 8, 8, 16))


def small(arch: str, norm: str = "bn", width: float = 1.0, scaler: bool = True):
    return RESNETS[arch](norm=norm, scaler=scaler, width=width, **SMALL)


@pytest.mark.parametrize("arch", sorted(RESNETS))
@pytest.mark.parametrize("norm", NORMS)
def test_specs_describe_every_parameter_at_every_width(arch, norm):
    specs = small(arch, norm).param_specs()
    for p in (1.0, 0.5, 0.3, 1 / 16):
        sub = dict(small(arch, norm, p).named_parameters())
        assert set(sub) == set(specs)
        for name, spec in specs.items():
            assert tuple(sub[name].shape) == spec.sliced_shape(p), name
    kinds = {type(m) for m in small(arch, norm).modules()}
    assert (StaticBatchNorm2d in kinds) == (norm == "sbn")
    assert (torch.nn.GroupNorm in kinds) == (norm == "gn")


def test_classifier_input_scales_and_its_output_does_not():
    specs = small("preresnet18").param_specs()
    assert specs["linear.weight"].sliced_shape(0.25) == (5, 4)
    assert specs["linear.bias"].sliced_shape(0.25) == (5,)
    assert specs["conv1.weight"].sliced_shape(0.25) == (1, 3, 3, 3)  # the input channels never scale


@pytest.mark.parametrize("arch", sorted(RESNETS))
@pytest.mark.parametrize("p, offset", [(0.5, 0), (0.25, 0), (0.5, 3), (0.3, 7)])
def test_sliced_submodel_is_the_masked_full_network(arch, p, offset):
    """The width-p network holding the slice (or FedRolex's window at ``offset``) of the full network's parameters
    computes what the full network computes with every other coordinate zeroed: the specs' dims are the
    architecture's channel spaces, residual sums included."""
    torch.manual_seed(1)
    full, sub = small(arch), small(arch, width=p)
    specs = full.param_specs()
    sub_params = dict(sub.named_parameters())
    with torch.no_grad():
        for name, param in full.named_parameters():
            packed = extract_window(param, specs[name], p, offset)
            sub_params[name].copy_(packed)
            keep = torch.zeros(param.numel(), dtype=param.dtype)
            keep[window_linear_index(specs[name], packed.shape, offset).flatten()] = 1
            param.mul_(keep.view(param.shape))
    full.eval(), sub.eval()
    x = torch.randn(6, 3, 8, 8)
    torch.testing.assert_close(full(x), sub(x), rtol=1e-4, atol=1e-5)


def test_sbn_statistics_are_heterofls_cumulative_averages():
    torch.manual_seed(0)
    model = PreResNet18(in_channels=3, num_classes=4, image_size=8, norm="sbn", width=0.5, stages=(4, 8, 8, 8))
    batches = [(torch.randn(n, 3, 8, 8), torch.zeros(n, dtype=torch.long)) for n in (5, 7, 6)]
    assert sbn_statistics(model, batches)
    with torch.no_grad():  # layer1.0.n1 normalises the stem's output (the Scaler divides only in training)
        acts = [model.conv1(x).double() for x, _ in batches]
    norm = model.layer1[0].n1
    torch.testing.assert_close(norm.running_mean.double(), torch.stack([a.mean((0, 2, 3)) for a in acts]).mean(0),
                               rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm.running_var.double(),
                               torch.stack([a.var((0, 2, 3), unbiased=True) for a in acts]).mean(0),
                               rtol=1e-5, atol=1e-6)
    assert not model.training
    x = batches[1][0]
    torch.testing.assert_close(model(x)[:2], model(x[:2]))  # static: a sample's logits ignore its batch
    sbn_statistics(model, batches[:1])  # again: starts over
    torch.testing.assert_close(norm.running_mean.double(), acts[0].mean((0, 2, 3)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="needs training data"):
        sbn_statistics(model, [])
    assert not sbn_statistics(small("preresnet18", "gn"), batches)  # no sBN: nothing to do


def _dataset(view_keeps_train=False):
    train_x = torch.arange(10, dtype=torch.float32).view(10, 1, 1, 1).expand(10, 3, 2, 2).contiguous()
    data = TensorFederatedDataset("toy", "toy", 10, train_x, torch.arange(10), train_x[:3], torch.arange(3),
                                  [torch.tensor([3, 1, 4]), torch.tensor([0, 9]), torch.tensor([5, 6, 7, 8, 2])])
    data.view_keeps_train = view_keeps_train
    return data


def test_training_batches_are_the_clients_data_in_client_order():
    batches = list(training_batches(_dataset(), 4))
    assert [y.tolist() for _, y in batches] == [[3, 1, 4, 0], [9, 5, 6, 7], [8, 2]]
    assert [y.tolist() for _, y in training_batches(_dataset(), 3)] == [[3, 1, 4], [0, 9, 5], [6, 7, 8]]  # 1 left


def test_sbn_runs_keep_the_training_data_in_the_servers_view():
    assert _dataset().test_view().train_x.shape[0] == 0  # today's view: the test set only
    plugin = _dataset()
    plugin.model_config = dict(kind="preresnet18", norm="sbn")
    kept = model_dataset(plugin, RunConfig(), "toy").test_view()
    assert kept.train_x.shape[0] == 10 and not plugin.view_keeps_train  # a copy; the loaded dataset unchanged
    adopted = use_resnet(_dataset(), "resnet18", "gn", "off", "toy")
    assert adopted.model == "resnet18[3x2x2,10 classes,gn,scaler off]"
    assert adopted.model_config["scaler"] is False and not adopted.view_keeps_train
    assert build_model(adopted.model, 0.5).linear.in_features == 256


def test_scaler_divides_by_the_width_in_training_only():
    scaler, x = Scaler(0.25), torch.randn(3)
    torch.testing.assert_close(scaler.train()(x), x * 4)
    torch.testing.assert_close(scaler.eval()(x), x)
    torch.manual_seed(0)
    on, off = small("preresnet18", "none", 0.5), small("preresnet18", "none", 0.5, scaler=False)
    off.load_state_dict(on.state_dict())
    x = torch.randn(2, 3, 8, 8)
    assert not torch.allclose(on.train()(x), off.train()(x))  # without a norm the Scaler changes the network
    torch.testing.assert_close(on.eval()(x), off.eval()(x))


def test_group_norm_groups_divide_sliced_channels():
    model = small("resnet18", "gn", 1 / 16)  # 1 channel in the first stages
    groups = {m.num_channels: m.num_groups for m in model.modules() if isinstance(m, torch.nn.GroupNorm)}
    assert groups == {1: 1}
    assert {m.num_groups for m in small("resnet18", "gn").modules() if isinstance(m, torch.nn.GroupNorm)} == {4}


#: HeteroFL's Table (CIFAR-10, PreResNet-18, level a): 11,172 K parameters, 557.7 M FLOPs.
def test_preresnet18_cost_matches_heterofls_level_a():
    rows = {row["p"]: row for row in resnet_cost_table("preresnet18")}
    assert [row["p"] for row in rows.values()] == [1.0, 0.5, 0.25, 0.125, 0.0625]
    a = rows[1.0]
    assert a["params"] == PRERESNET18_PARAMS
    assert round(a["params"] / 1000) == 11_172  # norms' weight and bias, 1x1 shortcuts and linear bias counted
    assert a["macs"] == PRERESNET18_MACS  # 555.4 M: convs and the linear layer
    # HeteroFL's counter (src/summary.py; tests/models/test_heterofl_network.py re-implements it): + 4 per element a
    # BatchNorm normalises (557,056 of them) + the classifier's in * out once more (counted per weight and bias)
    assert a["flops"] == PRERESNET18_MACS + 4 * 557_056 + 512 * 10 == 557_656_064
    assert round(a["flops"] / 1e6, 1) == 557.7
    assert rows[0.5]["params"] < a["params"] / 3.9  # every hidden width halves: ~1/4 of the parameters
    resnet = resnet_cost_table("resnet18")[0]
    assert resnet["params"] == 11_173_962  # the ResNet-18 of FjORD (kuangliu's CIFAR layout) as widely quoted


PRERESNET18_PARAMS = 11_172_170
PRERESNET18_MACS = 555_422_720


def test_cost_cli_prints_the_resnets():
    result = CliRunner().invoke(main, ["cost", "--model", "preresnet18", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert set(rows[0]) == {"p", "params", "macs", "flops", "upload_mb"}
    table = CliRunner().invoke(main, ["cost", "--model", "resnet18", "--dataset", "emnist", "--model-norm", "none"])
    assert table.exit_code == 0 and "FLOPs/sample" in table.output and "0.0625" in table.output
    refused = CliRunner().invoke(main, ["cost", "--model", "cifar10", "--model-norm", "gn"])
    assert refused.exit_code == 2 and "--model-norm" in refused.output


@pytest.mark.parametrize("values, phrase", [
    (dict(model="vit"), "model is 'vit'; expected one of preresnet18, resnet18"),
    (dict(model="resnet18", model_norm="ln"), "model_norm is 'ln'; expected one of sbn, bn, gn, none"),
    (dict(model_scaler="on"), "model_scaler is 'on' but model is unset"),
    (dict(model_norm="gn"), "model_norm is 'gn' but model is unset"),
])
def test_bad_model_options_are_one_sentence(values, phrase):
    with pytest.raises(ConfigError, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        RunConfig(**values)


def test_yaml_scaler_booleans_read_as_on_and_off():
    assert RunConfig(model="resnet18", model_scaler=False).model_scaler == "off"
    assert RunConfig.from_dict({"model": "resnet18", "model_scaler": True}).model_scaler == "on"


def test_model_needs_image_inputs():
    from hasfl_ray.engine import Engine

    with pytest.raises(ConfigError, match="model is 'resnet18' but dataset 'synthetic' is not an image dataset"):
        Engine(RunConfig(dataset="synthetic", model="resnet18", backend="local", clients=4, clients_per_round=2,
                         rounds=1)).prepare()


def test_resnet_names_say_their_config():
    name, config = resnet_config("preresnet18", 3, 10, 32)
    assert name == "preresnet18[3x32x32,10 classes,sbn,scaler on]"
    assert config == dict(kind="preresnet18", in_channels=3, num_classes=10, image_size=32, norm="sbn", scaler=True)
