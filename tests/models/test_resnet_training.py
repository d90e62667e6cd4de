"""Every built-in algorithm trains the width-sliced ResNets through the Engine (docs/models.md): the 8x8 digits on
ResNet-18 layouts with tiny width-1 stages (resnet_plugins.py), two short rounds each; and ``--model`` on a real
ResNet-18 at a tiny width ladder."""

import math

import pytest
import torch

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.models.resnet import StaticBatchNorm2d

ALGORITHMS = ("hasfl", "heterofl", "fjord", "uniform", "random-budget", "fedavg", "fedprox", "scaffold", "fedrolex")
PLUGINS = {"preresnet18-sbn": "resnet_plugins:TinyPreResNetDigits", "resnet18-gn": "resnet_plugins:TinyResNetDigits"}


def run(**values) -> Engine:
    engine = Engine(RunConfig.from_dict({"backend": "local", "clients": 6, "clients_per_round": 3, "rounds": 2,
                                         "local_epochs": 1, "warmup": 1, "t_adapt": 1, "eval_samples": 64,
                                         "seed": 3, **values}))
    engine.run()
    return engine


def assert_trained(engine: Engine) -> None:
    """Both rounds evaluated to a finite accuracy, and every kind of layer (convs, norms' affine weight and bias,
    the classifier's weight and bias) moved from w^(0)."""
    assert len(engine.history) == 2
    assert all(0.0 <= row["test_accuracy"] <= 1.0 and math.isfinite(row["test_loss"]) for row in engine.history)
    params, initial = engine.backend.get_params(), engine.initial_params
    moved = {name for name in params if not torch.equal(params[name], initial[name])}
    for kind in ("conv1.weight", "shortcut.weight", "n1.weight", "n2.bias", "linear.weight", "linear.bias"):
        assert any(name.endswith(kind) for name in moved), f"no {kind} trained"
    assert all(torch.isfinite(t).all() for t in params.values())


@pytest.mark.parametrize("model", sorted(PLUGINS))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_trains_the_resnets(algorithm, model):
    engine = run(dataset=PLUGINS[model], algorithm=algorithm)
    assert_trained(engine)
    if model.endswith("sbn"):  # the evaluated global model carries HeteroFL's statistics, its training nothing
        server = engine.backend.server
        norms = [m for m in server.model.modules() if isinstance(m, StaticBatchNorm2d)]
        assert norms and all(m.running_mean is not None and m.num_batches_tracked > 0 for m in norms)
        assert not any(name.endswith(("running_mean", "running_var")) for name in engine.initial_params)


def test_fedrolex_rolls_resnet_windows():
    """FedRolex's windows move over the ResNet's channels: with every client below width 1, channels beyond the
    widest client's leading slice are trained too."""
    engine = run(dataset=PLUGINS["preresnet18-sbn"], algorithm="fedrolex", widths=[0.5], rounds=2)
    assert_trained(engine)
    delta = engine.backend.get_params()["layer4.1.conv2.weight"] - engine.initial_params["layer4.1.conv2.weight"]
    assert bool((delta[8:] != 0).any())  # 16 channels at width 1, 8 at 0.5: a window past the leading 8


def test_model_flag_trains_heterofls_preresnet18_at_a_tiny_ladder():
    engine = run(model="preresnet18", model_norm="gn", widths=[0.0625, 0.03125], algorithm="heterofl",
                 eval_widths=[1.0], rounds=2)
    assert engine.model_name == "preresnet18[1x8x8,10 classes,gn,scaler on]"
    assert engine.initial_params["linear.weight"].shape == (10, 512)
    assert_trained(engine)
