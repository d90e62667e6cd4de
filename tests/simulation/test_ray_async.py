"""The asynchronous mode on Ray (docs/async.md): events ordered by (simulated time, client id) in the driver and
every client trained from the model of its dispatch, so one and two trainer actors give the local backend's
params_sha256, metrics.jsonl and clients.csv bit for bit, under FedBuff and FedAsync, and a resumed Ray run the
uninterrupted one's."""

import json

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from hasfl_ray.engine import Engine, RunConfig  # noqa: E402

ASYNC = dict(mode="async", devices="lognormal", availability="markov:3,1", clients=8, clients_per_round=4,
             local_epochs=1, seed=7, concurrency=4, rounds=4, checkpoint_every=0, algorithm="hasfl", warmup=1,
             t_adapt=1)


def outcome(tmp_path, name, config):
    out = tmp_path / name
    summary = Engine(RunConfig(**config), out_dir=str(out)).run()
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]
    return summary["params_sha256"], lines, (out / "clients.csv").read_text()


@pytest.fixture(scope="module")
def local_outcome(tmp_path_factory):
    """``local_outcome(config)``: :func:`outcome` of ``config`` on the local backend, run once a module for each
    config (the FedBuff run the killed-trainer test compares with is the first comparison's)."""
    done = {}

    def run(config):
        key = json.dumps(config, sort_keys=True)
        if key not in done:
            done[key] = outcome(tmp_path_factory.mktemp("local"), "local", {**config, "backend": "local"})
        return done[key]

    return run


#: FedBuff's server learning rate and momentum, its equal-weight form and FedAsync's local proximal term.
SERVER_OPTIONS = dict(server_lr=0.8, server_momentum=0.9, aggregation_weights="count", async_rho=0.2)


@pytest.mark.parametrize("rule, buffer, options", [("fedbuff", 2, {}), ("fedasync", None, {}),
                                                   ("fedbuff", 2, SERVER_OPTIONS)])
def test_local_equals_ray_with_one_and_two_actors(ray_local, local_outcome, tmp_path, rule, buffer, options):
    config = {**ASYNC, "async_rule": rule, "buffer_size": buffer, **options}
    local = local_outcome(config)
    assert outcome(tmp_path, "ray1", {**config, "backend": "ray", "actors": 1}) == local
    assert outcome(tmp_path, "ray2", {**config, "backend": "ray", "actors": 2}) == local  # the server in the driver
    assert outcome(tmp_path, "ray2-actor", {**config, "backend": "ray", "actors": 2, "server_placement": "actor"}) == local
    assert max(line["staleness_max"] for line in local[1]) > 0


@pytest.mark.parametrize("rule, options, before, after", [("fedasync", {}, "driver", "actor"),
                                                          ("fedbuff", SERVER_OPTIONS, "actor", "driver")])
def test_a_ray_run_resumed_mid_run_matches(ray_local, tmp_path, monkeypatch, crash_async_at, rule, options, before,
                                           after):
    """FedAsync's kept versions, and FedBuff's server momentum buffer, go through the checkpoint on Ray too, from
    a server in the driver to one on an actor and back (--server-placement)."""
    config = {**ASYNC, "async_rule": rule, "backend": "ray", "actors": 2, "rounds": 5, "checkpoint_every": 2,
              **options}
    reference = outcome(tmp_path, "reference", config)
    crash_async_at(3)
    with pytest.raises(KeyboardInterrupt):
        Engine(RunConfig(**config, server_placement=before), out_dir=str(tmp_path / "run")).run()
    monkeypatch.undo()
    summary = Engine(RunConfig(**config, server_placement=after), out_dir=str(tmp_path / "run"), resume=True).run()
    assert summary["params_sha256"] == reference[0]
    with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as handle:
        assert [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle] == reference[1]


def test_an_asynchronous_ray_run_waits_for_ray_instead_of_handing_over():
    """A synchronous Ray run the default backend chose trains its first rounds here while Ray starts
    (HandoffBackend); an asynchronous one has no round boundary to hand its clients in flight over at, so it runs on Ray from its first dispatch."""
    from hasfl_ray.engine.factory import make_backend
    from hasfl_ray.engine.handoff import HandoffBackend
    from hasfl_ray.simulation.backend import RayBackend

    ray.shutdown()  # no Ray of this process: the synchronous run would hand over
    config = {k: v for k, v in ASYNC.items()}
    # handoff: the default backend chose Ray (a named --backend ray trains on Ray from its first round anyway)
    assert isinstance(make_backend(RunConfig(**config, backend="ray", handoff=True, device="cpu")), RayBackend)
    assert isinstance(make_backend(RunConfig(backend="ray", handoff=True, device="cpu", clients=8,
                                             clients_per_round=4)), HandoffBackend)


def test_a_trainer_killed_mid_run_is_replaced_and_its_clients_trained_again(ray_local, local_outcome, tmp_path,
                                                                            caplog):
    """--fault-inject kill-trainer@N kills the trainer dispatch N went to while it trains: the trainer is replaced,
    every client that was on it is trained again from the model of its dispatch, and the run ends with the local
    backend's bits, as a synchronous round does (tests/simulation/test_backend.py)."""
    config = {**ASYNC, "async_rule": "fedbuff", "buffer_size": 2}
    local = local_outcome(config)
    engine = Engine(RunConfig(**config, backend="ray", actors=2, fault_inject="kill-trainer@2"),
                    out_dir=str(tmp_path / "killed"))
    summary = engine.run()
    assert engine.backend.replaced_actors == 1 and engine.backend.timing.retrained_clients
    assert "training it again" in caplog.text
    killed = outcome(tmp_path, "killed-again", {**config, "backend": "ray", "actors": 2,
                                                "fault_inject": "kill-trainer@5"})
    assert summary["params_sha256"] == local[0] and killed == local


def test_a_poisoned_update_is_rejected_on_ray_as_on_the_local_backend(ray_local, tmp_path):
    config = {**ASYNC, "async_rule": "fedasync", "buffer_size": None, "fault_inject": "nan-update@3"}
    local = outcome(tmp_path, "local", {**config, "backend": "local"})
    assert sum(line["rejected_updates"] for line in local[1]) == 1
    assert outcome(tmp_path, "ray", {**config, "backend": "ray", "actors": 2}) == local
