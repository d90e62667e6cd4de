"""--test-phase (issue 46 item 1: a protocol states its source's evaluation cadence and uses it): the paper's own
figures (paper/hasfl-paper.tex, Figure 3 ``fig:rq1_convergence``, Figure 7 and Figure 8: every accuracy and loss
curve's ``\\addplot`` coordinates) sample CIFAR-10 and EMNIST at rounds 0, 5, 10, ..., 195 and 199 of 200 (0-based):
every 5th round from the first, and the last. ``test_every: 5`` alone gives 4, 9, ..., 199; ``test_phase: 1`` puts
both cadences through the first round (1-based rounds t with t % K == 1 % K). The model is the same and an evaluated round's figures are those of a
run that evaluates every round."""

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.evaluation import evaluation_round, is_eval_round

RUN = dict(dataset="digits", clients=6, clients_per_round=3, rounds=7, seed=5, backend="local", eval_widths=[0.5, 1.0],
           local_eval_clients="off", checkpoint_every=0)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

#: The x values of every curve of the paper's Figures 3, 7 and 8 (0-based rounds of T = 200).
PAPER_ROUNDS = list(range(0, 200, 5)) + [199]


def lines(out):
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


def test_the_papers_cadence_is_every_fifth_round_from_the_first_and_the_last():
    rounds = [evaluation_round(t, 200, 5, 5, test_phase=1) for t in range(200)]
    assert [t for t, (tested, _) in enumerate(rounds) if tested] == PAPER_ROUNDS
    assert [t for t, (_, widths) in enumerate(rounds) if widths] == PAPER_ROUNDS
    # unset, each cadence counts from its own period, as before
    assert [t for t in range(200) if evaluation_round(t, 200, 5, 5)[0]] == list(range(4, 200, 5))
    assert [t for t in range(10) if is_eval_round(t, 10, 3, None)] == [2, 5, 8, 9]
    assert [t for t in range(10) if is_eval_round(t, 10, 3, 2)] == [1, 4, 7, 9]
    assert [t for t in range(10) if is_eval_round(t, 10, 0, 1)] == [9]
    # a phase, not a start: every round at K = 1 whatever the phase, and a phase of K is the default
    assert all(evaluation_round(t, 30, 1, 5, test_phase=5)[0] for t in range(30))
    assert [t for t in range(30) if evaluation_round(t, 30, 1, 5, test_phase=5)[1]] == list(range(4, 30, 5))
    assert [t for t in range(12) if is_eval_round(t, 12, 4, 7)] == [2, 6, 10, 11]


def test_the_paper_configs_state_the_papers_cadence():
    for name in ("paper-emnist", "paper-cifar10"):
        with open(CONFIGS / f"{name}.yaml", encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
        assert (raw["test_every"], raw["eval_every"], raw["test_phase"], raw["rounds"]) == (5, 5, 1, 200), name


def test_an_evaluated_rounds_figures_are_those_of_a_run_evaluating_every_round(tmp_path):
    every = Engine(RunConfig(**RUN, eval_every=1), out_dir=str(tmp_path / "every")).run()
    cadence = Engine(RunConfig(**RUN, test_every=3, eval_every=3, test_phase=1), out_dir=str(tmp_path / "start")).run()
    assert cadence["params_sha256"] == every["params_sha256"]
    full, thin = lines(tmp_path / "every"), lines(tmp_path / "start")
    evaluated = [t for t, line in enumerate(thin) if line["test_accuracy"] is not None]
    assert evaluated == [0, 3, 6]
    for t in range(7):
        if t in evaluated:
            assert thin[t] == full[t] and set(thin[t]["accuracy_at_width"]) == {"0.5", "1"}
        else:
            assert thin[t]["test_loss"] is None and "accuracy_at_width" not in thin[t]


def test_the_default_changes_nothing():
    assert RunConfig(**RUN).test_phase is None


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "1"])
def test_a_bad_value_is_one_sentence(value):
    with pytest.raises(ConfigError, match="^test_phase is .*; expected a positive integer") as caught:
        RunConfig(**{**RUN, "test_phase": value})
    assert "\n" not in str(caught.value)


def test_the_flag_reaches_the_run_and_async_mode_refuses_it(tmp_path):
    out = tmp_path / "cli"
    result = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--rounds", "6", "--clients", "4",
                                       "--clients-per-round", "2", "--test-every", "2", "--test-phase", "1",
                                       "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert [t for t, line in enumerate(lines(out)) if line["test_accuracy"] is not None] == [0, 2, 4, 5]
    bad = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--rounds", "2", "--test-phase", "0",
                                    "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "test_phase is 0" in bad.output and not (tmp_path / "bad").exists()
    refused = CliRunner().invoke(main, ["simulate", "--mode", "async", "--devices", "lognormal", "--dataset",
                                        "digits", "--rounds", "2", "--test-phase", "1", "--out",
                                        str(tmp_path / "async")])
    assert refused.exit_code == 2 and "test_phase is 1 but mode is 'async'" in refused.output
    assert not (tmp_path / "async").exists()
