"""examples/channel_policy.py: a plug-in hands out per-layer channel index sets; the run trains and aggregates
them end to end (the fused kernel, the Ray transport), bit for bit on both backends."""

import json
import os

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLICY = os.path.join(REPO, "examples", "channel_policy.py") + ":RandomChannels"
TINY = ["--rounds", "2", "--clients", "6", "--clients-per-round", "3", "--quiet", "--dataset", "digits"]


def run(tmp_path, name, *args):
    out = tmp_path / name
    result = CliRunner().invoke(main, ["simulate", *TINY, "--algorithm", POLICY, "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    with open(out / "summary.json", encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def channels(tmp_path_factory):
    """The plug-in's run on the local backend, made once for the tests that compare with it."""
    return run(tmp_path_factory.mktemp("channels"), "channels", "--backend", "local")


def test_channel_plugin_trains_other_channels_than_the_leading_slice(tmp_path, channels):
    again = run(tmp_path, "again", "--backend", "local")
    assert again["params_sha256"] == channels["params_sha256"]  # deterministic
    # The same plug-in without its channel sets trains the leading slices: another model.
    (tmp_path / "leading.py").write_text("from hasfl_ray import Algorithm\n\n\nclass Leading(Algorithm):\n"
                                         "    pass\n")
    leading = run(tmp_path, "leading", "--backend", "local", "--algorithm", f"{tmp_path / 'leading.py'}:Leading")
    assert leading["params_sha256"] != channels["params_sha256"]


def test_channel_plugin_is_bit_identical_on_ray(ray_local, tmp_path, channels):
    ray = run(tmp_path, "ray", "--backend", "ray")
    assert ray["params_sha256"] == channels["params_sha256"]


@pytest.mark.parametrize("rule", ["fedbuff", "fedasync"])
def test_channel_plugin_async_resumes_bit_for_bit(tmp_path, monkeypatch, crash_async_at, rule):
    """Asynchronous: in-flight index-set updates are checkpointed (plain form) and a resumed run matches; FedAsync
    mixes a stale index-set update at its own coordinates."""
    from hasfl_ray.engine import Engine, RunConfig
    from hasfl_ray.engine.checkpoint import load_checkpoint

    config = RunConfig(backend="local", mode="async", devices="lognormal", clients=8, clients_per_round=4,
                       local_epochs=1, seed=5, concurrency=4, buffer_size=None if rule == "fedasync" else 2,
                       async_rule=rule, rounds=6, checkpoint_every=2, dataset="digits", algorithm=POLICY)
    reference = Engine(config, out_dir=str(tmp_path / "reference")).run()
    crash_async_at(5)
    with pytest.raises(KeyboardInterrupt):
        Engine(config, out_dir=str(tmp_path / "run")).run()
    monkeypatch.undo()
    assert load_checkpoint(str(tmp_path / "run")).clock["async"]["in_flight"]
    resumed = Engine(config, out_dir=str(tmp_path / "run"), resume=True).run()
    assert resumed["params_sha256"] == reference["params_sha256"]


@pytest.mark.parametrize("body,words", [
    ("return [[999]] * 5", "channel_sets has 5 lists; expected one per channel group (3)"),
    ("return [[0]] * 3", "group 0 holds 1 of 32 channels at width"),
    ("return [[1, 0]] + [[0]] * 2", "channel_sets[0] is not strictly increasing"),
    ("return 'abc'", "expected None or one sorted list"),
    # h71: a mapping of group to channels was read by its keys: "channel_sets[0] is a int", of a list
    ("return {0: list(range(16)), 1: list(range(32)), 2: list(range(64))}", "(a dict is no list of groups)"),
    ("return [3, 4, 5]", "channel_sets[0] is an int; expected a list of channel numbers"),
    ("return ['0123456789abcdef', list(range(32)), list(range(64))]", "channel_sets[0] is a str; expected a list"),
    # a 2-D group: its row's tensor repr ran over four lines
    ("return [torch.arange(32).reshape(2, 16) * 2, list(range(32)), list(range(64))]",
     "channel_sets[0] holds a Tensor of shape (16,) (a group is one flat list), which is not an integer"),
    ("return [[c * 1.5 for c in range(16)], list(range(32)), list(range(64))]",
     "channel_sets[0] holds 0.0, which is not an integer; expected integer channel numbers"),
    ("return [[False, True] + list(range(2, 16)), list(range(32)), list(range(64))]",
     "channel_sets[0] holds False, which is not an integer"),
    ("return [[10 ** 6] * 16, list(range(32)), list(range(64))]", "holds channel 1000000, outside the layer's 32"),
    # past int64: torch's "(Overflow when unpacking long long)" was the reason given (h62)
    ("return [[10 ** 20] + list(range(1, 16)), list(range(32)), list(range(64))]",
     "channel_sets[0] holds channel 100000000000000000000, outside the layer's 32 channels"),
    ("return [[-2 ** 70] + list(range(1, 16)), list(range(32)), list(range(64))]",
     "channel_sets[0] holds channel -1180591620717411303424, outside the layer's 32 channels"),
])
def test_bad_channel_sets_from_a_plugin_are_one_sentence(tmp_path, body, words):
    """Bad input (issue 44: an index outside a layer, a float channel never rounded to another one): one sentence,
    exit status 2, as a bad mask is."""
    (tmp_path / "bad.py").write_text("import torch\nfrom hasfl_ray import Algorithm\n\n\nclass Bad(Algorithm):\n"
                                     f"    def channel_sets(self, round, client, width):\n        {body}\n")
    result = CliRunner().invoke(main, ["simulate", *TINY, "--backend", "local", "--algorithm",
                                       f"{tmp_path / 'bad.py'}:Bad", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "algorithm 'Bad' returned channel sets for client" in result.output, \
        result.output
    assert words in result.output and "Traceback" not in result.output, result.output
    assert result.output.strip().count("\n") == 0, result.output


def test_integer_channels_of_numpy_and_torch_are_taken_as_they_are():
    import numpy as np
    import torch

    from hasfl_ray.models.index_slicing import channel_numbers, check_channel_sets

    assert channel_numbers(0, np.array([1, 4], dtype=np.int32)) == (1, 4)
    assert channel_numbers(0, torch.tensor([2, 3])) == (2, 3)
    assert [t.tolist() for t in check_channel_sets([[0, np.int64(3)]], [4])] == [[0, 3]]
    for bad in ([0.0, 1.0], [0, 2.5], torch.tensor([0.0, 1.0]), [True], np.array([0.5])):
        with pytest.raises(ValueError, match=r"^channel_sets\[0\] holds .*, which is not an integer"):
            check_channel_sets([bad], [4])


def test_slices_and_channel_sets_in_one_round(ray_local, tmp_path, channels):
    """Odd clients train random channels, even ones their leading slice: one round mixes both shapes through the
    server (the kernel, the per-layer coverage), on local and Ray alike."""
    (tmp_path / "half.py").write_text(
        "from hasfl_ray import Algorithm\n"
        "from hasfl_ray.models import build_model\n"
        "from hasfl_ray.models.index_slicing import random_channel_sets\n"
        "from hasfl_ray.training.seeding import torch_generator\n\n\n"
        "class Half(Algorithm):\n"
        "    def channel_sets(self, round, client, width):\n"
        "        if client % 2 == 0:\n"
        "            return None\n"
        "        specs = build_model(self.model_name).param_specs()\n"
        "        return random_channel_sets(specs, width, torch_generator(self.config.seed, 101, round, client))\n")
    spec = f"{tmp_path / 'half.py'}:Half"
    local = run(tmp_path, "local", "--backend", "local", "--algorithm", spec)
    ray = run(tmp_path, "ray", "--backend", "ray", "--algorithm", spec)
    assert ray["params_sha256"] == local["params_sha256"]
    assert channels["params_sha256"] != local["params_sha256"]
