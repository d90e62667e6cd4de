"""FLuID's state (thresholds, stopped flags, counter, stragglers, invariant channels, each straggler's last drops)
is in the checkpoint: a run crashed after its stragglers started dropping and resumed gives the params_sha256 of a
run never interrupted, without and with the device clock."""

import json

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main

RUN = ["simulate", "--algorithm", "fluid", "--rounds", "5", "--clients", "4", "--clients-per-round", "3",
       "--checkpoint-every", "1", "--quiet", "--backend", "local"]


def sha(out):
    return json.loads((out / "summary.json").read_text())["params_sha256"]


@pytest.mark.parametrize("extra", [[], ["--devices", "lognormal"]], ids=["lowest-pmax", "clock"])
def test_a_fluid_run_resumed_gives_the_uninterrupted_runs_model(tmp_path, extra):
    whole = tmp_path / "whole"
    done = CliRunner().invoke(main, RUN + extra + ["--out", str(whole)])
    assert done.exit_code == 0, done.output
    out = tmp_path / "run"
    crashed = CliRunner().invoke(main, RUN + extra + ["--fault-inject", "trainer-error@4", "--out", str(out)])
    assert crashed.exit_code == 1 and "injected trainer failure" in crashed.output, crashed.output
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert sha(out) == sha(whole)
    lines = [json.loads(line) for line in (whole / "metrics.jsonl").read_text().splitlines()]
    assert any(line["avg_p"] < 1.0 for line in lines[2:4])  # stragglers dropped channels before the crash
