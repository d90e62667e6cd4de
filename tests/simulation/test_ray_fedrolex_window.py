"""FedRolex's window as its code rolls it (the default, issue 35 item 6) on Ray with two actors: the local backend's
run bit for bit (params_sha256, metrics.jsonl, clients.csv), and a different run from the former +t window."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

RUN = dict(dataset="digits", algorithm="fedrolex", clients=10, clients_per_round=5, rounds=3, seed=3,
           checkpoint_every=0)


def test_fedrolex_source_window_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    results = backend_results(tmp_path / "source", RUN)
    assert results["ray"] == results["local"]
    forward = backend_results(tmp_path / "forward", {**RUN, "algorithm_options": {"rolex_direction": "forward"}})
    assert forward["ray"] == forward["local"]
    assert forward["local"][0] != results["local"][0]  # rounds 1 and 2 roll the other way
