"""The two Ray actors: a trainer (wraps :class:`Trainer`) and the server (wraps :class:`Server`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import ray
import torch

from hasfl_ray import allocator
from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.engine.server import Server
from hasfl_ray.simulation.wire import Packed, pack, unpack, unpack_units
from hasfl_ray.training.determinism import apply_determinism, determinism_state
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.task import ClientTask
from hasfl_ray.training.trainer import Trainer


@dataclass(frozen=True, eq=False)
class Inline:
    """A round's global parameters carried inside each call that needs them, instead of one object-store object
    (``server_placement: driver`` in a Ray this run started, parameters up to ``INLINE_OBJECT_BYTES``,
    hasfl_ray/simulation/backend.py): no put in the driver between two rounds, no store read in the trainers, no
    work for the raylet. ``version`` names the parameters (it grows with every new model of the run), so a trainer
    that already holds them does not unpack the copy a later call of the round brings."""

    version: int
    packed: Packed


@dataclass(frozen=True)
class Held:
    """An :class:`Inline` that the trainer a call goes to was sent by an earlier call, named by its version alone:
    the packed parameters travel once per trainer and model, not with each of its calls (the round's evaluations
    behind its training, an asynchronous run's clients). The driver sends it only where that trainer's previous
    parameters were that version (Ray runs one caller's calls to an actor in the order they were sent;
    hasfl_ray/simulation/transport.py, ``Transport._carried``)."""

    version: int


def read_params(carried: Any) -> Packed:
    """The packed parameters of ``carried`` (``[ref]`` or ``[Inline]``, as :meth:`TrainerActor.run` takes them):
    from the object store, or from the call itself."""
    return carried[0].packed if isinstance(carried[0], Inline) else ray.get(carried[0])


@dataclass(frozen=True)
class TaskReport:
    """What the driver learns of a finished client (the update itself goes to the server by reference)."""

    client: int
    train_seconds: float
    #: Every client trained by the call (a batched group); empty for one client.
    clients: Tuple[int, ...] = ()
    #: CPU seconds (the process's) of each unit the call trained, in order, and per evaluation method those the
    #: trainer spent evaluating (:meth:`TrainerActor.evaluate_at`) since its previous call: the driver's measure of
    #: what clients and evaluations cost, to plan the next rounds (hasfl_ray/simulation/costs.py).
    unit_seconds: Tuple[float, ...] = ()
    eval_seconds: Tuple[Tuple[str, float], ...] = ()


def _process_setup(device: str, threads: int, deterministic: bool = True) -> torch.device:
    """Fix this worker's torch settings exactly as the driver's local backend does, before it touches CUDA."""
    apply_determinism(deterministic)
    torch.set_num_threads(threads)
    return torch.device(device)


def _whereabouts(device: torch.device) -> Dict[str, Any]:
    context = ray.get_runtime_context()
    return {"node": context.get_node_id(), "pid": os.getpid(), "device": str(device),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "determinism": determinism_state()}


class Evaluator:
    """The server's evaluation code (:class:`Server`: the same evaluation subset, batches, sub-model layouts and
    thread count, so the same bits) on a copy of given parameters, built at the first call: how a trainer (or the
    server, for a trainer lost meanwhile) evaluates the model of a round while the server holds the next one."""

    def __init__(self, model_name: str, dataset: FederatedDataset, device: str, threads: int, batch_size: int,
                 indices: Optional[torch.Tensor], statistics: Optional[Sequence] = None):
        self.args = (model_name, dataset, batch_size, device, indices)
        self.statistics = statistics
        self.threads = threads
        self.server: Optional[Server] = None

    def __call__(self, params: Mapping[str, torch.Tensor], method: str, *args: Any) -> Any:
        if method not in ("evaluate", "evaluate_widths", "test_beats", "test_logits", "evaluate_depths"):
            raise ValueError(f"evaluation method {method!r}; expected evaluate, evaluate_widths, test_beats, "
                             "test_logits or evaluate_depths")
        model_name, dataset, batch_size, device, indices = self.args
        if self.server is None:
            self.server = Server(model_name, params, dataset.test_view(), batch_size, "reference", str(device),
                                 indices, statistics=self.statistics)
        else:
            self.server.set_params(params)
        torch.set_num_threads(self.threads)
        return getattr(self.server, method)(*args)


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
                 device: str = "cpu", threads: int = 1, deterministic: bool = True, cuda_graphs: bool = False,
                 evaluation: Optional[Tuple[Any, ...]] = None):
        self.device = _process_setup(device, threads, deterministic)
        self.params: Dict[str, torch.Tensor] = {}
        if dataset is not None:  # None: started early, see setup
            self.trainer = Trainer(dataset, model_name, settings, str(self.device), threads, cuda_graphs=cuda_graphs)
            self.evaluator = Evaluator(model_name, dataset, device, threads, *(evaluation or (500, None)))

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
        """Take the round's global parameters onto the device, replacing the previous round's."""
        self.params = {}
        self.params = {name: tensor.to(self.device) for name, tensor in params.items()}

    def _take(self, params: Any) -> None:
        """The round's global parameters: ``[ref]``, a reference to the server's object (in a list, so that Ray
        does not resolve it for every call), read from the object store once per actor per round however many
        calls carry it; ``[Inline]``, the parameters inside the call, unpacked once per actor per round (by their
        version); ``[Held]``, the version an earlier call of this actor brought; or the parameters themselves (a
        caller without Ray)."""
        if isinstance(params, Mapping):
            self.begin_round(params)
            self._params_ref = None
            return
        key = ("inline", params[0].version) if isinstance(params[0], (Inline, Held)) else params[0]
        held = getattr(self, "_params_ref", None)
        if held is None or type(held) is not type(key) or held != key:
            if isinstance(params[0], Held):  # the driver's record of what this trainer holds is wrong: a bug
                raise RuntimeError(f"a call names the parameters of version {params[0].version}, which this trainer "
                                   f"does not hold (it holds {held!r}); expected the version its last call brought")
            self._params_ref = None
            self.params = {}
            # a new model, a new round: what the last one freed (its training, its evaluations), back to the system
            # once a model, as the local backend does once a round (hasfl_ray/allocator.py), rather than after each
            # call, whose next call then faulted the same pages in again (~7 ms of a trainer's CPU a digits round):
            # here, unless the last model's evaluation did it as it ended (evaluate_at)
            if not self.__dict__.pop("released", False):
                allocator.release()
            self.begin_round(unpack(read_params(params)))
            self._params_ref = key

    def evaluate_at(self, params: Any, method: str, *args: Any) -> Any:
        """``method(*args)`` (``evaluate``, ``evaluate_widths`` or ``test_beats`` of :class:`Server`) of the global
        model ``params`` (as :meth:`run` takes them): the driver queues a round's evaluation on the trainers, ahead
        of the next round's training, which uses the same parameters (docs/ray.md, 'A round on Ray')."""
        start = time.process_time()
        self._take(params)
        try:
            return self.evaluator(self.params, method, *args)
        finally:
            # its activations and the round's training memory back to the system now: an evaluation is the last of
            # a trainer's work in a round (queued behind its training), so this runs while the driver aggregates,
            # not at the start of the next round's training, which then need not (_take); once a model (a second
            # evaluation of it reuses the pages the first freed)
            if not self.__dict__.get("released", False):
                allocator.release()
                self.released = True
            spent = self.__dict__.setdefault("eval_seconds", {})
            spent[method] = spent.get(method, 0.0) + time.process_time() - start

    def run(self, params: Any, units: Sequence[Tuple[Sequence[ClientTask], bool]]
            ) -> Tuple[TaskReport, Tuple[ClientResult, ...]]:
        """One call of a round: the training units the driver planned for this actor (docs/ray.md, 'A round on
        Ray'), each ``(tasks, batched)``: a batched group trained together (:meth:`Trainer.train_unit`), or clients
        trained one after the other, each exactly as alone (:meth:`Trainer.train`). A pair: the small report for the
        driver, and every client's result, in the call's task order, packed as ONE object for the server; two
        returns where the server is an actor (it takes the results by reference), one object, read at once, where
        it is in the driver (hasfl_ray/simulation/transport.py, ``Transport._send``)."""
        self._take(params)
        units = unpack_units(units)  # the tasks' masks, sent in one buffer
        start = time.perf_counter()
        results: List[ClientResult] = []
        spent: List[float] = []
        for tasks, batched in units:
            cpu = time.process_time()
            if batched:
                results += self.trainer.train_unit(tasks, self.params)
            else:
                results += [self.trainer.train(task, self.params) for task in tasks]
            spent.append(time.process_time() - cpu)
        clients = tuple(task.client for tasks, _ in units for task in tasks)
        report = TaskReport(clients[0], time.perf_counter() - start, clients, tuple(spent),
                            tuple(sorted(self.__dict__.pop("eval_seconds", {}).items())))
        packed = pack(tuple(results))
        del results  # (what the call freed goes back to the system with the round's, at the next model: _take)
        return report, packed



