"""Bring your own model (docs/plugins.md#models): the slice description derived from a plug-in's shapes equals the
hand-written one of every built-in network; examples/tiny_vit.py trains two rounds under HAS-FL from ``--model``;
a factory function, a module spec and a dataset plug-in's own model_config work too; every model that cannot be
sliced, and every bad spec, is one sentence with exit status 2 and no run directory."""

import os

import pytest
import torch
from click.testing import CliRunner

import model_plugins
from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import MODEL_CONFIGS, MLP, CharLSTM, ImageCNN, build_model, register_model
from hasfl_ray.models import plugin
from hasfl_ray.models.plugin import derive_specs, describe, load_factory
from hasfl_ray.models.resnet import PreResNet18, ResNet18

VIT = f"{model_plugins.VIT_FILE}:TinyViT"
PLUGINS = os.path.abspath(model_plugins.__file__)
TINY = dict(backend="local", clients=6, clients_per_round=3, rounds=2, local_epochs=1, warmup=1, t_adapt=1,
            eval_samples=64, seed=3, checkpoint_every=0)
KINDS = {"cnn": ImageCNN, "mlp": MLP, "lstm": CharLSTM, "preresnet18": PreResNet18, "resnet18": ResNet18}


def derived_without_own_specs(kind: str, config: dict):
    """The derived slicing of a built-in network, its own param_specs hidden."""
    plain = type("Plain", (KINDS[kind],), {"param_specs": None})
    return derive_specs(plain, config, f"plain {kind}")


@pytest.mark.parametrize("name, config", [
    *((name, MODEL_CONFIGS[name]) for name in ("digits", "cifar10", "synthetic", "shakespeare")),
    *((f"{kind}-{norm}", dict(kind=kind, in_channels=1, num_classes=10, image_size=8, norm=norm, stages=[4, 8, 8, 16]))
      for kind in ("preresnet18", "resnet18") for norm in ("sbn", "gn")),
])
def test_derived_slicing_equals_the_hand_written_specs(name, config):
    """The CNNs' flattened feature maps (channels of 16 or 4 positions), the LSTM's gates (nn.LSTM: 4 blocks), the
    MLP and the ResNets' residual channel spaces are all read off their shapes exactly as the code describes them."""
    config = dict(config)
    kind = config.pop("kind")
    derived = derived_without_own_specs(kind, config)
    hand = KINDS[kind](**config).param_specs()
    assert list(derived) == list(hand) and derived == hand
    assert derive_specs(KINDS[kind], config, kind) == hand  # a model's own param_specs, checked at the probes


def test_widths_beyond_the_probes_tell_units_apart(monkeypatch):
    """With one probe (p = 0.5) every unit of the digits CNN's flattened input fits; the widths built where the
    candidates differ leave the true one (64 channels of 4 positions)."""
    monkeypatch.setattr(plugin, "PROBE_WIDTHS", (0.5,))
    config = {k: v for k, v in MODEL_CONFIGS["digits"].items() if k != "kind"}
    derived = derived_without_own_specs("cnn", config)
    assert derived == ImageCNN(**config).param_specs()
    assert (derived["fc1.weight"].dims[1].channels, derived["fc1.weight"].dims[1].unit) == (64, 4)


def test_derivation_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    derive_specs(model_plugins.make_mlp, {}, "mlp")
    assert torch.equal(torch.rand(3), expected)


def test_the_example_vit_trains_two_rounds_under_hasfl(tmp_path):
    engine = Engine(RunConfig(dataset="digits", algorithm="hasfl", model=VIT, **TINY), out_dir=str(tmp_path / "run"))
    summary = engine.run()
    assert engine.model_name == f"{VIT}[1x8x8 float32,10 classes]"
    assert len(engine.history) == 2 and all(0 <= row["test_accuracy"] <= 1 for row in engine.history)
    params = engine.backend.get_params()
    moved = {n for n in params if not torch.equal(params[n], engine.initial_params[n])}
    assert {"embed.weight", "blocks.0.qkv.weight", "blocks.1.fc2.bias", "head.weight", "pos", "cls"} <= moved
    specs = build_model(engine.model_name).param_specs()
    qkv = specs["blocks.0.qkv.weight"].dims  # declared: 3 blocks of 4 heads of 8 features, by 4 heads of 8
    assert [(d.blocks, d.channels, d.unit) for d in qkv] == [(3, 4, 8), (1, 4, 8)]
    assert not specs["head.weight"].dims[0].scaled and specs["blocks.0.fc1.weight"].dims[0].channels == 64
    assert "blocks.0.qkv.weight    (96, 32)           [3*4x8, 4x8]" in describe(specs)
    assert summary["params_sha256"] and (tmp_path / "run" / "config.yaml").read_text().count(VIT) == 1


