"""Actor placement: defaults per CPU core or GPU, fractional GPUs beside the server, one sentence when it cannot fit."""

import pytest
import torch

from hasfl_ray.config import RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.simulation.placement import (DEFAULT_GPUS_PER_ACTOR, SERVER_GPU_SHARE, plan_actors,
                                            trainers_that_fit)


def ray_config(**kw):
    return RunConfig(backend="ray", **kw)


def test_cpu_default_is_one_actor_per_trainer_threads_cores():
    plan = plan_actors(ray_config(), cluster_cpus=8, cluster_gpus=2)
    assert (plan.actors, plan.cpus_per_actor, plan.gpus_per_actor, plan.server_gpus, plan.device) == \
        (8, 1, 0.0, 0.0, "cpu")
    assert plan_actors(ray_config(trainer_threads=3), 8, 0).actors == 2


def test_cuda_default_is_one_actor_per_gpu_beside_the_server():
    plan = plan_actors(ray_config(device="cuda"), cluster_cpus=16, cluster_gpus=4)
    assert (plan.actors, plan.gpus_per_actor, plan.server_gpus, plan.device) == \
        (4, DEFAULT_GPUS_PER_ACTOR, SERVER_GPU_SHARE, "cuda")
    assert 4 * DEFAULT_GPUS_PER_ACTOR + SERVER_GPU_SHARE <= 4


@pytest.mark.parametrize("gpus, share, expected", [
    (1, 0.9, 1), (1, 0.45, 2), (1, 0.25, 3), (2, 0.5, 3), (8, 0.9, 8), (4, 2, 1), (1, 1.0, 0), (2, 1.0, 1),
])
def test_fractional_and_whole_gpus_pack_per_gpu(gpus, share, expected):
    assert trainers_that_fit(gpus, share, SERVER_GPU_SHARE) == expected


@pytest.mark.parametrize("kw, cpus, gpus, needle", [
    (dict(actors=3), 2, 0, "actors is 3 with trainer_threads 1, which needs 3 CPUs"),
    (dict(device="cuda"), 4, 0, "the Ray cluster has no GPU"),
    (dict(device="cuda", gpus_per_actor=1.0), 4, 1, "do not fit on the cluster's 1 GPUs"),
    (dict(device="cuda", actors=3, gpus_per_actor=0.5), 4, 1, "expected at most 1 actors"),
])
def test_plans_that_cannot_fit_are_refused_in_one_sentence(kw, cpus, gpus, needle):
    with pytest.raises(ConfigError, match=needle):
        plan_actors(ray_config(**kw), cpus, gpus)


@pytest.mark.parametrize("kw", [dict(trainer_threads=3), dict(trainer_threads=3, actors=1),
                                dict(trainer_threads=3, device="cuda")])
def test_more_trainer_threads_than_the_cluster_has_cpus_name_the_threads(kw):
    # h52: `--backend ray --trainer-threads 3` on 2 CPUs answered "actors is 1 with trainer_threads 3 ...; expected
    # at most 0 actors", a remedy no run can take
    with pytest.raises(ConfigError) as refused:
        plan_actors(ray_config(**kw), 2, 1)
    assert str(refused.value) == ("trainer_threads is 3, which needs 3 CPUs for one trainer actor, but the Ray "
                                  "cluster has 2; expected at most 2")


def test_ray_only_options_need_the_ray_backend_and_gpus_need_cuda():
    with pytest.raises(ConfigError, match="backend ray"):
        RunConfig(backend="local", actors=2)
    assert RunConfig(actors=2).backend == "auto"  # auto: Ray where installed (resolved()), refused without it
    with pytest.raises(ConfigError, match="expected device cuda"):
        RunConfig(backend="ray", device="cpu", gpus_per_actor=0.5)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device auto found no GPU"):
            RunConfig(backend="ray", gpus_per_actor=0.5).resolved()
    with pytest.raises(ConfigError, match="KIND@ROUND with KIND one of kill-trainer"):
        RunConfig(backend="ray", fault_inject="kill@3")
