"""The league table of a run shorter than FedLASE's 20-round window, or whose --local-eval-every had not come round
by a budget (h68 battery, RELIABILITY rows noted-d, noted-e): the header said "last 20 rounds" over a 2-round run,
and a budget cell said the run evaluated local accuracy "at its end only (--local-eval-every 0)" of a run given
--local-eval-every 40."""

import json

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main

SMALL = ["--backend", "local", "--rounds", "2", "--clients", "6", "--clients-per-round", "3", "--quiet",
         "--devices", "lognormal", "--algorithm", "heterofl"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("short") / "runs"
    result = CliRunner().invoke(main, ["simulate", *SMALL, "--local-eval-every", "40", "--out", str(root / "a")])
    assert result.exit_code == 0, result.output
    return root


def markdown(root, *args):
    result = CliRunner().invoke(main, ["report", str(root), *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_run_shorter_than_the_20_round_window_is_named_under_the_table(runs):
    text = markdown(runs)
    assert "| Global, last 20 rounds (%) |" in text
    note = [line for line in text.splitlines() if line.startswith("- Global, last 20 rounds:")]
    assert len(note) == 1 and "1 of the 1 rows' runs recorded fewer than 20 rounds (the fewest: 2)" in note[0], note
    rows = json.loads(CliRunner().invoke(main, ["report", str(runs), "--json"]).output)["league"]["rows"]
    assert [row["rounds"] for row in rows] == [2]


def test_local_accuracy_not_evaluated_by_a_budget_names_local_eval_every_without_a_wrong_value(runs):
    """The budget is the whole run's end minus a little: round 1 finished, local accuracy was evaluated after round 2
    only (--local-eval-every 40, not 0)."""
    metrics = [json.loads(line) for line in (runs / "a" / "metrics.jsonl").read_text().splitlines()]
    assert "local_accuracy_mean" not in metrics[0] and "local_accuracy_mean" in metrics[-1]
    budget = (metrics[0]["sim_time_s"] + metrics[1]["sim_time_s"]) / 2
    text = markdown(runs, "--budget-seconds", budget)
    assert "local not evaluated by then" in text and "--local-eval-every 0)" not in text
    assert "- local not evaluated by then: no round finished by the budget evaluated local accuracy " \
           "(--local-eval-every K: every K rounds and after the last; 0: after the last only)" in text