def test_a_factory_function_from_a_module_and_a_gru(tmp_path):
    """``module:function`` (tests/models is on the path): of the dataset's arguments the function takes only
    num_classes (the 1x8x8 digits offer no in_features, which flat inputs do), and flattens the images itself; an
    nn.GRU's weights slice in its 3 gate blocks."""
    engine = Engine(RunConfig(dataset="digits", algorithm="heterofl", model="model_plugins:make_mlp", **TINY))
    engine.run()
    assert engine.backend.get_params()["1.weight"].shape == (24, 64)
    gru = derive_specs(model_plugins.GatedRNN, {}, "gru")
    assert gru["gru.weight_hh_l0"].dims[0].blocks == 3 and gru["gru.weight_hh_l0"].dims[1].channels == 12


def test_a_dataset_plugin_names_a_plugin_model_in_its_model_config():
    engine = Engine(RunConfig(dataset=f"{PLUGINS}:VitDigits", algorithm="fedrolex", **TINY))  # windows of heads
    engine.run()
    assert engine.model_name == "digits-tiny-vit" and MODEL_CONFIGS["digits-tiny-vit"]["kind"] == "plugin"
    assert engine.backend.get_params()["pos"].shape == (1, 17, 8)  # 16 patches of 2x2 and the class token


def test_measured_macs_of_a_plugin_equal_the_hand_count():
    """Without a macs(p) method, a plug-in's cost is counted by torch's FLOP counter: the MLP's weights, as
    MLP.macs counts them."""
    plain = type("PlainMLP", (MLP,), {"param_specs": None, "macs": None})
    config = dict(in_features=60, num_classes=10, hidden=(128, 128))
    register_model("plain-mlp-for-macs", dict(kind="plugin", factory=plain, spec="plain", arguments=config,
                                              sample={"shape": [60], "dtype": "float32"}))
    for p in (1.0, 0.5, 0.37):
        assert build_model("plain-mlp-for-macs").macs(p) == MLP(**config).macs(p)


@pytest.mark.parametrize("spec, needle", [
    ("examples/nowhere.py:Net", "the file 'examples/nowhere.py' does not exist"),
    (f"{PLUGINS}:NoSuchNet", "has no 'NoSuchNet'"),
    (f"{PLUGINS}:NotAModel", "is not an nn.Module subclass or a function"),
    (f"{PLUGINS}:returns_a_number", "built a int at width 1; expected an nn.Module"),
    (f"{PLUGINS}:NoWidth", "takes no width argument; expected __init__(self, width: float = 1.0, ...)"),
    (f"{PLUGINS}:NeedsDepth", "needs argument 'depth', which hasfl-ray does not give"),
    (f"{PLUGINS}:FailsBelowOne", "fails to build at width 0.5 (RuntimeError: only full width is implemented)"),
    (f"{PLUGINS}:FloorWidth", "dimension 0 of parameter 'fc1.weight' has 7 of its 20 positions at width 0.37, which "
                              "follows no width rule; expected ceil(p * c) of its c channels"),
    (f"{PLUGINS}:ExtraAtFullWidth", "its width-0.5 network has no parameter 'extra.weight'"),
    (f"{PLUGINS}:RunningStats", "norm layer 'bn' with running statistics"),
    (f"{PLUGINS}:WrongOwnSpec",
     "parameter 'fc.weight' has shape (8, 64) at width 0.5 but its ParamSpec gives (16, 64)"),
    (f"{PLUGINS}:BadBlocks", "in 3 blocks sliced alike (declared)"),
    ("no_such_module_here:Net", "no module 'no_such_module_here'"),
    ("model_plugins:9lives", "expected preresnet18, preresnet18-1112, resnet18, or FILE.py:Class or MODULE:Class"),
])
def test_models_that_cannot_be_sliced_are_one_sentence(tmp_path, spec, needle):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--backend", "local", "--rounds", "1",
                                       "--clients", "4", "--clients-per-round", "2", "--quiet", "--model", spec,
                                       "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output, result.output
    assert result.output.strip().count("\n") == 0 and not out.exists()


def test_model_options_are_refused_with_a_plugin_and_bad_names_list_the_plugin_forms():
    with pytest.raises(ConfigError, match="model_norm is 'gn' but model is the plug-in 'x.py:Net'; expected it only"):
        RunConfig(model="x.py:Net", model_norm="gn")
    with pytest.raises(ConfigError, match="model is 'vit'; expected one of preresnet18, resnet18, preresnet18-1112, or a plug-in model"):
        RunConfig(model="vit")
    with pytest.raises(ConfigError, match="slice_blocks for 'fc.w', which names no parameter"):
        derive_specs(type("Declares", (model_plugins.NoWidth,), {"slice_blocks": {"fc.w": 2},
                                                                 "__init__": lambda self, width=1.0:
                                                                 model_plugins.NoWidth.__init__(self)}), {}, "d")


def test_the_plugin_file_is_loaded_once_and_shipped_by_value():
    from hasfl_ray.registry import FILE_MODULES

    assert load_factory(VIT) is load_factory(VIT)
    assert any(getattr(m, "__file__", None) == model_plugins.VIT_FILE for m in FILE_MODULES)
