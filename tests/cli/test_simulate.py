"""`hasfl-ray simulate`: a real run from the command line, and bad input ending in one sentence, exit 2."""

import json
import os

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main


def run(args):
    return CliRunner().invoke(main, args)


def test_simulate_writes_run_directory(tmp_path):
    out = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text("rounds: 5\nseed: 7\nclients: 10\n")
    result = run(["simulate", "--backend", "local", "--config", str(config), "--clients-per-round", "4",
                  "--rounds", "2", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2  # the flag overrides the YAML
    assert "clients: 10" in (out / "config.yaml").read_text()
    again = run(["simulate", "--backend", "local", "--rounds", "1", "--out", str(out), "--quiet"])
    assert again.exit_code == 2 and "already holds a run" in again.output


@pytest.mark.parametrize("args, needle", [
    (["--dataset", "imagenet"], "dataset is 'imagenet'"),
    (["--algorithm", "magic"], "algorithm is 'magic'"),
    (["--rounds", "0"], "rounds is 0"),
    (["--clients", "4", "--clients-per-round", "5"], "clients_per_round is 5"),
    (["--alpha", "0"], "alpha is 0"),
    (["--alpha", "-2"], "alpha is -2"),
    (["--p-min", "1.5"], "p_min is 1.5"),
    (["--config", "/nonexistent/c.yaml"], "cannot be read"),
])
def test_bad_input_exit_2_one_sentence_no_run_directory(tmp_path, args, needle):
    out = tmp_path / "run"
    result = run(["simulate", "--backend", "local", "--out", str(out), "--quiet"] + args)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output
    assert not os.path.exists(out)


def test_malformed_and_unknown_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    result = run(["simulate", "--config", str(bad), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "not valid YAML" in result.output
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("rounds: 2\nlearning_rate: 0.1\n")
    result = run(["simulate", "--config", str(unknown), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "unknown key 'learning_rate'" in result.output
    assert not os.path.exists(tmp_path / "r")
