"""Local accuracy on Ray with two actors: the local backend's run bit for bit, clients.csv's per-client local
accuracy included, under both rules (labels; the sources' own test shards, global model, zero fill), once after the
last round and every round. Every round: Ray completes the last round's line at once and an earlier, deferred one
after it, and the run's local accuracy must still be the last round's (it was the earlier round's: the clients.csv
of a Ray run differed from the local backend's while metrics.jsonl agreed)."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

RUN = dict(dataset="digits", partition="classes:2", clients=10, clients_per_round=5, rounds=2, seed=3,
           checkpoint_every=0)


@pytest.mark.parametrize("rule,every", [("source", 0), ("source", 1), ("labels", 1)])
def test_local_accuracy_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path, rule, every):
    results = backend_results(tmp_path, {**RUN, "local_eval_rule": rule, "local_eval_every": every})
    assert results["ray"] == results["local"]
    assert "local_test_samples" in results["local"][2]
