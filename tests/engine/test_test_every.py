"""--test-every (issue 46 item 1): test_accuracy, and the sBN statistics pass it needs, only on every K-th round and
the last; the other rounds' lines hold null, the trained model is the same (params_sha256), and an evaluated round's
figures are those of a run that evaluates every round."""

import json

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine import engine as engine_module
from hasfl_ray.engine import server as server_module
from hasfl_ray.errors import ConfigError

#: Every run here names its backend: the tests mind no Ray already running in this process, so the shared Ray of the
#: module before is kept into this one (tests/conftest.py).
RAY_MAY_ALREADY_RUN = True

#: HeteroFL's pre-activation ResNet with static BatchNorm on the digits: every evaluation runs a statistics pass.
SBN = dict(dataset="digits", model="preresnet18", clients=6, clients_per_round=3, rounds=3, seed=3, backend="local",
           eval_widths=[0.5, 1.0], eval_every=1, local_eval_clients="off", checkpoint_every=0)


def lines_of(run_dir):
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


def run_counting_passes(tmp_path, monkeypatch, name, **kw):
    """A run, with the rounds during which the server ran an sBN statistics pass."""
    passes, current = [], {"round": None}
    original_pass, original_round = server_module.sbn_statistics, engine_module.Engine.run_round

    def counted_pass(model, batches):
        passes.append(current["round"])
        return original_pass(model, batches)

    def tracked_round(self, t, *args, **kwargs):
        current["round"] = t
        return original_round(self, t, *args, **kwargs)

    monkeypatch.setattr(server_module, "sbn_statistics", counted_pass)
    monkeypatch.setattr(engine_module.Engine, "run_round", tracked_round)
    out = tmp_path / name
    summary = Engine(RunConfig(**{**SBN, **kw}), out_dir=str(out)).run()
    monkeypatch.undo()
    return summary, lines_of(out), passes


def test_test_every_skips_the_statistics_pass_and_keeps_the_model(tmp_path, monkeypatch):
    every, every_lines, every_passes = run_counting_passes(tmp_path, monkeypatch, "every", test_every=1)
    sparse, sparse_lines, sparse_passes = run_counting_passes(tmp_path, monkeypatch, "sparse", test_every=2)
    assert sparse["params_sha256"] == every["params_sha256"]
    # every round evaluates (and calibrates) widths 1 and 0.5 with test_every 1; round 0 nothing with test_every 2
    assert sorted(set(every_passes)) == [0, 1, 2] and 0 not in sparse_passes and {1, 2} <= set(sparse_passes)
    assert len(sparse_passes) < len(every_passes)
    assert sparse_lines[0]["test_accuracy"] is None and sparse_lines[0]["test_loss"] is None
    assert "accuracy_at_width" not in sparse_lines[0]
    for t in (1, 2):  # round 1 ((1 + 1) % 2 == 0) and the last: what the run evaluating every round recorded
        assert sparse_lines[t] == every_lines[t]
    for t in (0, 1, 2):  # everything but the evaluation is the same on every line
        drop = ("test_accuracy", "test_loss", "accuracy_at_width", "loss_at_width")
        assert {k: v for k, v in sparse_lines[t].items() if k not in drop} == \
            {k: v for k, v in every_lines[t].items() if k not in drop}
    assert sparse["final_accuracy"] == every["final_accuracy"]


def test_the_last_round_is_always_tested_and_the_default_tests_every_round():
    assert RunConfig().test_every == 1
    assert RunConfig(test_every=7).test_every == 7


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "3"])
def test_a_bad_test_every_is_one_sentence(value):
    with pytest.raises(ConfigError, match=r"^test_every is .*; expected a positive integer[^\n]*$"):
        RunConfig(test_every=value)


def test_test_every_is_refused_with_async_mode_in_one_sentence():
    with pytest.raises(ConfigError, match=r"^test_every is 3 but mode is 'async', which does not take it; "
                                          r"expected 1 \(an asynchronous run evaluates every eval_every_updates"):
        RunConfig(mode="async", devices="lognormal", test_every=3)


