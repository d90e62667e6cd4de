"""`hasfl-ray cost` at any width ladder and for plug-in models (docs/usage.md#cost, docs/plugins.md#models): the
defaults print today's tables; --widths costs any widths in (0, 1]; a plug-in's MACs, counted by torch's
FlopCounterMode, equal an analytic count by hand (a tiny conv net defined here, examples/tiny_vit.py) and the built-in
CNN's own count; bad input is one sentence with exit status 2."""

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from hasfl_ray.cli.main import main
from hasfl_ray.models import MODEL_CONFIGS, ImageCNN, cost_table, resnet_cost_table, width_channels

HERE = str(Path(__file__).resolve())
VIT = str(Path(__file__).resolve().parents[2] / "examples" / "tiny_vit.py") + ":TinyViT"
BAD = str(Path(__file__).resolve().parents[1] / "models" / "model_plugins.py")  # the plug-in tests' unsliceable ones


class TinyConvNet(nn.Module):
    """conv 3x3 (padding 1) to ceil(6p) channels, ReLU, then a linear layer over the flattened feature map."""

    def __init__(self, width: float = 1.0, in_channels: int = 1, image_size: int = 8, num_classes: int = 10):
        super().__init__()
        channels = width_channels(width, 6)
        self.conv = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.fc = nn.Linear(channels * image_size * image_size, num_classes)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class PlainDigitsCNN(ImageCNN):
    """The built-in digits CNN as a plug-in, without its own param_specs() or macs(p): both derived/measured."""

    param_specs = None
    macs = None

    def __init__(self, width: float = 1.0, in_channels: int = 1, image_size: int = 8, num_classes: int = 10):
        config = MODEL_CONFIGS["digits"]
        super().__init__(in_channels, num_classes, image_size, config["stages"], config["fc_width"], width=width)


def cost(*args):
    return CliRunner().invoke(main, ["cost", *args])


