"""Masked cross-entropy in local training (masked_loss, HeteroFL's and FedRolex's mask 1) on Ray with two actors:
the local backend's run bit for bit (each actor's workspace computes its clients' label masks from its own copy of
the dataset)."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

MASKED = dict(dataset="digits", partition="classes:2", clients=10, clients_per_round=5, rounds=2, seed=3,
              algorithm="fedrolex", masked_loss=True, checkpoint_every=0)


def test_masked_training_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    results = backend_results(tmp_path, MASKED)
    assert results["ray"] == results["local"]
    assert "masked_loss: true" in (tmp_path / "ray" / "config.yaml").read_text()
