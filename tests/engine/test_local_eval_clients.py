"""Bounded by what is asked, and stoppable (issue 37 item 7): the end-of-run local accuracy scores every client up to
``local_eval_clients`` (default 10,000) and a seeded sample of that many beyond it (only the sample's labels are
generated, summary.json says so), ``all`` and ``off`` as asked; the first SIGINT during the pass stops the run with
the round recorded and checkpointed, and ``--resume`` ends as a run never interrupted."""

import csv
import json
import os
import signal

import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.data.synthetic import SyntheticFederatedDataset
from hasfl_ray.engine import Engine, RunConfig, evaluating
from hasfl_ray.errors import RunInterrupted
from hasfl_ray.evaluation import LOCAL_EVAL_CLIENTS
from hasfl_ray.training.seeding import STREAM_LOCAL_EVAL, numpy_rng
from hasfl_ray.engine.records import TIMINGS

SYNTHETIC = dict(backend="local", dataset="synthetic", clients=400, clients_per_round=5, rounds=2, seed=3,
                 checkpoint_every=1)


def run(tmp_path, name, **keys):
    out = tmp_path / name
    summary = Engine(RunConfig(**{**SYNTHETIC, **keys}), out_dir=str(out)).run()
    with open(out / "clients.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    return summary, rows, lines


def counting(monkeypatch):
    """The clients whose labels the local-accuracy pass has the synthetic dataset regenerate (clients.csv's
    tv_distance regenerates its own, every client's up to 10,000 clients)."""
    asked = []
    histograms = SyntheticFederatedDataset.client_label_histograms
    monkeypatch.setattr(SyntheticFederatedDataset, "client_label_histograms",
                        lambda self, clients: asked.extend(clients) or histograms(self, clients))
    return asked


def test_beyond_local_eval_clients_a_seeded_sample_is_scored_exactly_and_only_its_labels_are_made(tmp_path,
                                                                                                 monkeypatch):
    assert LOCAL_EVAL_CLIENTS == 10_000 and RunConfig().local_eval_clients == 10_000
    exact, exact_rows, _ = run(tmp_path, "all", local_eval_clients="all")
    asked = counting(monkeypatch)
    sampled, rows, _ = run(tmp_path, "sample", local_eval_clients=50)
    sample = np.sort(numpy_rng(3, STREAM_LOCAL_EVAL).choice(400, 50, replace=False))
    local_ids = [int(r["client"]) for r in rows if r["local_width"] != ""]
    assert local_ids == sample.tolist()
    assert sorted(asked) == sample.tolist()  # the sample's labels only, never every client's
    for r in rows:  # each sampled client's numbers are the exact pass's; the others' are empty
        if int(r["client"]) in set(sample.tolist()):
            assert {k: r[k] for k in r if k.startswith("local")} == \
                {k: exact_rows[int(r["client"])][k] for k in r if k.startswith("local")}
        else:
            assert r["local_accuracy"] == r["local_test_samples"] == ""
    block = sampled["local_accuracy"]
    assert block["evaluated_clients"] == 50 and block["clients"] <= 50
    assert block["sample"] == "a seeded sample of 50 of the 400 clients (local_eval_clients 50)"
    assert exact["local_accuracy"]["sample"] == "every client" and exact["local_accuracy"]["evaluated_clients"] == 400
    scored = [float(exact_rows[i]["local_accuracy"]) for i in sample if exact_rows[i]["local_accuracy"] != ""]
    assert block["mean"] == pytest.approx(np.mean(scored), abs=1e-12)
    assert sampled["params_sha256"] == exact["params_sha256"]  # evaluation only


def test_up_to_local_eval_clients_every_client_is_scored(tmp_path):
    summary, rows, _ = run(tmp_path, "exact", local_eval_clients=400)
    assert summary["local_accuracy"]["sample"] == "every client"
    assert all(r["local_width"] != "" for r in rows)


def test_off_computes_nothing_and_says_so(tmp_path, monkeypatch):
    asked = counting(monkeypatch)
    summary, rows, lines = run(tmp_path, "off", local_eval_clients="off", clients=30)
    assert summary["local_accuracy"] == summary["local_accuracy_unmasked"] == evaluating.OFF_LOCAL_ACCURACY
    assert all("local_accuracy_mean" not in line for line in lines)
    assert all(r["local_accuracy"] == "" for r in rows) and asked == []


@pytest.mark.parametrize("flags, words", [
    (["--local-eval-clients", "0"], "local_eval_clients is 0; expected a positive number"),
    (["--local-eval-clients", "some"], "local_eval_clients is 'some'; expected a positive number of clients"),
    (["--local-eval-clients", "off", "--local-eval-every", "2"], "local_eval_every is 2 but local_eval_clients is"),
])
def test_a_bad_local_eval_clients_is_one_sentence(tmp_path, flags, words):
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--quiet", "--out", str(tmp_path / "r"),
                                       *flags])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output, result.output
    assert not os.path.exists(tmp_path / "r")


