"""`plot`'s convergence figure of runs that do not evaluate every round (`--test-every`, issue 46): the evaluated
rounds are joined by the line (a round without test_accuracy used to be a NaN between them, so a run tested every
3rd round drew an empty panel), and a run evaluated once draws a point."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.analysis import plots
from hasfl_ray.cli.main import main

TINY = ["--backend", "local", "--clients", "6", "--clients-per-round", "3", "--quiet",
        "--local-eval-clients", "off", "--checkpoint-every", "0"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def drawn(monkeypatch):
    """{figure file name: [(x, y, marker) of each line of each axes]} of every figure written while the test runs."""
    seen = {}
    save = plots._save

    def recording(fig, out_dir, name, fmt="png"):
        seen[name] = [[(np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float), line.get_marker())
                       for line in ax.get_lines()] for ax in fig.axes]
        return save(fig, out_dir, name, fmt)

    monkeypatch.setattr(plots, "_save", recording)
    return seen


def evaluated(run_dir):
    """{1-based round: test_accuracy in %} of the rounds metrics.jsonl evaluated."""
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    return {line["round"] + 1: 100 * line["test_accuracy"] for line in lines if line["test_accuracy"] is not None}


def test_a_run_tested_every_third_round_draws_a_line_through_its_evaluated_rounds(tmp_path, drawn):
    runs = tmp_path / "runs"
    for seed in (1, 2):
        result = invoke("simulate", *TINY, "--rounds", 5, "--test-every", 3, "--seed", seed,
                        "--out", runs / f"s{seed}")
        assert result.exit_code == 0, result.output
    result = invoke("plot", runs, "--out", tmp_path / "figures")
    assert result.exit_code == 0, result.output
    acc_ax, loss_ax = drawn["digits-convergence.png"]
    (x, y, _), = acc_ax
    seeds = [evaluated(runs / "s1"), evaluated(runs / "s2")]
    assert sorted(seeds[0]) == sorted(seeds[1]) == [3, 5]  # (t + 1) % 3 == 0, and the last
    assert list(x) == [3, 5] and np.isfinite(y).all()  # two finite neighbours: a visible segment
    assert np.allclose(y, [np.mean([s[r] for s in seeds]) for r in (3, 5)])
    (x, y, _), = loss_ax
    assert list(x) == [3, 5] and np.isfinite(y).all()


def test_a_run_tested_only_after_its_last_round_draws_a_point(tmp_path, drawn):
    # --test-every larger than --rounds: the last round is the only one evaluated
    result = invoke("simulate", *TINY, "--rounds", 3, "--test-every", 10, "--out", tmp_path / "runs" / "one")
    assert result.exit_code == 0, result.output
    assert sorted(evaluated(tmp_path / "runs" / "one")) == [3]
    result = invoke("plot", tmp_path / "runs", "--out", tmp_path / "figures")
    assert result.exit_code == 0, result.output
    (x, y, marker), = drawn["digits-convergence.png"][0]
    assert list(x) == [3] and np.isfinite(y).all() and marker == "o"  # a lone point needs a marker to be seen
