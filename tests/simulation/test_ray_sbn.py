"""A run with static BatchNorm (HeteroFL's PreResNet-18 at a tiny ladder on the digits) on Ray with two actors: the
local backend's run bit for bit, for the sources' shuffled statistics pass (the default) and FedRolex's test-batch
statistics: the pass's permutation comes from the run seed, so every evaluator (the server, a trainer) computes the
same statistics."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

SBN = dict(dataset="digits", model="preresnet18", model_norm="sbn", rounds=1, clients=4, clients_per_round=2,
           local_epochs=1, seed=5, widths=[0.25, 0.5], width_mix=[1, 1], checkpoint_every=0, eval_widths=[0.5, 1.0])


@pytest.mark.parametrize("mode", ["shuffled", "test_batch"])
def test_sbn_statistics_on_two_ray_actors_equal_the_local_backend(ray_local, tmp_path, mode):
    results = backend_results(tmp_path, {**SBN, "sbn_statistics": mode})
    assert results["ray"] == results["local"]
