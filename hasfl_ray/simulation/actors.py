"""The two Ray actors: a trainer (wraps :class:`Trainer`) and the server (wraps :class:`Server`)."""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import ray
import torch

from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.engine.server import Server
from hasfl_ray.training.determinism import apply_determinism, determinism_state
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.task import ClientTask, OptimizerSettings
from hasfl_ray.training.trainer import Trainer

#: Networks a trainer keeps built (the most recently used widths); others are dropped with their memory.
CACHED_WIDTHS = 4


@dataclass(frozen=True)
class TaskReport:
    """What the driver learns of a finished client (the update itself goes to the server by reference)."""

    client: int
    train_seconds: float
    #: Every client trained by the call (a batched group); empty for one client.
    clients: Tuple[int, ...] = ()


def _process_setup(device: str, threads: int, deterministic: bool = True) -> torch.device:
    """Fix this worker's torch settings exactly as the driver's local backend does, before it touches CUDA."""
    apply_determinism(deterministic)
    torch.set_num_threads(threads)
    return torch.device(device)


def _whereabouts(device: torch.device) -> Dict[str, Any]:
    context = ray.get_runtime_context()
    return {"node": context.get_node_id(), "pid": os.getpid(), "device": str(device),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "determinism": determinism_state()}


class TrainerActor:
    """A long-lived trainer: the dataset on its device once, model buffers reused, one round's global params.

    Args:
        dataset: the federated dataset (Ray resolves the driver's single object-store copy).
        model_name, settings, device, threads: as :class:`Trainer`; ``device`` is ``cpu`` or ``cuda``
            (Ray exposes the GPU it assigned as cuda:0).
        deterministic: the run's ``deterministic`` setting (see :mod:`hasfl_ray.training.determinism`).
        cuda_graphs: the run's ``cuda_graphs`` is on (see :mod:`hasfl_ray.training.graphed`).
    """

    def __init__(self, dataset: Optional[FederatedDataset] = None, model_name: str = "", settings=None,
                 device: str = "cpu", threads: int = 1, deterministic: bool = True, cuda_graphs: bool = False):
        self.device = _process_setup(device, threads, deterministic)
        self.params: Dict[str, torch.Tensor] = {}
        self.recent_widths: "OrderedDict[float, None]" = OrderedDict()
        if dataset is not None:  # None: started early, see setup
            self.trainer = Trainer(dataset, model_name, settings, str(self.device), threads, cuda_graphs=cuda_graphs)

    def setup(self, *args: Any) -> None:
        """The constructor, for an actor started early (docs/ray.md, 'Start-up'): created with only ``device``,
        ``threads`` and ``deterministic``, its process imports torch and fixes its settings while the driver still
        loads the data; this call gives it the run's arguments. Ray runs an actor's calls in order, so every later
        call finds it set up."""
        self.__init__(*args)

    def ready(self) -> Dict[str, Any]:
        """Where this actor runs (node id, pid, device, GPU ids)."""
        return _whereabouts(self.device)

    def begin_round(self, params: Mapping[str, torch.Tensor]) -> None:
        """Take the round's global parameters (one object-store read per actor per round) onto the device,
        replacing the previous round's."""
        self.params = {}
        self.params = {name: tensor.to(self.device) for name, tensor in params.items()}

    def train(self, task: ClientTask) -> Tuple[TaskReport, ClientResult]:
        """Train one client (two returns: the small report for the driver, the result for the server)."""
        start = time.perf_counter()
        result = self.trainer.train(task, self.params)
        report = TaskReport(task.client, time.perf_counter() - start)
        self._used(task.width)
        return report, result

    def train_group(self, tasks: Sequence[ClientTask], batched: bool = True) -> Tuple[Any, ...]:
        """Train several clients in one call: with ``batched``, ``tasks`` is one planned unit (the batchable clients
        of one width, :func:`~hasfl_ray.training.batched.group_tasks`), trained together as it is
        (:meth:`Trainer.train_unit`); otherwise one after the other (:meth:`Trainer.train`, each exactly as alone).
        1 + len(tasks) returns: the report for the driver, then each client's result for the server, in task
        order."""
        start = time.perf_counter()
        if batched:
            results = self.trainer.train_unit(tasks, self.params)
        else:
            results = [self.trainer.train(task, self.params) for task in tasks]
        report = TaskReport(tasks[0].client, time.perf_counter() - start, tuple(task.client for task in tasks))
        for width in dict.fromkeys(task.width for task in tasks):
            self._used(width)
        return (report, *results)

    def _used(self, width: float) -> None:
        """Mark ``width`` recently used; drop the networks of widths not used lately."""
        self.recent_widths[width] = None
        self.recent_widths.move_to_end(width)
        while len(self.recent_widths) > CACHED_WIDTHS:
            self.recent_widths.popitem(last=False)
        if len(self.trainer.cached_widths) > CACHED_WIDTHS:
            self.trainer.release(keep=self.recent_widths)


class ServerActor:
    """The server on its own actor: global parameters on its device, aggregation, evaluation.

    Args: as :class:`Server` (``eval_indices`` last), plus ``threads`` (intra-op threads, the trainers' count, as in the local backend)
        and ``deterministic`` (as :class:`TrainerActor`).
    """

    def __init__(self, model_name: str = "", initial_params: Optional[Mapping[str, torch.Tensor]] = None,
                 dataset: Optional[FederatedDataset] = None, eval_batch_size: int = 0, aggregation_backend: str = "",
                 device: str = "cpu", threads: int = 1, deterministic: bool = True,
                 eval_indices: Optional[torch.Tensor] = None, estimator: str = "masked"):
        self.device = _process_setup(device, threads, deterministic)
        self.threads = threads
        if dataset is not None:  # None: started early, see TrainerActor.setup
            self.server = Server(model_name, initial_params, dataset, eval_batch_size, aggregation_backend,
                                 str(self.device), eval_indices, estimator)

    setup = TrainerActor.setup

    def ready(self) -> Dict[str, Any]:
        return _whereabouts(self.device)

    def params(self) -> Dict[str, torch.Tensor]:
        """The global parameters on the CPU (the driver stores them in the object store once per round)."""
        return self.server.get_params()

    def set_params(self, params: Mapping[str, torch.Tensor]) -> None:
        self.server.set_params(params)

    def apply(self, weights: Sequence[float], server_lr: float,
              *results: ClientResult) -> Tuple[List[ClientResult], AggregateResult]:
        """:meth:`Server.apply` on the round's results, given in client order (Ray resolves the references)."""
        torch.set_num_threads(self.threads)
        return self.server.apply(list(results), weights, server_lr)

    def evaluate(self) -> Tuple[float, float]:
        torch.set_num_threads(self.threads)
        return self.server.evaluate()

    def evaluate_widths(self, widths: Sequence[float], submodels=None) -> Dict[float, Tuple[float, float]]:
        torch.set_num_threads(self.threads)
        return self.server.evaluate_widths(widths, submodels)

    def test_beats(self, widths: Sequence[float], submodels=None):
        torch.set_num_threads(self.threads)
        return self.server.test_beats(widths, submodels)

    def frozen_fraction(self) -> float:
        return self.server.frozen_fraction()

    def frozen_by_layer(self) -> Dict[str, float]:
        return self.server.frozen_by_layer()

    def params_sha256(self) -> str:
        return self.server.params_sha256()

