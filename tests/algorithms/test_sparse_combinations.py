"""Channel sets and masks beside what the server cannot aggregate with them (a label split, the common-core
estimator, rolling windows): one sentence and exit status 2 before any client trains them (h50). They were a
ValueError traceback (exit 1) from the server, after the round's clients had trained: fiarse and fedgmr with
--classifier-aggregation label_split or --estimator common-core, and any plug-in handing out channel sets or masks."""

import os

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main

TINY = ["--rounds", "2", "--clients", "6", "--clients-per-round", "3", "--quiet", "--dataset", "digits",
        "--backend", "local"]


def simulate(out, *args):
    result = CliRunner().invoke(main, ["simulate", *TINY, "--out", str(out), *args])
    text = result.output.strip()
    assert result.exit_code == 2, text
    assert text.count("\n") == 0 and "Traceback" not in text and text.startswith("Error: "), text
    return text[len("Error: "):]


@pytest.mark.parametrize("algorithm, flag, value, expected", [
    ("fiarse", "--classifier-aggregation", "label_split", "classifier_aggregation all"),
    ("fiarse", "--estimator", "common-core", "estimator masked"),
    ("fedgmr", "--estimator", "common-core", "estimator masked"),
])
def test_a_masked_built_in_refuses_the_config_before_anything_runs(tmp_path, algorithm, flag, value, expected):
    key = flag[2:].replace("-", "_")
    text = simulate(tmp_path / "run", "--algorithm", algorithm, flag, value)
    assert text == f"algorithm {algorithm} trains parameter masks and {key} is {value!r}; expected {expected}"
    assert not (tmp_path / "run").exists()


PLUGIN = '''
import torch
from hasfl_ray import Algorithm
from hasfl_ray.algorithms.fedrolex import FedRolex
from hasfl_ray.models import build_model
from hasfl_ray.models.index_slicing import random_channel_sets


class Masks(Algorithm):
    def parameter_masks(self, round, client, width):
        specs = build_model(self.model_name).param_specs()
        return {name: torch.ones(spec.shape, dtype=torch.bool) for name, spec in specs.items() if len(spec.shape) > 1}


class RollingChannels(FedRolex):
    def channel_sets(self, round, client, width):
        specs = build_model(self.model_name).param_specs()
        return random_channel_sets(specs, width, torch.Generator().manual_seed(round * 100 + client))
'''


def test_a_plugins_masks_beside_the_common_core_estimator_are_refused_before_training(tmp_path):
    (tmp_path / "plugin.py").write_text(PLUGIN)
    out = tmp_path / "run"
    text = simulate(out, "--algorithm", f"{tmp_path / 'plugin.py'}:Masks", "--estimator", "common-core")
    assert text.startswith("algorithm 'Masks' handed client ") and text.endswith(
        " masks and estimator is 'common-core', which the server cannot aggregate together; expected estimator masked")
    assert not out.exists()  # no round ran: the start is undone, no half-written run (issue 44)


def test_a_plugins_channel_sets_beside_a_rolling_window_are_refused_before_training(tmp_path):
    """FedRolex's windows are offset from round 1 on: that round's first dispatch is refused, round 0 stands."""
    (tmp_path / "plugin.py").write_text(PLUGIN)
    out = tmp_path / "run"
    text = simulate(out, "--algorithm", f"{tmp_path / 'plugin.py'}:RollingChannels")
    assert text.startswith("algorithm 'RollingChannels' handed client ") and " channel sets with window offset " in text
    assert text.endswith(", which the server cannot aggregate together; expected offset 0 (rolling windows are of "
                         "leading slices)"), text
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_plugins_channel_sets_in_a_depth_run_are_refused_as_masks_are(tmp_path):
    """Channel sets beside a depth said "parameter 'exit1.weight' takes 32 input channels but the layer before it has
    128; expected a sequential conv/linear chain" (the exits' model has no channel groups); then (h50) the sentence
    masks beside a depth get at the first dispatch. h71: the documented plug-ins (examples/channel_policy.py draws
    from its own model_name, the model with exits in such a run) still failed in their own code there, exit 1, with a
    folder; now an algorithm overriding channel_sets or parameter_masks is refused at the start, nothing made."""
    (tmp_path / "plugin.py").write_text(
        "from hasfl_ray import Algorithm\nfrom hasfl_ray.models import build_model\n"
        "from hasfl_ray.models.index_slicing import random_channel_sets\nimport torch\n\n\n"
        "class Channels(Algorithm):\n    def channel_sets(self, round, client, width):\n"
        "        specs = build_model('digits').param_specs()\n"
        "        return random_channel_sets(specs, width, torch.Generator().manual_seed(client))\n")
    text = simulate(tmp_path / "run", "--algorithm", f"{tmp_path / 'plugin.py'}:Channels", "--sub-model",
                    "width_depth")
    assert text == ("algorithm 'Channels' hands out channel sets (channel_sets) but sub_model is 'width_depth'; "
                    "expected sub_model width (a client trains one sub-model shape: channel sets of the whole network "
                    "at width, or a depth)"), text
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("spec, what", [("channel_policy.py:RandomChannels", "channel sets (channel_sets)"),
                                        ("mask_policy.py:RandomMasks", "masks (parameter_masks)")])
@pytest.mark.parametrize("sub_model", ["depth", "width_depth"])
def test_the_documented_plugins_in_a_depth_run_are_one_sentence(tmp_path, spec, what, sub_model):
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
    text = simulate(tmp_path / "run", "--algorithm", os.path.join(examples, spec), "--sub-model", sub_model)
    assert text.startswith(f"algorithm '{spec.split(':')[1]}' hands out {what} but sub_model is {sub_model!r}"), text
    assert not (tmp_path / "run").exists()
