"""The sources' evaluation rules of issue 43 on Ray with two actors, the local backend's run bit for bit
(params_sha256, metrics.jsonl, clients.csv): HeteroFL's statistics pass over its whole, crop-flipped training set
(``sbn_statistics_data: training_set``), and FedRolex's test-batch statistics with each client's shard in its own
batches for the sources' local accuracy."""

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from same_on_ray import backend_results  # noqa: E402

RUN = dict(dataset="digits", model="preresnet18", partition="classes:2", clients=10, clients_per_round=4, rounds=1,
           seed=3, checkpoint_every=0, local_eval_rule="source", eval_widths=[0.5, 1.0])


@pytest.mark.parametrize("rule", [dict(sbn_statistics_data="training_set", augmentation="crop_flip"),
                                  dict(sbn_statistics="test_batch", eval_batch_size=20)])
def test_the_sources_evaluation_on_two_ray_actors_equals_the_local_backend(ray_local, tmp_path, rule):
    results = backend_results(tmp_path, {**RUN, **rule})
    assert results["ray"] == results["local"]
