"""A run that starts its own Ray with the server in the driver sends the global parameters inside the trainers'
calls (no object-store put between two rounds, hasfl_ray/simulation/server_port.py:DriverServer.params), and reads
each trainer call's results as it arrives: placement only, so the run, its checkpoints and its asynchronous mode
are the local backend's bit for bit. No ``ray_local`` fixture here: the backend must start Ray itself (a Ray
started by someone else gets the parameters through the object store, as the other Ray tests check)."""

import json

import pytest
import torch

ray = pytest.importorskip("ray", reason="needs Ray")

from hasfl_ray.engine import Engine, RunConfig  # noqa: E402
from hasfl_ray.engine.checkpoint import load_checkpoint  # noqa: E402
from hasfl_ray.simulation import server_port  # noqa: E402
from hasfl_ray.simulation.actors import Inline  # noqa: E402

SYNC = dict(dataset="digits", algorithm="hasfl", clients=8, clients_per_round=4, rounds=5, local_epochs=1, seed=5,
            checkpoint_every=2, eval_samples=120)
ASYNC = dict(mode="async", devices="lognormal", availability="markov:3,1", clients=8, clients_per_round=4,
             local_epochs=1, seed=7, concurrency=4, rounds=4, checkpoint_every=2, algorithm="hasfl", warmup=1,
             t_adapt=1, async_rule="fedbuff", buffer_size=2)


def outcome(tmp_path, name, config):
    """params_sha256, metrics.jsonl's lines (wall_s left out), and the last checkpoint's round and parameters."""
    out = tmp_path / name
    summary = Engine(RunConfig(**config), out_dir=str(out)).run()
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]
    checkpoint = load_checkpoint(str(out))
    return summary["params_sha256"], lines, checkpoint.round, checkpoint.params


@pytest.mark.parametrize("config", [SYNC, ASYNC], ids=["sync", "async"])
def test_a_run_that_starts_its_own_ray_sends_the_parameters_inside_the_calls_and_equals_local(tmp_path, monkeypatch,
                                                                                              config):
    assert not ray.is_initialized()  # else the backend would join it, and put the parameters in the store
    sent = []
    params = server_port.DriverServer.params

    def watched(self):
        carried = params(self)
        sent.append(carried)
        return carried

    monkeypatch.setattr(server_port.DriverServer, "params", watched)
    local = outcome(tmp_path, "local", {**config, "backend": "local"})
    got = outcome(tmp_path, "ray2", {**config, "backend": "ray", "actors": 2, "server_placement": "driver"})
    assert not ray.is_initialized()  # the run stopped the Ray it started
    assert sent and all(isinstance(carried, Inline) for carried in sent)
    assert [carried.version for carried in sent] == list(range(1, len(sent) + 1))
    assert got[:3] == local[:3] and local[2] > 0
    assert local[3].keys() == got[3].keys() and all(torch.equal(local[3][k], got[3][k]) for k in local[3])


def test_each_trainer_call_brings_its_report_and_results_in_one_object_to_a_server_in_the_driver(tmp_path,
                                                                                                 monkeypatch):
    """With the server in the driver, which reads every call's results as they arrive, a trainer call returns its
    report and its results as one object (one return for the trainer to store, one read for the driver): the
    driver's server is handed the packed results themselves, never a reference to read, one per call, and the run
    is still the local backend's bit for bit."""
    from hasfl_ray.simulation import transport
    from hasfl_ray.simulation.wire import Packed

    received, sent = [], []
    receive, send = server_port.DriverServer.receive, transport.Transport._send

    def watched_receive(self, result):
        received.append(result)
        return receive(self, result)

    def watched_send(self, tasks, order):
        layout, results = send(self, tasks, order)
        sent.append(len(layout))
        return layout, results

    monkeypatch.setattr(server_port.DriverServer, "receive", watched_receive)
    monkeypatch.setattr(transport.Transport, "_send", watched_send)
    config = {**SYNC, "rounds": 3, "checkpoint_every": 0}
    local = outcome_sha(tmp_path, "local", {**config, "backend": "local"})
    got = outcome_sha(tmp_path, "ray2", {**config, "backend": "ray", "actors": 2, "server_placement": "driver"})
    assert got == local
    assert len(sent) == 3 and len(received) == sum(sent) >= 3 * 2  # every call of every round, 2 trainers
    assert all(isinstance(result, Packed) for result in received)


def outcome_sha(tmp_path, name, config):
    return Engine(RunConfig(**config), out_dir=str(tmp_path / name)).run()["params_sha256"]
