"""Local accuracy by the sources' rule (own test shards, the global model's logits, zero fill) on Ray with two
actors: the local backend's run bit for bit, clients.csv's per-client local accuracy included (once, after the last
round, as the packs score it)."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

SOURCE = dict(dataset="digits", partition="classes:2", clients=10, clients_per_round=5, rounds=2, seed=3,
              local_eval_rule="source", checkpoint_every=0)


def test_the_sources_local_accuracy_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    results = backend_results(tmp_path, SOURCE)
    assert results["ray"] == results["local"]
    assert "local_test_samples" in results["local"][2]
