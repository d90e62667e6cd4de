"""--test-first and --test-last (issue 46 item 1: the packs use their sources' evaluation cadence): FIARSE's
server.py (HarliWu/FIARSE, commit 7b49718, fiarse/server.py with fiarse/add_parser_arguments.py's --save-freq 20)
tests every model size when ``(t + 1) % save_freq == 0 or t == 0 or t >= T - 100``: every save_freq rounds, the
first round and each of the last 100. --test-first and --test-last add the first round and the last N to both
cadences (test_accuracy and every width); the model is the same and an evaluated round's figures are those of a run
that evaluates every round."""

import json

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.errors import ConfigError

RUN = dict(dataset="digits", clients=6, clients_per_round=3, rounds=7, seed=5, backend="local", eval_widths=[0.5, 1.0],
           local_eval_clients="off", checkpoint_every=0)


def lines(out):
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


def fiarse_rule(t, rounds, save_freq, tail):
    """FIARSE's condition, as its server.py writes it (``T`` rounds, 0-based ``t``)."""
    return (t + 1) % save_freq == 0 or t == 0 or t >= rounds - tail


def test_the_first_and_the_last_rounds_are_evaluated_as_fiarses_server_does(tmp_path):
    every = Engine(RunConfig(**RUN, eval_every=1), out_dir=str(tmp_path / "every")).run()
    cadence = dict(test_every=3, eval_every=3, test_first=True, test_last=2)
    sparse = Engine(RunConfig(**RUN, **cadence), out_dir=str(tmp_path / "sparse")).run()
    assert sparse["params_sha256"] == every["params_sha256"]
    full, thin = lines(tmp_path / "every"), lines(tmp_path / "sparse")
    evaluated = [t for t, line in enumerate(thin) if line["test_accuracy"] is not None]
    assert evaluated == [t for t in range(7) if fiarse_rule(t, 7, 3, 2)] == [0, 2, 5, 6]
    for t in range(7):
        if t in evaluated:  # the same figures as the run evaluating every round, every width included
            assert thin[t] == full[t] and set(thin[t]["accuracy_at_width"]) == {"0.5", "1"}
        else:
            assert thin[t]["test_loss"] is None and "accuracy_at_width" not in thin[t]


def test_the_defaults_change_nothing():
    config = RunConfig(**RUN)
    assert (config.test_first, config.test_last) == (False, 0)


@pytest.mark.parametrize("key,value", [("test_last", -1), ("test_last", 1.5), ("test_last", True),
                                       ("test_first", "yes"), ("test_first", 1)])
def test_a_bad_value_is_one_sentence(key, value):
    with pytest.raises(ConfigError, match=f"^{key} is .*; expected") as caught:
        RunConfig(**{**RUN, key: value})
    assert "\n" not in str(caught.value)


def test_the_flags_reach_the_run_and_async_mode_refuses_them(tmp_path):
    out = tmp_path / "cli"
    result = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--rounds", "4", "--clients", "4",
                                       "--clients-per-round", "2", "--test-every", "5", "--test-first",
                                       "--test-last", "1", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert [t for t, line in enumerate(lines(out)) if line["test_accuracy"] is not None] == [0, 3]
    refused = CliRunner().invoke(main, ["simulate", "--mode", "async", "--devices", "lognormal", "--dataset",
                                        "digits", "--rounds", "2", "--test-last", "3", "--out",
                                        str(tmp_path / "async")])
    assert refused.exit_code == 2 and "test_last is 3 but mode is 'async'" in refused.output
    assert not (tmp_path / "async").exists()


def test_a_run_resumed_with_another_tail_resumes_bit_for_bit(tmp_path):
    """test_first and test_last are execution fields: a resumed run may change them, the model stays the same."""
    whole = Engine(RunConfig(**RUN), out_dir=str(tmp_path / "whole")).run()
    runner = CliRunner()
    args = ["simulate", "--dataset", "digits", "--rounds", "7", "--clients", "6", "--clients-per-round", "3",
            "--seed", "5", "--eval-widths", "0.5", "--checkpoint-every", "1", "--out", str(tmp_path / "cut"),
            "--quiet", "--test-every", "4", "--test-last", "2"]
    first = runner.invoke(main, args + ["--fault-inject", "trainer-error@3"])
    assert first.exit_code == 1, first.output
    resumed = runner.invoke(main, args[:-4] + ["--test-first", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    with open(tmp_path / "cut" / "summary.json", encoding="utf-8") as handle:
        assert json.load(handle)["params_sha256"] == whole["params_sha256"]
