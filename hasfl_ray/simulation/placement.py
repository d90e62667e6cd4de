"""How many trainer actors to start and what each asks Ray for: CPU cores, whole GPUs or GPU fractions."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hasfl_ray.engine.config import RunConfig
from hasfl_ray.errors import ConfigError

#: GPU share the server actor asks for when trainers use GPUs: it aggregates and evaluates between the
#: trainers' bursts, so it shares a GPU with a trainer instead of holding one of its own.
SERVER_GPU_SHARE = 0.1
#: Default GPU share of a trainer: a whole GPU but the server's share, so one trainer per GPU fits beside it.
DEFAULT_GPUS_PER_ACTOR = 1.0 - SERVER_GPU_SHARE
_EPS = 1e-9


@dataclass(frozen=True)
class ActorPlan:
    """Resources of one run's actors.

    Attributes:
        actors: number of trainer actors.
        cpus_per_actor: CPU cores each trainer reserves (its fixed intra-op thread count).
        gpus_per_actor: GPUs (or a fraction of one) each trainer reserves; 0 on CPU.
        server_gpus: GPU share of the server actor (0 on CPU). The server reserves no CPU core.
        device: torch device type inside the actors (``cpu`` or ``cuda``; Ray makes the assigned GPU cuda:0).
    """

    actors: int
    cpus_per_actor: int
    gpus_per_actor: float
    server_gpus: float
    device: str


def trainers_that_fit(num_gpus: float, gpus_per_actor: float, server_gpus: float) -> int:
    """How many trainers of ``gpus_per_actor`` fit on ``num_gpus`` whole GPUs beside the server's share.

    A fractional trainer lives on one GPU (floor(1 / share) per GPU, fewer on the server's GPU); a trainer
    of k whole GPUs takes k GPUs the server does not use.
    """
    gpus = int(math.floor(num_gpus + _EPS))
    if gpus == 0:
        return 0
    if gpus_per_actor <= 1 + _EPS:
        per_gpu = math.floor(1 / gpus_per_actor + _EPS)
        beside_server = math.floor((1 - server_gpus) / gpus_per_actor + _EPS)
        return (gpus - 1) * per_gpu + beside_server
    return math.floor((gpus - (1 if server_gpus > 0 else 0)) / gpus_per_actor + _EPS)


def plan_actors(config: RunConfig, cluster_cpus: float, cluster_gpus: float) -> ActorPlan:
    """The actors of ``config`` on a cluster with these totals; one :class:`ConfigError` sentence when they cannot fit.

    Defaults: on CPU one trainer per ``trainer_threads`` cores; on CUDA one trainer per GPU (each
    ``DEFAULT_GPUS_PER_ACTOR`` of it) or as many as ``gpus_per_actor`` allows.
    """
    threads = config.trainer_threads
    cpus = int(math.floor(cluster_cpus + _EPS))
    if not config.device.startswith("cuda"):
        actors = config.actors or max(1, cpus // threads)
        if actors * threads > cpus:
            raise ConfigError(f"actors is {actors} with trainer_threads {threads}, which needs {actors * threads} "
                              f"CPUs, but the Ray cluster has {cpus}; expected at most {max(cpus // threads, 0)} "
                              "actors")
        return ActorPlan(actors, threads, 0.0, 0.0, "cpu")
    if cluster_gpus < 1 - _EPS:
        raise ConfigError(f"device is {config.device!r} but the Ray cluster has no GPU; expected --device cpu, or a "
                          "cluster with GPUs")
    share = float(config.gpus_per_actor or DEFAULT_GPUS_PER_ACTOR)
    fit = trainers_that_fit(cluster_gpus, share, SERVER_GPU_SHARE)
    actors = config.actors or fit
    if actors == 0 or actors > fit:
        raise ConfigError(f"{actors} trainer actors of {share:g} GPU each do not fit on the cluster's "
                          f"{cluster_gpus:g} GPUs beside the server's {SERVER_GPU_SHARE:g}; expected at most {fit} "
                          f"actors, or a smaller --gpus-per-actor (e.g. {DEFAULT_GPUS_PER_ACTOR:g})")
    if actors * threads > cpus:
        raise ConfigError(f"actors is {actors} with trainer_threads {threads}, which needs {actors * threads} CPUs, "
                          f"but the Ray cluster has {cpus}; expected fewer actors or trainer threads")
    return ActorPlan(actors, threads, share, SERVER_GPU_SHARE, "cuda")
