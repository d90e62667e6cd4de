"""A run that dp_epsilon or a callback's Stop ends before --rounds ends on its last round, and a last round is
evaluated whatever --test-every (--eval-every-updates) says (h52). dp_epsilon's stop is decided with the round's DP
keys, before its evaluation is asked for; a callback's, which reads the recorded line, has the round evaluated then
(metrics.jsonl completed). Before, the run's real last round went untested: summary.json's final_accuracy was an
earlier round's (not the model of params_sha256), and a stop before the first tested round was a traceback (max()
of no accuracy)."""

import json

import pytest

from hasfl_ray.callbacks import Callback, Stop
from hasfl_ray.engine import Engine, RunConfig


@pytest.fixture
def privacy_extra():
    pytest.importorskip("dp_accounting", reason="the privacy extra (dp-accounting) is not installed")

#: z = 1 on 6 clients, 3 a round: epsilon 3.9 after one update, 7.3 after two, 27.3 after eight, 30.6 after nine
DP = dict(dataset="digits", backend="local", rounds=20, clients=6, clients_per_round=3, seed=42,
          dp_noise_multiplier=1.0, local_eval_clients="off", checkpoint_every=0)


def run(tmp_path, name, callbacks=(), **kw):
    out = tmp_path / name
    summary = Engine(RunConfig(**{**DP, **kw}), out_dir=str(out), callbacks=list(callbacks)).run()
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return summary, [json.loads(line) for line in handle]


def test_the_round_dp_epsilon_ends_the_run_on_is_evaluated(tmp_path, privacy_extra):
    every, every_lines = run(tmp_path, "every", dp_epsilon=30)
    sparse, sparse_lines = run(tmp_path, "sparse", dp_epsilon=30, test_every=3)
    assert every["stopped_early"]["round"] == sparse["stopped_early"]["round"] == 7  # 8 rounds of 20
    assert [line["test_accuracy"] is None for line in sparse_lines] == \
        [True, True, False, True, True, False, True, False]  # rounds 2 and 5 ((t + 1) % 3 == 0) and the last
    assert sparse["params_sha256"] == every["params_sha256"]
    assert sparse["final_accuracy"] == every["final_accuracy"] == every_lines[-1]["test_accuracy"]
    assert sparse_lines[-1]["accuracy_at_width"] == every_lines[-1]["accuracy_at_width"]
    assert sparse["final_test_loss"] == every["final_test_loss"]


def test_a_stop_before_the_first_tested_round_has_a_summary(tmp_path, privacy_extra):
    summary, lines = run(tmp_path, "one", dp_epsilon=5, test_every=3)  # the second update would pass 5
    assert summary["stopped_early"]["round"] == 0 and len(lines) == 1
    assert summary["final_accuracy"] == summary["best_accuracy"] == lines[0]["test_accuracy"] is not None


def test_an_asynchronous_run_dp_epsilon_ends_evaluates_its_last_update(tmp_path, privacy_extra):
    summary, lines = run(tmp_path, "async", mode="async", devices="lognormal", dp_epsilon=30, eval_every_updates=4)
    last = summary["stopped_early"]["round"]
    assert (last + 1) % 4 != 0 and lines[-1]["round"] == last  # not an eval_every_updates update
    assert lines[-1]["test_accuracy"] is not None and summary["final_accuracy"] == lines[-1]["test_accuracy"]


class StopAt(Callback):
    def __init__(self, at):
        self.at = at

    def on_round_end(self, line, run):
        return Stop("enough") if line["round"] == self.at else None

    on_update = on_round_end


#: no DP: the callback's stop only
PLAIN = dict(dp_noise_multiplier=None, rounds=6)


@pytest.mark.parametrize("at", [0, 3])
def test_the_round_a_callback_stops_on_is_evaluated(tmp_path, at):
    every, every_lines = run(tmp_path, "every", [StopAt(at)], **PLAIN)
    sparse, sparse_lines = run(tmp_path, "sparse", [StopAt(at)], test_every=3, **PLAIN)
    assert sparse["stopped_early"]["round"] == at and len(sparse_lines) == at + 1
    assert sparse["params_sha256"] == every["params_sha256"]
    assert sparse_lines[-1]["test_accuracy"] == every_lines[-1]["test_accuracy"] == sparse["final_accuracy"]
    assert sparse_lines[-1]["accuracy_at_width"] == every_lines[-1]["accuracy_at_width"]
    assert [line["test_accuracy"] is None for line in sparse_lines[:-1]] == [(t + 1) % 3 != 0 for t in range(at)]


def test_the_update_a_callback_stops_an_asynchronous_run_on_is_evaluated(tmp_path):
    summary, lines = run(tmp_path, "async", [StopAt(3)], mode="async", devices="lognormal", eval_every_updates=3,
                         **PLAIN)
    assert [line["test_accuracy"] is None for line in lines] == [True, True, False, False]
    assert summary["final_accuracy"] == lines[-1]["test_accuracy"]


def test_the_round_a_callback_stops_on_is_evaluated_at_each_width(tmp_path):
    every, every_lines = run(tmp_path, "every", [StopAt(3)], eval_every=1, **PLAIN)
    sparse, sparse_lines = run(tmp_path, "sparse", [StopAt(3)], eval_every=3, **PLAIN)
    assert ["accuracy_at_width" in line for line in sparse_lines] == [False, False, True, True]
    assert sparse_lines[-1] == {**every_lines[-1], "wall_s": sparse_lines[-1]["wall_s"]}
    assert sparse["accuracy_at_width_final"] == every["accuracy_at_width_final"]
