"""The clients' training loss in a run's records (issue 45 item 5): metrics.jsonl's ``train_loss`` is the mean of
the round's accepted clients' losses, ``train_loss_by_client`` each one's, clients.csv's ``train_loss`` each client's
at the last round it trained and summary.json's ``final_train_loss`` the last round's; every training path (one at
a time, the static-buffer step, batched, mixed) reports the same losses, and recording them changes no result."""

import csv
import json
import math

import pytest

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.losses import last_losses, loss_keys
from hasfl_ray.training.result import ClientResult

RUN = dict(backend="local", rounds=3, clients=6, clients_per_round=3, seed=3)


def spied_run(tmp_path, **options):
    """Run ``RUN`` + ``options`` into tmp_path/run, keeping each round's accepted results as the backend returns them."""
    engine = Engine(RunConfig(**{**RUN, **options}), out_dir=str(tmp_path / "run"))
    engine.prepare()
    rounds = []
    original = engine.backend.run_round

    def spy(tasks, weights, server_lr):
        results, aggregate = original(tasks, weights, server_lr)
        rounds.append([(r.client, r.loss, r.steps) for r in results])
        return results, aggregate

    engine.backend.run_round = spy
    summary = engine.run()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    with open(tmp_path / "run" / "clients.csv") as handle:
        clients = list(csv.DictReader(handle))
    return summary, lines, clients, rounds


def test_the_records_hold_the_clients_own_losses(tmp_path):
    summary, lines, clients, rounds = spied_run(tmp_path)
    assert len(rounds) == len(lines) == 3
    last = {}
    for line, results in zip(lines, rounds):
        assert results and all(steps > 0 and math.isfinite(loss) and loss > 0 for _, loss, steps in results)
        assert line["train_loss_by_client"] == {str(client): loss for client, loss, _ in sorted(results)}
        assert line["train_loss"] == pytest.approx(sum(loss for _, loss, _ in results) / len(results), rel=1e-12)
        last.update({client: loss for client, loss, _ in results})
    for row in clients:
        client = int(row["client"])
        assert row["train_loss"] == (repr(last[client]) if client in last else "")
    assert summary["final_train_loss"] == lines[-1]["train_loss"]
    # the loss goes down over the rounds on the digits (a real training loss, not a constant)
    assert lines[-1]["train_loss"] < lines[0]["train_loss"]


PATHS = [dict(client_batching="off", cuda_graphs="off"), dict(client_batching="off", cuda_graphs="on"),
         dict(client_batching="on", cuda_graphs="off"), dict(client_batching="mixed", cuda_graphs="off")]


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    summary, lines, clients, _ = spied_run(tmp_path_factory.mktemp("eager"), **PATHS[0])
    return summary, lines, clients


@pytest.mark.parametrize("path", PATHS[1:], ids=["static-step", "batched", "mixed"])
def test_every_training_path_reports_the_same_losses(tmp_path, eager, path):
    reference, reference_lines, reference_clients = eager
    summary, lines, clients, _ = spied_run(tmp_path, **path)
    for ours, theirs in zip(lines, reference_lines):
        assert set(ours["train_loss_by_client"]) == set(theirs["train_loss_by_client"])
        for client, loss in theirs["train_loss_by_client"].items():
            assert ours["train_loss_by_client"][client] == pytest.approx(loss, rel=1e-5)
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-5)
    for ours, theirs in zip(clients, reference_clients):
        assert (ours["train_loss"] == "") == (theirs["train_loss"] == "")
        if theirs["train_loss"]:
            assert float(ours["train_loss"]) == pytest.approx(float(theirs["train_loss"]), rel=1e-5)


def test_recording_the_loss_changes_no_result(tmp_path):
    """The same run with and without a run directory (and so without metrics.csv, clients.csv): one params_sha256."""
    written, _, _, _ = spied_run(tmp_path)
    assert Engine(RunConfig(**RUN)).run()["params_sha256"] == written["params_sha256"]


def test_an_asynchronous_run_records_the_loss_of_each_server_update(tmp_path):
    summary, lines, clients, _ = spied_run(tmp_path, mode="async", devices="lognormal", concurrency=4, buffer_size=2,
                                           rounds=4)
    assert len(lines) == 4
    for line in lines:
        losses = line["train_loss_by_client"]
        assert 1 <= len(losses) <= 2 and line["train_loss"] == pytest.approx(sum(losses.values()) / len(losses))
    assert any(row["train_loss"] for row in clients)


def result(client, loss, steps):
    return ClientResult(client, 1.0, {}, 10, loss, steps)


def test_a_client_without_a_local_step_has_no_loss():
    keys = loss_keys([result(4, 2.0, 3), result(1, 0.0, 0), result(2, 1.0, 1)])
    assert keys == {"train_loss": 1.5, "train_loss_by_client": {"2": 1.0, "4": 2.0}}
    assert loss_keys([result(1, 0.0, 0)]) == {"train_loss": None, "train_loss_by_client": {}}


def test_clients_csv_keeps_each_clients_last_loss():
    history = [{"train_loss_by_client": {"0": 3.0, "2": 2.5}}, {}, {"train_loss_by_client": {"2": 1.5}}]
    column = last_losses(history, 4)
    assert column[0] == 3.0 and column[2] == 1.5 and math.isnan(column[1]) and math.isnan(column[3])