def test_the_flag_reaches_the_run(tmp_path):
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--quiet", "--rounds", "1", "--dataset",
                                       "synthetic", "--clients", "40", "--local-eval-clients", "7", "--json",
                                       "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["local_accuracy"]["evaluated_clients"] == 7
    assert "local_eval_clients: 7\n" in (tmp_path / "r" / "config.yaml").read_text()


def test_a_signal_during_the_local_pass_stops_the_run_and_resume_ends_as_never_stopped(tmp_path, monkeypatch):
    plain, plain_rows, plain_lines = run(tmp_path, "plain", local_eval_clients="all", local_eval_every=1)
    monkeypatch.setattr(evaluating, "LOCAL_CHUNK", 40)
    chunks = []
    histograms = SyntheticFederatedDataset.client_label_histograms

    def signalling(self, clients):
        chunks.append(len(clients))
        if len(chunks) == 12:  # round 1's pass (round 0's took 10 chunks; label counts are made once a run)
            os.kill(os.getpid(), signal.SIGINT)
        return histograms(self, clients)

    monkeypatch.setattr(SyntheticFederatedDataset, "client_label_histograms", signalling)
    monkeypatch.setattr(evaluating, "label_counts", uncached(evaluating.label_counts))
    out = tmp_path / "stopped"
    with pytest.raises(RunInterrupted) as stopped:
        Engine(RunConfig(**{**SYNTHETIC, "local_eval_clients": "all", "local_eval_every": 1}), out_dir=str(out)).run()
    assert stopped.value.rounds_done == 2 and len(chunks) == 12  # the round recorded, the pass stopped at a chunk
    assert not (out / "summary.json").exists()
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    assert "local_accuracy_mean" not in lines[-1] and "local_accuracy_mean" in lines[0]
    monkeypatch.undo()
    resumed = Engine(RunConfig(**{**SYNTHETIC, "local_eval_clients": "all", "local_eval_every": 1}), out_dir=str(out),
                     resume=True).run()
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    strip = [{k: v for k, v in line.items() if k != "wall_s"} for line in plain_lines]
    assert [{k: v for k, v in line.items() if k != "wall_s"} for line in lines] == strip
    assert [list(line) for line in lines] == [list(line) for line in plain_lines]  # the keys in the same order
    assert {k: v for k, v in resumed.items() if k not in TIMINGS} == {k: v for k, v in plain.items() if k not in TIMINGS}
    with open(out / "clients.csv", encoding="utf-8") as handle:
        assert list(csv.DictReader(handle)) == plain_rows


def uncached(label_counts):
    """label_counts made again at every pass (a run keeps the first: a synthetic client's labels never change), so
    that the second round's pass asks the dataset too."""
    def again(engine, clients):
        engine._label_counts = None
        return label_counts(engine, clients)
    return again
