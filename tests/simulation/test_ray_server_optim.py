"""The server optimisers on Ray (docs/algorithms.md, "Server optimisers"): the moments live on the server (in the
driver or on its actor), so a synchronous and an asynchronous FedAdam run on two actors give the local backend's run
bit for bit, with the server in either place; a run handed over
to Ray at round 2 carries the moments across; a Ray run resumed from its checkpoint (written while the next round
trains) gives the uninterrupted one. A local optimiser from torch.optim gives the same bits on both backends too."""

import json

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results, result_of  # noqa: E402

from hasfl_ray.engine import Engine, RunConfig  # noqa: E402
from hasfl_ray.engine.handoff import HandoffBackend  # noqa: E402
from hasfl_ray.simulation.backend import RayBackend  # noqa: E402

SYNC = dict(rounds=4, clients=6, clients_per_round=3, local_epochs=1, seed=7, warmup=1, t_adapt=1,
            checkpoint_every=0, algorithm="hasfl", server_optimizer="fedadam")
ASYNC = dict(mode="async", devices="lognormal", clients=8, clients_per_round=4, local_epochs=1, seed=7, concurrency=4,
             buffer_size=2, rounds=4, checkpoint_every=0, algorithm="hasfl", warmup=1, t_adapt=1,
             server_optimizer="fedyogi")


def lines(out):
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


#: a local optimiser other than sgd too, with batching asked for: its clients train one at a time on either backend
LOCAL_ADAMW = {**SYNC, "server_optimizer": "sgd", "local_optimizer": "AdamW", "client_batching": "on"}


@pytest.fixture(scope="module")
def sync_local(tmp_path_factory):
    """SYNC on the local backend (:func:`result_of`), run once for the comparison with Ray and the handover."""
    return result_of(tmp_path_factory.mktemp("sync") / "local", {**SYNC, "backend": "local"})


@pytest.mark.parametrize("config", [SYNC, ASYNC, LOCAL_ADAMW], ids=["sync-fedadam", "async-fedyogi", "local-adamw"])
def test_local_equals_ray_with_two_actors(ray_local, sync_local, tmp_path, config):
    results = backend_results(tmp_path, config, placements=("actor",), local=sync_local if config is SYNC else None)
    assert results["ray"] == results["ray-actor"] == results["local"]  # the moments in the driver, or on the actor


def test_a_handover_to_ray_carries_the_moments(ray_local, sync_local, tmp_path):
    inner = RayBackend()
    summary = Engine(RunConfig(**SYNC, backend="ray", actors=2), out_dir=str(tmp_path / "handoff"),
                     backend=HandoffBackend(lambda: inner, {"backend": "ray"}, takeover_round=2)).run()
    assert summary["ray_from_round"] == 2
    assert summary["params_sha256"] == sync_local[0]
    assert lines(tmp_path / "handoff") == sync_local[1]


def test_a_ray_run_resumed_from_its_checkpoint_matches(ray_local, tmp_path):
    config = {**SYNC, "backend": "ray", "actors": 2, "rounds": 5, "checkpoint_every": 2}
    reference = Engine(RunConfig(**config), out_dir=str(tmp_path / "reference")).run()
    with pytest.raises(Exception, match="injected trainer failure"):
        Engine(RunConfig(**config, fault_inject="trainer-error@3"), out_dir=str(tmp_path / "run")).run()
    resumed = Engine(RunConfig(**config), out_dir=str(tmp_path / "run"), resume=True).run()
    assert resumed["params_sha256"] == reference["params_sha256"]
    assert lines(tmp_path / "run") == lines(tmp_path / "reference")
