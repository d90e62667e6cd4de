"""Local first, Ray takes over (issue 24 item 8), with Ray: a run handed over to Ray's actors at round 2 of 4 gives
the params_sha256 and metrics lines of a run on the local backend alone and of one on Ray alone (1 and 2 actors),
for HAS-FL, SCAFFOLD (control variates) and FedRolex (window offsets); the default command hands over when it starts
Ray itself (tests/simulation/test_ray_failures.py), the engine's side is tests/engine/test_handoff.py."""

import json

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from hasfl_ray.engine import Engine, RunConfig  # noqa: E402
from hasfl_ray.engine.factory import make_backend  # noqa: E402
from hasfl_ray.engine.handoff import HandoffBackend  # noqa: E402
from hasfl_ray.simulation.backend import RayBackend  # noqa: E402

SMALL = dict(rounds=4, clients=6, clients_per_round=3, seed=7)


def run(tmp_path, name, using=None, **kw):
    out = tmp_path / name
    summary = Engine(RunConfig(**{**SMALL, **kw}), out_dir=str(out), backend=using).run()
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]
    return summary, lines


@pytest.mark.parametrize("algorithm, ray_actors, placement", [("hasfl", (1, 2), "auto"), ("scaffold", (1,), "actor"),
                                                                ("fedrolex", (2,), "driver")])
def test_a_run_handed_over_to_ray_at_round_2_equals_local_and_ray_runs(ray_local, algorithm, ray_actors, placement,
                                                                       tmp_path):
    # issue 24 item 8 (the pure Ray runs: 1 and 2 actors over the three, each actor process costs seconds); the
    # server handed over to the driver (auto, on this CPU run) or to a server actor (--server-placement)
    local = run(tmp_path, "local", backend="local", algorithm=algorithm)
    inner = RayBackend()
    summary, lines = run(tmp_path, "handoff", HandoffBackend(lambda: inner, {"backend": "ray"}, takeover_round=2),
                         backend="ray", actors=2, algorithm=algorithm, server_placement=placement)
    # two trainers trained rounds 2 and 3, the server aggregated them in the driver or on its own actor
    assert summary["ray_from_round"] == 2 and len(inner.places) == (3 if placement == "actor" else 2)
    assert (summary["params_sha256"], lines) == (local[0]["params_sha256"], local[1])
    for actors in ray_actors:
        on_ray = run(tmp_path, f"ray{actors}", backend="ray", actors=actors, algorithm=algorithm)
        assert "ray_from_round" not in on_ray[0]  # Ray already runs in this process: no handoff, Ray throughout
        assert (on_ray[0]["params_sha256"], on_ray[1]) == (local[0]["params_sha256"], local[1])


def test_the_handoff_applies_only_to_a_ray_this_run_starts_on_cpu(ray_local, monkeypatch):
    # issue 24 item 8: a Ray already running (here, this process's), an address, a fault aimed at Ray, a GPU, or
    # actors that do not fit keep the run waiting for Ray before its first round
    config = RunConfig(**SMALL).resolved()  # backend auto: Ray, where it is installed
    assert config.backend == "ray" and config.handoff
    assert type(make_backend(config)) is RayBackend  # this process runs Ray
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert type(make_backend(config)) is HandoffBackend
    for waiting in (dict(address="127.0.0.1:1"), dict(fault_inject="kill-trainer@1"), dict(actors=1000),
                    dict(trainer_threads=1000)):
        assert type(make_backend(RunConfig(**SMALL, **waiting).resolved())) is RayBackend, waiting
    # issue 37 item 10: what a user names is what runs: backend ray given by name is Ray from its first round
    named = RunConfig(backend="ray", **SMALL).resolved()
    assert named.handoff is False and type(make_backend(named)) is RayBackend
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert type(make_backend(config)) is RayBackend
