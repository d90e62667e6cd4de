"""The asynchronous run mode (docs/async.md): the event loop's order and records, FedBuff and FedAsync on the server,
every built-in algorithm in it, bad values in one sentence, and resuming mid-run bit for bit."""

import csv
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.checkpoint import load_checkpoint
from hasfl_ray.errors import ConfigError

ASYNC = dict(backend="local", mode="async", devices="lognormal", clients=10, clients_per_round=4, local_epochs=1,
             seed=5, concurrency=4, buffer_size=2, rounds=6, checkpoint_every=0)


def lines(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


@pytest.fixture(scope="module")
def async_run(tmp_path_factory):
    """ASYNC's run, made once for the tests that read it: its summary and folder."""
    out = tmp_path_factory.mktemp("async") / "run"
    return Engine(RunConfig(**ASYNC), out_dir=str(out)).run(), out


def test_events_are_in_simulated_time_order_and_each_update_is_recorded(tmp_path, async_run):
    summary, run_dir = async_run
    got = lines(run_dir)
    assert [line["round"] for line in got] == list(range(6)) and [line["version"] for line in got] == list(range(1, 7))
    times = [line["sim_time_s"] for line in got]
    assert times == sorted(times) and times[0] > 0
    assert all(line["buffer_fill"] == 1.0 and line["in_flight"] <= 4 for line in got)
    assert all(0 <= line["staleness_mean"] <= line["staleness_max"] for line in got)
    assert max(line["staleness_max"] for line in got) > 0  # with C = 4 and K = 2 some update is stale
    assert all(line["test_accuracy"] is not None for line in got)  # every update evaluated by default
    assert summary["server_updates"] == 6 and summary["updates_applied"] == 12
    assert summary["clients_dispatched"] >= 12 + 4 - 2
    assert set(summary["time_to_accuracy_s"]) == {"0.5", "0.8", "0.9", "0.95"}
    with open(run_dir / "clients.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert sum(int(row["updates_sent"]) for row in rows) == 12
    stale = [float(row["mean_staleness"]) for row in rows if row["mean_staleness"]]
    assert stale and all(value >= 0 for value in stale)
    again = Engine(RunConfig(**ASYNC), out_dir=str(tmp_path / "again")).run()
    assert again["params_sha256"] == summary["params_sha256"] and lines(tmp_path / "again") == got


def test_a_client_is_dispatched_from_the_model_of_its_dispatch(tmp_path):
    """With C = K = 1 nothing is ever stale and FedBuff is FedAvg of one client a round: each update's staleness
    is 0 and the clock moves by each client's own time."""
    run = Engine(RunConfig(**{**ASYNC, "concurrency": 1, "buffer_size": 1}), out_dir=str(tmp_path / "one")).run()
    got = lines(tmp_path / "one")
    assert all(line["staleness_max"] == 0 and line["in_flight"] == 0 for line in got)
    assert all(line["round_time_s"] > 0 for line in got) and run["staleness_mean"] == 0.0


@pytest.mark.parametrize("algorithm", ["hasfl", "heterofl", "fedavg", "fedprox", "scaffold", "fjord", "fedrolex",
                                       "uniform", "random-budget"])
@pytest.mark.parametrize("rule", ["fedbuff", "fedasync"])
def test_every_algorithm_runs_asynchronously(tmp_path, algorithm, rule):
    extra = {"buffer_size": None} if rule == "fedasync" else {}
    summary = Engine(RunConfig(**{**ASYNC, **extra, "algorithm": algorithm, "async_rule": rule, "rounds": 4,
                                  "warmup": 1, "t_adapt": 1})).run()
    assert summary["server_updates"] == 4 and 0 <= summary["final_accuracy"] <= 1
    assert summary["updates_applied"] == (4 if rule == "fedasync" else 8)


def test_hasfl_adapts_per_server_update(tmp_path):
    """HAS-FL's adaptation schedule counts server updates: after warmup updates its widths move off p^max."""
    engine = Engine(RunConfig(**{**ASYNC, "algorithm": "hasfl", "rounds": 6, "warmup": 2, "t_adapt": 1}))
    engine.run()
    assert not np.array_equal(engine.algorithm.p_current, engine.p_max)


def test_fedasync_and_fedbuff_differ_and_staleness_matters(tmp_path, async_run):
    base = async_run[0]["params_sha256"]
    assert Engine(RunConfig(**{**ASYNC, "staleness": "constant"})).run()["params_sha256"] != base
    assert Engine(RunConfig(**{**ASYNC, "async_rule": "fedasync", "buffer_size": None})).run()["params_sha256"] != base


def test_evaluation_every_n_updates_or_s_seconds(tmp_path):
    Engine(RunConfig(**{**ASYNC, "eval_every_updates": 4}), out_dir=str(tmp_path / "n")).run()
    assert [line["test_accuracy"] is not None for line in lines(tmp_path / "n")] == [False] * 3 + [True] + \
        [False, True]
    Engine(RunConfig(**{**ASYNC, "eval_every_seconds": 1e9}), out_dir=str(tmp_path / "s")).run()
    assert [line["test_accuracy"] is not None for line in lines(tmp_path / "s")] == [False] * 5 + [True]


def test_availability_and_dropout_in_async(tmp_path):
    summary = Engine(RunConfig(**{**ASYNC, "availability": "markov:2,2", "dropout": 0.3, "rounds": 5}),
                     out_dir=str(tmp_path / "run")).run()
    assert summary["server_updates"] == 5 and summary["dropped_updates"] > 0


@pytest.mark.parametrize("values, words", [
    (dict(mode="async", devices=None), "mode is 'async' but devices is unset"),
    (dict(concurrency=0), "concurrency is 0; expected a positive integer"),
    (dict(concurrency=4, buffer_size=5), "buffer_size is 5 but concurrency is 4"),
    (dict(staleness="polynomial:-0.5"), "staleness is 'polynomial:-0.5'"),
    (dict(staleness="hinge:1"), "staleness is 'hinge:1'"),
    (dict(async_rule="fedasync", async_alpha=1.5, buffer_size=None), "async_alpha is 1.5"),
    (dict(async_alpha=0.5), "async_alpha is 0.5 but async_rule is 'fedbuff'"),
    (dict(mode="sync", concurrency=3), "concurrency is 3 but mode is 'sync'"),
    (dict(deadline=2.0), "deadline is 2.0 but mode is 'async'"),
    (dict(concurrency=11), "concurrency is 11 but clients is 10"),
])
def test_bad_values_are_one_sentence(values, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")) as error:
        RunConfig(**{**ASYNC, **values})
    assert str(error.value).count(". ") == 0 and "\n" not in str(error.value)


@pytest.mark.parametrize("flags, words", [
    (["--concurrency", "0", "--devices", "lognormal"], "concurrency is 0"),
    (["--concurrency", "2", "--buffer-size", "3", "--devices", "lognormal"], "buffer_size is 3 but concurrency is 2"),
    (["--staleness", "polynomial:-1", "--devices", "lognormal"], "staleness is 'polynomial:-1'"),
    ([], "mode is 'async' but devices is unset"),
])
def test_bad_values_exit_2_at_the_cli(tmp_path, flags, words):
    result = CliRunner().invoke(main, ["simulate", "--mode", "async", "--backend", "local", "--quiet", "--out",
                                       str(tmp_path / "run"), *flags])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("rule", ["fedbuff", "fedasync"])
def test_resume_mid_run_is_bit_identical(tmp_path, monkeypatch, crash_async_at, rule):
    config = RunConfig(**{**ASYNC, "async_rule": rule, "buffer_size": None if rule == "fedasync" else 2,
                          "rounds": 7, "checkpoint_every": 2, "algorithm": "scaffold"})
    reference = Engine(config, out_dir=str(tmp_path / "reference")).run()
    crash_async_at(5)
    with pytest.raises(KeyboardInterrupt):
        Engine(config, out_dir=str(tmp_path / "run")).run()
    monkeypatch.undo()
    saved = load_checkpoint(str(tmp_path / "run"))
    assert saved.round == 4 and saved.clock["async"]["in_flight"]  # clients in flight kept with their updates
    resumed = Engine(config, out_dir=str(tmp_path / "run"), resume=True).run()
    assert resumed["params_sha256"] == reference["params_sha256"]
    assert lines(tmp_path / "run") == lines(tmp_path / "reference")
    assert (tmp_path / "run" / "clients.csv").read_text() == (tmp_path / "reference" / "clients.csv").read_text()


STALE_POLICY = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "stale_policy.py") + ":StalePolicy"


def test_the_example_stale_policy_narrows_widths_and_resumes(tmp_path, monkeypatch, crash_async_at):
    """examples/stale_policy.py reads the staleness and dispatch times the Algorithm API gives an asynchronous run:
    with a tight max_staleness its updates are narrower and less stale than HAS-FL's p^max, and it resumes bit for
    bit (its state holds what it learnt of the arrivals)."""
    config = dict(ASYNC, concurrency=6, buffer_size=2, rounds=8, clients=12, algorithm=STALE_POLICY,
                  algorithm_options={"max_staleness": 0.5}, checkpoint_every=3, tier_counts=[0, 0, 6, 6])
    policy = Engine(RunConfig(**config), out_dir=str(tmp_path / "policy")).run()
    plain = Engine(RunConfig(**{**config, "algorithm": "heterofl", "algorithm_options": {}})).run()
    assert policy["avg_p"] < plain["avg_p"]
    assert policy["staleness_mean"] <= plain["staleness_mean"]
    crash_async_at(5)
    with pytest.raises(KeyboardInterrupt):
        Engine(RunConfig(**config), out_dir=str(tmp_path / "run")).run()
    monkeypatch.undo()
    resumed = Engine(RunConfig(**config), out_dir=str(tmp_path / "run"), resume=True).run()
    assert resumed["params_sha256"] == policy["params_sha256"]


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path):
    """As the synchronous kill test (tests/engine/test_checkpoint.py): SIGKILL an asynchronous FedAsync run after a
    few server updates, resume it from its checkpoint (clients in flight, buffer, event queue, kept versions)."""
    import signal
    import subprocess
    import sys
    import time

    args = ["simulate", "--backend", "local", "--mode", "async", "--async-rule", "fedasync", "--devices",
            "lognormal", "--concurrency", "4", "--rounds", "24", "--local-epochs", "1", "--clients", "8",
            "--clients-per-round", "4", "--seed", "11", "--checkpoint-every", "3", "--quiet"]
    killed = str(tmp_path / "killed")
    process = subprocess.Popen([sys.executable, "-c", "from hasfl_ray.cli.main import main; main()", *args,
                                "--out", killed], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = os.path.join(killed, "metrics.jsonl")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if os.path.exists(metrics) and sum(1 for _ in open(metrics, encoding="utf-8")) >= 7:
            break
        time.sleep(0.02)
    assert process.poll() is None, process.stderr.read().decode()
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    process.stderr.close()
    assert not os.path.exists(os.path.join(killed, "summary.json"))
    assert load_checkpoint(killed).round % 3 == 0 and load_checkpoint(killed).round >= 6
    runner = CliRunner()
    resumed = runner.invoke(main, ["simulate", "--out", killed, "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    reference = runner.invoke(main, args + ["--out", str(tmp_path / "reference")])
    assert reference.exit_code == 0, reference.output
    with open(os.path.join(killed, "summary.json"), encoding="utf-8") as a, \
            open(tmp_path / "reference" / "summary.json", encoding="utf-8") as b:
        assert json.load(a)["params_sha256"] == json.load(b)["params_sha256"]
    assert lines(killed) == lines(tmp_path / "reference")