def cost_json(*args):
    result = cost(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_default_tables_are_unchanged():
    lines = cost("--model", "cifar10").output.splitlines()
    assert lines[0] == "    p       params    MACs/sample  upload MB"
    assert lines[4] == " 1.00    3,249,994    154,866,688      13.00" and len(lines) == 5
    assert [row["p"] for row in cost_json("--model", "digits")] == [0.25, 0.5, 0.75, 1.0]


def test_widths_cost_any_ladder_for_the_built_ins():
    rows = cost_json("--model", "cifar10", "--widths", "1,0.5,0.25,0.125,0.0625")
    assert [row["p"] for row in rows] == [1.0, 0.5, 0.25, 0.125, 0.0625]
    assert rows == cost_table("cifar10", (1.0, 0.5, 0.25, 0.125, 0.0625)) and rows[0]["params"] == 3_249_994
    assert set(rows[0]) == {"p", "params", "macs", "upload_mb"}
    table = cost("--model", "synthetic", "--widths", "0.125,1").output.splitlines()
    assert table[1].split()[0] == "0.125" and table[2].split()[0] == "1"  # not rounded to 2 places
    resnet = cost_json("--model", "preresnet18", "--dataset", "digits", "--widths", "0.5")
    assert resnet == resnet_cost_table("preresnet18", "digits", widths=(0.5,)) and "flops" in resnet[0]


def test_a_plugins_macs_equal_the_hand_count():
    rows = cost_json("--model", f"{HERE}:TinyConvNet", "--dataset", "digits", "--widths", "1,0.5,0.25")
    assert [row["p"] for row in rows] == [1.0, 0.5, 0.25]
    for row in rows:
        c = width_channels(row["p"], 6)  # 6, 3, 2 channels on the 1x8x8 digits, 10 classes
        conv, linear = c * 1 * 3 * 3 * 8 * 8, (c * 8 * 8) * 10  # Cout*Cin*k*k*H*W, in*out
        assert row["macs"] == conv + linear and row["flops"] == 2 * row["macs"]
        assert row["params"] == c * 9 + c + 10 * c * 64 + 10 and row["upload_mb"] == row["params"] * 4 / 1e6
    assert set(rows[0]) == {"p", "params", "macs", "upload_mb", "flops"}


def test_the_built_in_cnn_as_a_plugin_costs_what_the_built_in_does():
    """Derived slicing and FlopCounterMode's MACs equal ImageCNN's hand-written param_specs() and macs(p)."""
    widths = "0.25,0.37,0.5,1"
    plugin = cost_json("--model", f"{HERE}:PlainDigitsCNN", "--dataset", "digits", "--widths", widths)
    builtin = cost_json("--model", "digits", "--widths", widths)
    assert [{k: row[k] for k in builtin[0]} for row in plugin] == builtin


def test_the_example_vit_table():
    result = cost("--model", VIT, "--dataset", "digits", "--widths", "0.5,1")
    assert result.exit_code == 0, result.output
    header, half, full = result.output.splitlines()
    assert header.split() == ["p", "params", "MACs/sample", "FLOPs/sample", "upload", "MB"]
    # by hand on 1x8x8 digits: patches of 4 -> 4 tokens + the class token; width 1 has 4 heads of 8 (dim 32), MLP 64
    tokens, dim, hidden, heads, head_dim = 5, 32, 64, 4, 8
    embed = dim * 1 * 4 * 4 * 2 * 2
    block = tokens * dim * 3 * dim + 2 * heads * tokens * tokens * head_dim + tokens * dim * dim \
        + 2 * tokens * dim * hidden  # qkv, q@k^T and attention@v, proj, the MLP
    macs = embed + 2 * block + dim * 10
    assert full.split() == ["1", "18,218", f"{macs:,}", f"{2 * macs:,}", "0.07"]
    assert half.split()[:2] == ["0.5", "5,018"]  # 2 heads of 8 and 32 MLP units (docs/plugins.md)


@pytest.mark.parametrize("args, needle", [
    (["--model", "cifar10", "--widths", "0"], "widths is [0.0]; expected a list of widths in (0, 1]"),
    (["--model", VIT, "--dataset", "digits", "--widths", "0.5,1.5"],
     "widths is [0.5, 1.5]; expected a list of widths in (0, 1]"),
    (["--model", "cifar10", "--widths", "half"], "--widths is 'half'; expected comma-separated widths in (0, 1]"),
    (["--model", "nowhere.py:Net", "--dataset", "digits"], "the file 'nowhere.py' does not exist"),
    (["--model", f"{BAD}:NotAModel", "--dataset", "digits"], "NotAModel is not an nn.Module subclass"),
    (["--model", f"{BAD}:NoWidth", "--dataset", "digits"], "takes no width argument; expected __init__(self, "
                                                           "width: float = 1.0, ...)"),
    (["--model", f"{BAD}:FloorWidth", "--dataset", "digits"], "cannot be sliced: dimension 0 of parameter "
                                                              "'fc1.weight' has 7 of its 20 positions at width 0.37"),
    (["--model", VIT, "--dataset", "digits", "--model-norm", "gn"],
     f"--model-norm is 'gn' but --model is '{VIT}'; expected it only with a ResNet (preresnet18, resnet18, "
     "preresnet18-1112)"),
    (["--model", VIT, "--dataset", "synthetic"], "fails on an input of shape [60] float32 at width 0.25"),
    (["--model", "imagenet"], "--model is 'imagenet'; expected one of cifar10"),
    (["--model", "resnet18", "--dataset", "synthetic"], "--dataset is 'synthetic' but --model is 'resnet18'; "
                                                        "expected an image dataset"),
    # the league's methods (h49): a traceback, a width simulate refuses priced, --index-sets ignored, before
    (["--model", "digits", "--algorithm", "fluid", "--depths", "1,1,2,2"],
     "--depths is '1,1,2,2' with --algorithm fluid; expected no --depths"),
    (["--model", "digits", "--algorithm", "fiarse", "--widths", "0.001,1"],
     "width 0.001 gives fiarse model size 1e-06 (size rule square), which keeps none of the 53002 scored"),
    (["--model", "digits", "--algorithm", "fedgmr", "--widths", "0.001"], "width 0.001 gives fedgmr model size"),
    (["--model", "digits", "--algorithm", "fiarse", "--index-sets"],
     "--index-sets with --algorithm fiarse; expected it alone or with --algorithm fluid (fiarse's clients hold "
     "parameter masks"),
    (["--model", "digits", "--algorithm", "depthfl", "--index-sets"], "depthfl's clients hold depth sub-models"),
])
def test_bad_input_is_one_sentence(args, needle):
    result = cost(*args)
    assert result.exit_code == 2, result.output
    assert needle in result.output and result.output.startswith("Error: ")
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize("spec", ["examples/mask_policy.py:RandomMasks", "my_package.module:Policy"])
def test_cost_algorithm_names_a_plugin_as_one_and_asks_for_a_built_in(spec):
    """A plug-in given to cost --algorithm was told "expected one of the 14 listed by `hasfl-ray simulate --help`",
    where plug-ins are listed too (h50)."""
    result = CliRunner().invoke(main, ["cost", "--model", "cifar100", "--algorithm", spec])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        f"Error: --algorithm is {spec!r}, a plug-in, whose sub-models only its run knows (the device clock prices them "
        "there); expected a built-in method's name, such as fiarse or fedgmr")


def test_depths_beside_an_algorithm_that_trains_slices_print_the_depth_table():
    """`cost --algorithm hasfl --depths ...` ended in KeyError: 'size' (the size column is the depth methods')."""
    result = cost("--model", "digits", "--algorithm", "hasfl", "--depths", "1,1,2,2")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].split() == ["depth", "p", "params", "MACs/sample", "FLOPs/sample", "upload",
                                                     "MB"]
    assert result.output == cost("--model", "digits", "--depths", "1,1,2,2").output