class ServerActor:
    """The server on its own actor (or, ``server_placement: driver``, in the driver: hasfl_ray.simulation.server_port):
    global parameters on its device, aggregation, evaluation.

    Args: as :class:`Server` (``eval_indices`` last), plus ``threads`` (intra-op threads, the trainers' count, as in the local backend)
        and ``deterministic`` (as :class:`TrainerActor`).
    """

    def __init__(self, model_name: str = "", initial_params: Optional[Mapping[str, torch.Tensor]] = None,
                 dataset: Optional[FederatedDataset] = None, eval_batch_size: int = 0, aggregation_backend: str = "",
                 device: str = "cpu", threads: int = 1, deterministic: bool = True,
                 eval_indices: Optional[torch.Tensor] = None, estimator: str = "masked",
                 statistics: Optional[Sequence] = None, label_masks: Any = None):
        self.device = _process_setup(device, threads, deterministic)
        self.threads = threads
        if dataset is not None:  # None: started early, see TrainerActor.setup
            self.server = Server(model_name, initial_params, dataset, eval_batch_size, aggregation_backend,
                                 str(self.device), eval_indices, estimator, statistics, label_masks)
            self.evaluator = Evaluator(model_name, dataset, device, threads, eval_batch_size, eval_indices,
                                       statistics)

    def evaluate_at(self, params: Any, method: str, *args: Any) -> Any:
        """:meth:`TrainerActor.evaluate_at` here: the evaluation of a trainer lost before it answered (``params``
        as the trainers take them, or the parameters themselves)."""
        try:
            return self.evaluator(params if isinstance(params, Mapping) else unpack(read_params(params)), method, *args)
        finally:
            allocator.release()  # the evaluation's activations, back to the system

    setup = TrainerActor.setup

    def ready(self) -> Dict[str, Any]:
        return _whereabouts(self.device)

    def params(self) -> Packed:
        """The global parameters on the CPU, packed (:mod:`hasfl_ray.simulation.wire`): one object-store object
        that every trainer reads once per round. Packed from the server's own tensors: :func:`pack` copies their
        bytes (to the CPU) itself, so the copy :meth:`Server.get_params` makes first would be a second one."""
        return pack(self.server.params)

    def set_params(self, params: Mapping[str, torch.Tensor]) -> None:
        self.server.set_params(params)

    def round(self, weights: Sequence[float], server_lr: float, layout: Sequence[Sequence[int]], optimizer: Any,
              *calls: Packed, keep_updates: bool = False) -> Tuple[Packed, Packed]:
        """A round's server side in one call (docs/ray.md, 'A round on Ray'): :meth:`apply_round` of the trainer
        calls' results (Ray resolves the references). Two returns, packed (:mod:`hasfl_ray.simulation.wire`): its
        summary for the driver, and the new parameters, one object-store object every trainer reads for the next
        round."""
        summary = pack(self.apply_round(weights, server_lr, layout, optimizer, calls, keep_updates))
        allocator.release()  # what the round freed, back to the system (hasfl_ray/allocator.py)
        return summary, self.params()

    def apply_round(self, weights: Sequence[float], server_lr: float, layout: Sequence[Sequence[int]],
                    optimizer: Any, calls: Sequence[Any], keep_updates: bool = False) -> Tuple[Any, ...]:
        """The trainer calls' results (``layout[i]`` = the task positions of call i's results; each call's packed,
        or already unpacked by the driver as it arrived) put back in client
        order, :meth:`Server.apply`, and what the driver records of the new model: the accepted results with their
        updates emptied, the aggregate's statistics, the frozen fractions (overall, per layer). ``keep_updates``:
        the accepted results keep their updates (an algorithm that inspects them,
        :mod:`hasfl_ray.engine.inspection`). Here on the server actor, or in the driver (``server_placement``)."""
        torch.set_num_threads(self.threads)
        results: List[Optional[ClientResult]] = [None] * sum(len(positions) for positions in layout)
        for positions, call in zip(layout, calls):
            for position, result in zip(positions, unpack(call) if isinstance(call, Packed) else call):
                results[position] = result
        accepted, aggregate = self.server.apply(results, weights, server_lr, None, optimizer, keep_updates=keep_updates)
        return accepted, aggregate, self.server.frozen_fraction(), self.server.frozen_by_layer()

    def arrivals(self, weights: Sequence[float], server_lr: float, bases: Optional[Sequence[Optional[int]]],
                 optimizer: Any, *results: Packed) -> Tuple[Packed, Packed]:
        """An asynchronous server update (docs/async.md): :meth:`apply_arrivals`, its summary and the new
        parameters packed as :meth:`round` returns them."""
        return pack(self.apply_arrivals(weights, server_lr, bases, optimizer, results)), self.params()

    def apply_arrivals(self, weights: Sequence[float], server_lr: float, bases: Optional[Sequence[Optional[int]]],
                       optimizer: Any, results: Sequence[Packed]) -> Tuple[Any, ...]:
        """The arrived clients' results (each one call's packed tuple of one result, in arrival order) applied as
        :meth:`apply_round` applies a round's, with FedAsync's ``bases`` and the server ``optimizer`` (FedBuff's
        server momentum among them)."""
        torch.set_num_threads(self.threads)
        arrived = [unpack(call)[0] for call in results]
        accepted, aggregate = self.server.apply(arrived, weights, server_lr, bases, optimizer)
        return accepted, aggregate, self.server.frozen_fraction(), self.server.frozen_by_layer()

    def keep_version(self, version: int) -> None:
        self.server.keep_version(version)

    def release_version(self, version: int) -> None:
        self.server.release_version(version)

    def kept_versions(self) -> Packed:
        return pack(self.server.kept_versions())

    def restore_versions(self, versions: Packed) -> None:
        self.server.restore_versions(unpack(versions))

    def momentum_state(self) -> Packed:
        return pack(self.server.momentum_state())

    def restore_momentum(self, state: Packed) -> None:
        self.server.restore_momentum(unpack(state))

    def set_privacy(self, settings: Any) -> None:
        self.server.set_privacy(settings)

    def frozen_fraction(self) -> float:
        return self.server.frozen_fraction()

    def frozen_by_layer(self) -> Dict[str, float]:
        return self.server.frozen_by_layer()

    def params_sha256(self) -> str:
        return self.server.params_sha256()

