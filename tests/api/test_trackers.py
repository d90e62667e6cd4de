"""Experiment trackers (hasfl_ray/trackers.py; issue 45 item 4): MLflow against a real local ``mlflow server`` with a
SQLite store that the test starts, W&B in offline mode, both from the Python API and the CLI's ``--track``; every
round's numbers logged at its step, the summary at the end, and results unchanged."""

import glob
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import hasfl_ray
from hasfl_ray.errors import ConfigError
from hasfl_ray.trackers import make_trackers, scalars

SMALL = dict(backend="local", clients=6, clients_per_round=3, seed=3, local_epochs=1, rounds=2, progress=False)
BIN = os.path.dirname(sys.executable)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    pytest.importorskip("mlflow", reason="needs mlflow (requirements-dev.txt)")
    folder = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = open(folder / "server.log", "w")
    server = subprocess.Popen([os.path.join(BIN, "mlflow"), "server", "--backend-store-uri",
                               f"sqlite:///{folder / 'store.db'}", "--default-artifact-root", str(folder / "artifacts"),
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):  # the server's start (its database migrations) takes 10-30 s on 2 cores
            if server.poll() is not None:
                pytest.fail(f"mlflow server exited: {(folder / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not answer /health within 120 s")
        yield url
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)
        log.close()


def test_mlflow_gets_every_round_and_the_summary(mlflow_server, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "api-test")
    result = hasfl_ray.simulate(out_dir=str(tmp_path / "tracked"), track=["mlflow"], **SMALL)
    plain = hasfl_ray.simulate(**SMALL)
    assert result["params_sha256"] == plain["params_sha256"]
    client = MlflowClient(mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("api-test").experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert run.data.params["algorithm"] == "hasfl" and run.data.params["rounds"] == "2"
    for key in ("test_accuracy", "avg_p", "coverage"):
        logged = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        assert logged == [(line["round"], pytest.approx(line[key], rel=1e-12)) for line in result.history], key
    assert run.data.metrics["summary/final_accuracy"] == pytest.approx(result["final_accuracy"], rel=1e-12)


def test_the_cli_tracks_to_mlflow(mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    env = dict(os.environ, MLFLOW_TRACKING_URI=mlflow_server, MLFLOW_EXPERIMENT_NAME="cli-test")
    out = str(tmp_path / "cli")
    done = subprocess.run([os.path.join(BIN, "hasfl-ray"), "simulate", "--backend", "local", "--rounds", "2",
                           "--clients", "6", "--clients-per-round", "3", "--quiet", "--out", out, "--track", "mlflow"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    client = MlflowClient(mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name("cli-test").experiment_id])
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "test_accuracy")] == \
        pytest.approx([line["test_accuracy"] for line in lines], rel=1e-12)


def test_wandb_offline_writes_every_round(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="needs wandb (requirements-dev.txt)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    result = hasfl_ray.simulate(out_dir=str(tmp_path / "wb"), track=["wandb"], **SMALL)
    (record,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    final = json.dumps(result["final_accuracy"]).encode()
    for _ in range(120):  # wandb's own service process may still be writing the file it was handed (at most 60 s)
        data = open(record, "rb").read()  # protobuf records: keys and JSON values are stored as text
        if final in data:
            break
        time.sleep(0.5)
    for line in result.history:
        assert json.dumps(line["test_accuracy"]).encode() in data
    assert b"test_accuracy" in data and b"coverage" in data
    assert final in data


def test_an_unknown_or_missing_tracker_is_refused_before_the_run(monkeypatch):
    with pytest.raises(ConfigError, match="^track is 'neptune'; expected one of mlflow, wandb$"):
        make_trackers(["neptune"])
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ConfigError, match="^track is 'wandb' but the wandb package is not installed"):
        hasfl_ray.simulate(track=["wandb"], **SMALL)


def test_scalars_flatten_numbers_and_leave_the_rest():
    line = {"round": 3, "test_accuracy": 0.5, "frozen_by_layer": {"conv": 0.25}, "name": "x", "flag": True,
            "nan": float("nan"), "none": None}
    assert scalars(line) == {"test_accuracy": 0.5, "frozen_by_layer/conv": 0.25}
