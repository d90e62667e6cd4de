"""How many trainer actors to start and what each asks Ray for: CPU cores, whole GPUs or GPU fractions."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import Dict, Optional

from hasfl_ray.config import RunConfig, ray_installed
from hasfl_ray.errors import ConfigError
from hasfl_ray.simulation import ray_address

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
        server: where the server runs, ``driver`` or ``actor`` (:func:`server_placement`).
    """

    actors: int
    cpus_per_actor: int
    gpus_per_actor: float
    server_gpus: float
    device: str
    server: str = "actor"

    def describe_actors(self) -> str:
        """What the run asks the cluster for, e.g. "2 trainer actors (1 CPU each) and the server actor"."""
        each = f"{self.gpus_per_actor:g} GPU" if self.gpus_per_actor else f"{self.cpus_per_actor} CPU"
        return (f"{self.actors} trainer actor{'s' if self.actors != 1 else ''} ({each} each)"
                + (" and the server actor" if self.server == "actor" else ""))


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
    if threads > cpus:  # not even one trainer fits: the threads are what to change, not the actors (at most 0)
        raise ConfigError(f"trainer_threads is {threads}, which needs {threads} CPUs for one trainer actor, but the "
                          f"Ray cluster has {cpus}; expected at most {cpus}")
    if not config.device.startswith("cuda"):
        actors = config.actors or max(1, cpus // threads)
        if actors * threads > cpus:
            raise ConfigError(f"actors is {actors} with trainer_threads {threads}, which needs {actors * threads} "
                              f"CPUs, but the Ray cluster has {cpus}; expected at most {max(cpus // threads, 0)} "
                              "actors")
        return ActorPlan(actors, threads, 0.0, 0.0, "cpu", server_placement(config, "cpu"))
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
    server = server_placement(config, "cuda")
    return ActorPlan(actors, threads, share, SERVER_GPU_SHARE if server == "actor" else 0.0, "cuda", server)


def server_placement(config: RunConfig, device: str) -> str:
    """Where the server runs: ``config.server_placement`` when it names one, else (``auto``, unset) ``driver`` on a
    CPU run that starts Ray on this machine or joins the one this process runs, ``actor`` on a GPU (the server's
    share of one beside a trainer, where the model's parameters already are) or a cluster joined by address (the
    driver may be a laptop far from it, with Ray Client). In the driver, a round's results come straight from the
    trainers to the process that plans the next round: no server call, no hop through a third process (on a 2-core
    machine at 0.1 s rounds, ~15 of ~120 ms; docs/ray.md, 'A round on Ray'). The results are the same bits either
    way: the server is one :class:`~hasfl_ray.simulation.actors.ServerActor`, in its own process or in the driver."""
    chosen = config.server_placement or "auto"
    if chosen != "auto":
        return chosen
    return "driver" if device == "cpu" and not ray_address(config.address)[0] else "actor"


def execution(config: RunConfig, plan: ActorPlan, nodes: int) -> Dict[str, object]:
    """What config.yaml records of a Ray run's execution (``RayBackend.describe``)."""
    return {"backend": "ray", "actors": plan.actors, "trainer_threads": config.trainer_threads,
            "gpus_per_actor": plan.gpus_per_actor, "server_gpus": plan.server_gpus, "server": plan.server,
            "nodes": nodes,
            "address": config.address or "local"}


def handoff_execution(config: RunConfig) -> Optional[Dict[str, object]]:
    """For a run that starts Ray on this machine, on CPU: its execution as :func:`execution` records it, known
    before Ray starts (the actors are planned on this machine's CPU count, which is what that Ray gets), so the run
    can train in this process while Ray starts (:class:`hasfl_ray.engine.handoff.HandoffBackend`; Ray is not
    imported here). None, to wait for Ray before the first round, when the run joins a Ray (an address, RAY_ADDRESS,
    one this process already runs), uses a GPU (two copies of the model on it), injects a fault (tests aim it at
    Ray), asks for actors that do not fit (the waiting start refuses them in its sentence before anything is made),
    or Ray is not installed (the waiting start says how to install it)."""
    ray = sys.modules.get("ray")
    if (ray is not None and ray.is_initialized()) or ray_address(config.address)[0] or config.fault_inject or \
            config.device != "cpu" or not ray_installed():
        return None
    try:
        plan = plan_actors(config, os.cpu_count() or 1, 0)
    except ConfigError:
        return None
    return execution(config, plan, 1)
