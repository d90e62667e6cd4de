"""examples/channel_policy.py: a plug-in hands out per-layer channel index sets; the run trains and aggregates
them end to end (the fused kernel, the Ray transport), bit for bit on both backends."""

import json
import os

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


def test_channel_plugin_trains_other_channels_than_the_leading_slice(tmp_path):
    channels = run(tmp_path, "channels", "--backend", "local")
    again = run(tmp_path, "again", "--backend", "local")
    assert again["params_sha256"] == channels["params_sha256"]  # deterministic
    # The same plug-in without its channel sets trains the leading slices: another model.
    (tmp_path / "leading.py").write_text("from hasfl_ray import Algorithm\n\n\nclass Leading(Algorithm):\n"
                                         "    pass\n")
    leading = run(tmp_path, "leading", "--backend", "local", "--algorithm", f"{tmp_path / 'leading.py'}:Leading")
    assert leading["params_sha256"] != channels["params_sha256"]


def test_channel_plugin_is_bit_identical_on_ray(tmp_path):
    local = run(tmp_path, "local", "--backend", "local")
    ray = run(tmp_path, "ray", "--backend", "ray")
    assert ray["params_sha256"] == local["params_sha256"]
