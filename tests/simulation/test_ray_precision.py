"""--precision bf16 on Ray with two actors: the local backend's run bit for bit (the trainer actors run the same
autocast; the server and evaluation stay float32)."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

RUN = dict(dataset="digits", rounds=2, clients=6, clients_per_round=3, seed=4, precision="bf16", checkpoint_every=0)


def test_bf16_training_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    results = backend_results(tmp_path, RUN)
    assert results["ray"] == results["local"]