def test_the_flag_reaches_the_run(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "3", "--clients", "4",
                                       "--clients-per-round", "2", "--test-every", "2", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert [line["test_accuracy"] is None for line in lines_of(out)] == [True, False, False]
    bad = CliRunner().invoke(main, ["simulate", "--backend", "local", "--test-every", "0", "--out",
                                    str(tmp_path / "bad"), "--quiet"])
    assert bad.exit_code == 2 and "test_every is 0" in bad.output and "Traceback" not in bad.output
    assert not (tmp_path / "bad").exists()


def test_two_ray_actors_write_the_local_backends_lines(ray_local, tmp_path):
    kw = dict(dataset="digits", rounds=4, clients=6, clients_per_round=3, seed=5, test_every=2, eval_every=1,
              local_eval_every=1, checkpoint_every=0)
    Engine(RunConfig(backend="local", **kw), out_dir=str(tmp_path / "local")).run()
    Engine(RunConfig(backend="ray", actors=2, **kw), out_dir=str(tmp_path / "ray")).run()
    local, remote = lines_of(tmp_path / "local"), lines_of(tmp_path / "ray")
    assert remote == local  # the untested rounds' null lines included, deferred or not
    assert [line["test_accuracy"] is None for line in local] == [True, False, True, False]
    assert all("local_accuracy_mean" in line for line in local)  # its own cadence, on untested rounds too


def test_a_run_interrupted_after_an_untested_round_resumes_bit_for_bit(tmp_path):
    # h52: --resume refused the run's own checkpoint ("its history line 0 has test_accuracy None, not a number"):
    # the checkpoint check allowed a null test_accuracy on an asynchronous line only
    run = ["simulate", "--backend", "local", "--rounds", "6", "--clients", "6", "--clients-per-round", "3",
           "--test-every", "3", "--checkpoint-every", "1", "--local-eval-clients", "off", "--quiet"]
    whole = CliRunner().invoke(main, run + ["--out", str(tmp_path / "whole")])
    assert whole.exit_code == 0, whole.output
    out = tmp_path / "run"
    crashed = CliRunner().invoke(main, run + ["--fault-inject", "trainer-error@4", "--out", str(out)])
    assert crashed.exit_code == 1 and "injected trainer failure" in crashed.output, crashed.output
    assert [line["test_accuracy"] is None for line in lines_of(out)] == [True, True, False, True]  # round 3: none
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert lines_of(out) == lines_of(tmp_path / "whole")
    summaries = [json.loads((d / "summary.json").read_text()) for d in (out, tmp_path / "whole")]
    assert summaries[0]["params_sha256"] == summaries[1]["params_sha256"]


def test_a_run_whose_test_every_changes_at_each_resume_resumes_again(tmp_path):
    # test_every is an execution field (it may change on --resume): the checkpoint's config at one save cannot say
    # which earlier lines were tested, so a cadence read from it refused the second resume
    run = ["simulate", "--backend", "local", "--rounds", "6", "--clients", "6", "--clients-per-round", "3",
           "--checkpoint-every", "1", "--local-eval-clients", "off", "--quiet"]
    out = tmp_path / "run"
    assert CliRunner().invoke(main, run + ["--test-every", "3", "--fault-inject", "trainer-error@4",
                                           "--out", str(out)]).exit_code == 1
    again = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet", "--test-every", "1",
                                      "--fault-inject", "trainer-error@5"])
    assert again.exit_code == 1 and "injected trainer failure" in again.output, again.output
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert [line["test_accuracy"] is None for line in lines_of(out)] == [True, True, False, True, False, False]


def test_a_checkpoint_line_with_half_an_evaluation_is_still_refused():
    from hasfl_ray.engine.rundir import METRIC_KEYS, history_line_problem

    line = dict({key: 0.5 for key in METRIC_KEYS}, round=0)
    assert history_line_problem(dict(line, test_accuracy=None, test_loss=None), 0) is None  # not evaluated
    assert history_line_problem(dict(line, test_accuracy=None), 0) == "has test_accuracy None, not a number"
    assert history_line_problem(dict(line, test_loss=None), 0) == "has test_loss None, not a number"
    assert history_line_problem(dict(line, avg_p=None, test_accuracy=None, test_loss=None), 0) == \
        "has avg_p None, not a number"
