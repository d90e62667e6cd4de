"""FLuID (``--algorithm fluid``, issue 44 item 2) on Ray with two actors: the local backend's run bit for bit
(params_sha256, metrics.jsonl, clients.csv), with stragglers' index-set sub-models from the third round on, without
a device population (the lowest p^max are the stragglers) and with one (the device clock picks them)."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

RUN = dict(dataset="digits", algorithm="fluid", clients=4, clients_per_round=4, rounds=3, seed=3,
           tier_counts=[1, 1, 1, 1], checkpoint_every=0)


def test_fluid_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    results = backend_results(tmp_path / "plain", RUN)
    assert results["ray"] == results["local"]
    assert results["local"][1][2]["avg_p"] < 1.0  # round 2: the straggler trains its index-set sub-model


def test_fluid_with_the_device_clock_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    results = backend_results(tmp_path / "clocked", {**RUN, "devices": "lognormal"})
    assert results["ray"] == results["local"]
    assert results["local"][1][2]["avg_p"] < 1.0  # the clock's slowest client of round 1 trains a sub-model
