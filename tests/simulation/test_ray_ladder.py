"""A custom width ladder redrawn every round (dynamic) and a k-classes partition, and FjORD without KD: the Ray
backend with two actors gives the local backend's run bit for bit."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

LADDER = dict(rounds=2, clients=5, clients_per_round=3, local_epochs=1, seed=5, algorithm="fjord",
              width_mix="a1-b1-c1-d1-e1", width_assignment="dynamic", partition="classes:2", checkpoint_every=0)


def test_a_dynamic_ladder_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    results = backend_results(tmp_path, LADDER)
    assert results["ray"] == results["local"]


def test_fjord_without_kd_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    """fjord_kd false: the drawn widths (the objective's seeded stream) and their steps do not depend on the backend."""
    config = {**LADDER, "width_assignment": "fixed", "algorithm_options": {"fjord_kd": False}}
    results = backend_results(tmp_path, config)
    assert results["ray"] == results["local"]
