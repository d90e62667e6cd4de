"""Label-split aggregation of the output layer (``classifier_aggregation: label_split``) on Ray with two actors: the
local backend's run bit for bit, with FedRolex's rolling windows (the server actor gets the clients' label sets from
the driver)."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

LABEL_SPLIT = dict(dataset="digits", partition="classes:2", clients=10, clients_per_round=5, rounds=2, seed=3,
                   algorithm="fedrolex", classifier_aggregation="label_split", checkpoint_every=0)


def test_label_split_aggregation_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path):
    results = backend_results(tmp_path, LABEL_SPLIT)
    assert results["ray"] == results["local"]
