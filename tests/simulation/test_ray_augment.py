"""Training augmentation (crop and flip, seeded by seed, round, client and step) on Ray with two actors: the local
backend's run bit for bit."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

RUN = dict(dataset="digits", rounds=2, clients=6, clients_per_round=3, seed=4, augmentation="crop_flip",
           checkpoint_every=0)


def test_augmented_training_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    results = backend_results(tmp_path, RUN)
    assert results["ray"] == results["local"]
