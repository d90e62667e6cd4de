"""RayBackend: a round's clients trained on long-lived trainer actors, aggregated on a server actor, any order in,
client order out."""

from __future__ import annotations

import logging
import os
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import ray
from ray.exceptions import RayActorError, RayTaskError

from hasfl_ray.engine.backend import Backend, RoundInterrupted, optimizer_settings, trainer_error
from hasfl_ray.engine.config import RunConfig, fault_inject_round
from hasfl_ray.engine.server import NonFiniteModelError
from hasfl_ray.errors import ActorLostError, ConfigError
from hasfl_ray.registry import FILE_MODULES
from hasfl_ray.simulation import connect_ray, warn_auth_off
from hasfl_ray.simulation.actors import ServerActor, TaskReport, TrainerActor
from hasfl_ray.simulation.placement import ActorPlan, execution, plan_actors
from hasfl_ray.training.batched import group_tasks
from hasfl_ray.training.evaluate import evaluation_subset
from hasfl_ray.training.task import ClientTask

logger = logging.getLogger(__name__)

#: Tasks queued on one trainer at a time: the next starts as soon as one ends, with no round trip between.
TASKS_IN_FLIGHT = 2
#: Clients trained one at a time go to a trainer several per call when a round has many of them: about this many
#: calls per trainer a round (enough to balance the load), at most MAX_CLIENTS_PER_CALL clients each. Each call
#: costs the driver a submit and a result round trip (~2-4 ms of its CPU), which at 100 short clients a round was
#: a third of the round on a 2-core machine. Every client is still trained alone, from its own RNG streams, so
#: results do not depend on how clients are grouped into calls.
CALLS_PER_TRAINER = 8
MAX_CLIENTS_PER_CALL = 16
#: How often one client may lose its trainer (actor death) in one round before the run gives up.
MAX_ATTEMPTS = 3
#: Object store of a Ray instance this backend starts itself (bytes; Ray spills to disk beyond it).
OBJECT_STORE_BYTES = 2 * 1024 ** 3


@dataclass
class _Slot:
    """One trainer position: its current actor, which generation it is, and its tasks in flight."""

    index: int
    actor: Any
    generation: int = 0
    in_flight: int = 0


@dataclass
class _Pending:
    """A submitted unit of client tasks (one client, or a batched group): where it runs and its result
    references (one per task, in unit order)."""

    unit: List[int]
    slot: int
    generation: int
    results: List[Any]
    #: True: the unit is a batched group (Trainer.train_unit); False: its clients are trained one at a time.
    batched: bool = False


@dataclass
class RoundTiming:
    """Where one round's time went on the trainers (for benchmarks and logs).

    Attributes:
        train_seconds: local training summed over clients (inside Trainer.train).
        slot_train_seconds: the same per trainer slot (its busiest one bounds the round).
        replaced_actors: trainers that died and were replaced this round.
        retrained_clients: clients trained again because their trainer died.
    """

    train_seconds: float = 0.0
    slot_train_seconds: Dict[int, float] = field(default_factory=dict)
    replaced_actors: int = 0
    retrained_clients: List[int] = field(default_factory=list)


class RayBackend(Backend):
    """Trainer actors (each a :class:`Trainer` on a CPU core, a GPU or a GPU fraction) and one server actor.

    Per round: the server's parameters become one object-store object; every trainer reads it once; the
    driver hands clients out longest-first, ``TASKS_IN_FLIGHT`` calls per trainer, whichever trainer is free (with
    ``client_batching`` on, the batchable clients of one width go to one trainer together, as one unit; when a
    round has many single clients, a call carries several of them, see :func:`calls`);
    the results' references go, in client order, straight to the server actor, which aggregates. A trainer
    that dies is replaced and its unfinished clients trained again, from the same RNG streams, so the
    result is that of a run without the fault. Results never depend on the number of actors or nodes.
    """

    name = "ray"

    def __init__(self, warn_at_warm_up: bool = False) -> None:
        #: Warn of RAY_AUTH_MODE=disabled as Ray starts (a start after RUN/log.txt was opened: a handed-over run's),
        #: not in :meth:`start`.
        self.warn_at_warm_up = warn_at_warm_up
        self.owns_ray = False
        self.config: Optional[RunConfig] = None
        self._thread: Optional[threading.Thread] = None
        self._started, self._release = threading.Event(), threading.Event()
        self._start_error: Optional[BaseException] = None
        self._lock, self._abandoned = threading.Lock(), False
        self.slots: List[_Slot] = []
        self.server = None
        self._params_ref = self._evaluation = self._frozen = self._frozen_layers = None
        self.timing = RoundTiming()
        self.total_train_seconds = 0.0
        self.replaced_actors = 0

    # -- lifecycle ---------------------------------------------------------------------------------------

    def warm_up(self, config: RunConfig) -> None:
        """Start Ray and the actors' processes in the background while the engine loads the data (docs/ray.md,
        'Start-up'): a thread joins or starts Ray, plans the actors and creates them (each imports torch and sets up
        its process); :meth:`start` hands them the data. Errors wait for :meth:`wait_started`."""
        if self._thread is not None:
            return
        self.config = config
        self._thread = threading.Thread(target=self._start_in_background, args=(config,), name="hasfl-ray-start",
                                        daemon=True)
        self._thread.start()

    def _start_in_background(self, config: RunConfig) -> None:
        try:
            self.owns_ray = connect_ray(config.address, {"num_cpus": os.cpu_count(),
                                                         "object_store_memory": _object_store_bytes()},
                                    warn=self.warn_at_warm_up)
            self._create_actors(config)
        except BaseException as error:  # raised in the engine's thread by wait_started
            self._start_error = error
        finally:
            with self._lock:
                self._started.set()
                abandoned = self._abandoned
        if abandoned:  # the run stopped (Ctrl-C, an error) while Ray started: stop what this thread started
            self._stop_ray()
            return
        # Ray's own processes (GCS, raylet) die with the thread that started them (Linux PR_SET_PDEATHSIG): this
        # thread lives until shutdown() has stopped them (or the process ends).
        self._release.wait()

    def wait_started(self) -> None:
        """Wait for :meth:`warm_up` (started here if the engine did not) to have Ray and the actors' processes
        started; raise its one-sentence error (an address that does not answer, Ray that cannot start, actors that
        do not fit)."""
        self.warm_up(self.config)
        self._started.wait()
        if self._start_error is not None:
            error, self._start_error = self._start_error, None
            raise error

    def start(self, config: RunConfig, dataset, model_name, initial_params) -> None:
        self.config = config
        try:
            self.wait_started()
            if self.owns_ray and not self.warn_at_warm_up:
                warn_auth_off()  # here, where RUN/log.txt records it
            self._start_actors(config, dataset, model_name, initial_params)
        except BaseException:
            self.shutdown()
            raise

    def _create_actors(self, config: RunConfig) -> None:
        """The actors of :func:`plan_actors`, their processes started, not yet given the run's data."""
        resources = ray.cluster_resources()
        self.plan: ActorPlan = plan_actors(config, resources.get("CPU", 0), resources.get("GPU", 0))
        self._process = dict(device=self.plan.device, threads=config.trainer_threads,
                             deterministic=config.deterministic)  # what an actor's process needs before its data
        self._trainer_class = ray.remote(TrainerActor).options(
            num_cpus=self.plan.cpus_per_actor, num_gpus=self.plan.gpus_per_actor, max_restarts=0,
            max_task_retries=0)
        self.server = ray.remote(ServerActor).options(num_cpus=0, num_gpus=self.plan.server_gpus).remote(
            **self._process)
        self.slots = [_Slot(i, self._trainer_class.remote(**self._process)) for i in range(self.plan.actors)]

    def _start_actors(self, config: RunConfig, dataset, model_name, initial_params) -> None:
        """Give the started actors the run: the dataset, the model, w^(0); wait until every one is set up."""
        self.fault_round = fault_inject_round(config.fault_inject) if config.fault_inject else None
        self.dataset = dataset
        self.client_sizes = dataset.client_size
        for module in FILE_MODULES:  # plug-ins loaded from FILE.py: actors cannot import them, so ship them by value
            ray.cloudpickle.register_pickle_by_value(module)
        dataset_ref = ray.put(dataset)  # one copy in the object store; every actor reads it once
        self._trainer_args = (dataset_ref, model_name, optimizer_settings(config), self.plan.device,
                              config.trainer_threads, config.deterministic, config.cuda_graphs == "on")
        setups = [slot.actor.setup.remote(*self._trainer_args) for slot in self.slots] + [self.server.setup.remote(
            model_name, initial_params, ray.put(dataset.test_view()), config.eval_batch_size,
            config.aggregation_backend, self.plan.device, config.trainer_threads, config.deterministic,
            evaluation_subset(config.seed, dataset.test_size, config.eval_samples), config.estimator)]
        try:
            ray.get(setups)
            places = ray.get([slot.actor.ready.remote() for slot in self.slots] + [self.server.ready.remote()])
        except (RayActorError, RayTaskError) as error:
            raise _lost("a Ray actor failed to start", error) from None
        self.places = places  # where each trainer (then the server) runs, and its determinism settings
        self.nodes = len({place["node"] for place in places})
        logger.info("Ray backend: %d trainer actors on %d node(s), server on %s", len(self.slots), self.nodes,
                    places[-1]["device"])

    def shutdown(self) -> None:
        """Kill this backend's actors (freeing their memory, GPU memory included), and Ray if it started it; never
        waits for a start under way (Ctrl-C while an address is probed or Ray starts): the starting thread stops
        what it started once its start returns."""
        with self._lock:
            if self._thread is not None and not self._started.is_set():
                self._abandoned = True
                return
        self._stop_ray()
        self._release.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            # let the starting thread end now, not while the interpreter finalises: a thread still dropping its
            # objects then is ended by pthread_exit, which Ray's native terminate handler turns into an abort
            self._thread.join(10.0)

    def _stop_ray(self) -> None:
        if not ray.is_initialized():
            return
        for actor in [slot.actor for slot in self.slots] + ([self.server] if self.server is not None else []):
            ray.kill(actor, no_restart=True)
        self.slots, self.server = [], None
        if self.owns_ray:
            ray.shutdown()
            self.owns_ray = False

    def describe(self) -> Dict[str, object]:
        return execution(self.config, self.plan, self.nodes)

    # -- one round ---------------------------------------------------------------------------------------

    def run_round(self, tasks: Sequence[ClientTask], weights: Sequence[float], server_lr: float):
        if self._params_ref is None:
            self._send_params()
        results = self._train_all(tasks)
        applied = self.server.apply.remote(list(weights), server_lr, *results)
        # Queued behind the update on the server: evaluation runs while the driver observes the round, and
        # the next round's parameters reach the trainers before the engine asks for them.
        self._evaluation = self.server.evaluate.remote()
        self._frozen = self.server.frozen_fraction.remote()
        self._frozen_layers = self.server.frozen_by_layer.remote()
        self._send_params()
        try:
            return self._from_server(applied)
        except NonFiniteModelError as error:  # the server refused the update: its sentence, not Ray's traceback
            raise NonFiniteModelError(str(getattr(error, "cause", error))) from None

    def _send_params(self) -> None:
        """Put the server's current parameters in the object store once and hand the reference to every trainer."""
        self._params_ref = self.server.params.remote()
        for slot in self.slots:
            _begin_round(slot.actor, self._params_ref)

    def _train_all(self, tasks: Sequence[ClientTask]) -> List[Any]:
        """Train every task on whichever trainer is free; returns the result references in task order."""
        self.timing = RoundTiming()
        # Units: one client each, or (client_batching on) the batchable clients of one width together; the
        # grouping depends only on the tasks, never on the trainers, so results do not depend on the actors.
        units = group_tasks(tasks, batching=self.config.client_batching == "on")

        def cost(unit: List[int]) -> float:  # samples x width^2
            return sum(self.client_sizes(tasks[k].client) * tasks[k].width ** 2 for k in unit)

        # Longest first so the last unit to finish is a short one; single clients several to a call when many.
        order: Deque[Tuple[List[int], bool]] = deque(calls(
            sorted(units, key=lambda unit: (-cost(unit), tasks[unit[0]].client)), len(self.slots)))
        attempts = [0] * len(tasks)
        results: List[Any] = [None] * len(tasks)
        pending: Dict[Any, _Pending] = {}
        inject = self.fault_round is not None and tasks and tasks[0].round == self.fault_round

        def submit(slot: _Slot) -> None:
            while order and slot.in_flight < TASKS_IN_FLIGHT:
                unit, batched = order.popleft()
                for position in unit:
                    attempts[position] += 1
                if len(unit) == 1:
                    report, result = slot.actor.train.options(num_returns=2).remote(tasks[unit[0]])
                    refs = [result]
                else:
                    report, *refs = slot.actor.train_group.options(num_returns=1 + len(unit)).remote(
                        [tasks[k] for k in unit], batched)
                pending[report] = _Pending(unit, slot.index, slot.generation, refs, batched)
                slot.in_flight += 1

        for slot in self.slots:
            submit(slot)
        while pending:
            [ready], _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready)
            slot = self.slots[job.slot]
            same_actor = job.generation == slot.generation
            if same_actor:
                slot.in_flight -= 1
            try:
                report: TaskReport = ray.get(ready)
            except RayActorError as error:
                self._lost(tasks, job, attempts, error)
                order.appendleft((job.unit, job.batched))
                if same_actor:
                    self._replace(slot)
                submit(self.slots[job.slot])
                continue
            except RayTaskError as error:
                cause = error.as_instanceof_cause()
                if isinstance(cause, ConfigError):
                    raise cause from None  # bad input met while training: its own sentence
                raise trainer_error([tasks[k] for k in job.unit], getattr(error, "cause", None) or error,
                                    str(error)) from None
            for position, result in zip(job.unit, job.results):
                results[position] = result
            if self.should_stop():
                raise RoundInterrupted  # before anything reaches the server: the model is the last round's
            self.timing.train_seconds += report.train_seconds
            self.timing.slot_train_seconds[job.slot] = \
                self.timing.slot_train_seconds.get(job.slot, 0.0) + report.train_seconds
            if inject:
                inject = not self._inject_fault(tasks[0].round)
            if same_actor:
                submit(slot)
        self.total_train_seconds += self.timing.train_seconds
        return results

    def _lost(self, tasks: Sequence[ClientTask], job: _Pending, attempts: List[int], error: Exception) -> None:
        for position in job.unit:
            task = tasks[position]
            if attempts[position] >= MAX_ATTEMPTS:
                raise _lost(f"client {task.client} of round {task.round} lost its trainer actor "
                            f"{attempts[position]} times", error)
        for position in job.unit:
            task = tasks[position]
            logger.warning("trainer actor %d died while training client %d of round %d; training it again",
                           job.slot, task.client, task.round)
            self.timing.retrained_clients.append(task.client)

    def _replace(self, slot: _Slot) -> None:
        """Start a new trainer in ``slot`` (same resources), give it the round's parameters."""
        ray.kill(slot.actor, no_restart=True)
        slot.actor = self._trainer_class.remote(**self._process)
        slot.actor.setup.remote(*self._trainer_args)
        slot.generation += 1
        slot.in_flight = 0
        _begin_round(slot.actor, self._params_ref)
        self.replaced_actors += 1
        self.timing.replaced_actors += 1

    def _inject_fault(self, round: int) -> bool:
        """Kill the trainer with the most clients in flight (testing only); True once one was killed."""
        busy = [slot for slot in self.slots if slot.in_flight > 0]
        if not busy:
            return False
        victim = max(busy, key=lambda slot: (slot.in_flight, -slot.index))
        logger.warning("fault injection: killing trainer actor %d with %d clients in flight in round %d",
                       victim.index, victim.in_flight, round)
        ray.kill(victim.actor, no_restart=True)
        return True

    # -- the server ---------------------------------------------------------------------------------------

    def evaluate(self) -> Tuple[float, float]:
        ref, self._evaluation = self._evaluation or self.server.evaluate.remote(), None
        return self._from_server(ref)

    def evaluate_widths(self, widths, submodels=None):
        return self._from_server(self.server.evaluate_widths.remote(list(widths), submodels))

    def test_beats(self, widths, submodels=None):
        return self._from_server(self.server.test_beats.remote(list(widths), submodels))

    def frozen_fraction(self) -> float:
        ref, self._frozen = self._frozen or self.server.frozen_fraction.remote(), None
        return self._from_server(ref)

    def frozen_by_layer(self) -> Dict[str, float]:
        ref, self._frozen_layers = self._frozen_layers or self.server.frozen_by_layer.remote(), None
        return self._from_server(ref)

    def get_params(self):
        return self._from_server(self._params_ref if self._params_ref is not None else self.server.params.remote())

    def set_params(self, params) -> None:
        self._from_server(self.server.set_params.remote(params))
        self._params_ref = self._evaluation = self._frozen = self._frozen_layers = None  # of the replaced params

    def params_sha256(self) -> str:
        return self._from_server(self.server.params_sha256.remote())

    @staticmethod
    def _from_server(ref):
        """``ray.get`` of a server call: a dead server actor (killed, out of memory, its node lost) ends the run in
        one sentence (the run's state lives there; the checkpoint on disk does not)."""
        try:
            return ray.get(ref)
        except RayActorError as error:
            raise _lost("the Ray server actor died", error) from None


def _begin_round(actor, params_ref) -> None:
    """Hand a trainer the round's parameters. No result reference: when the server died, the call fails for want of
    its parameters, and an unread failed reference would print Ray's 'Unhandled error' report on the terminal
    beside the run's own sentence."""
    actor.begin_round.options(num_returns=0).remote(params_ref)


def _lost(what: str, error: BaseException) -> ActorLostError:
    """One sentence for a lost actor (``what`` and Ray's error class); Ray's report goes to RUN/log.txt."""
    return ActorLostError(f"{what} ({type(error).__name__})",
                          "".join(traceback.format_exception(type(error), error, error.__traceback__)))


def calls(units: Sequence[List[int]], trainers: int) -> List[Tuple[List[int], bool]]:
    """The trainer calls of a round, in ``units``' order: each batched group (a unit of several clients) is one
    call ``(unit, True)``; consecutive single clients are put together, ``(clients, False)``, up to a size that
    leaves about CALLS_PER_TRAINER calls per trainer (one client per call when a round has few)."""
    singles = sum(1 for unit in units if len(unit) == 1)
    size = max(1, min(MAX_CLIENTS_PER_CALL, singles // max(1, trainers * CALLS_PER_TRAINER)))
    out: List[Tuple[List[int], bool]] = []
    current: List[int] = []
    for unit in units:
        if len(unit) > 1:
            out.append((list(unit), True))
            continue
        current.append(unit[0])
        if len(current) == size:
            out.append((current, False))
            current = []
    if current:
        out.append((current, False))
    return out


def _object_store_bytes() -> int:
    """OBJECT_STORE_BYTES, or 30% of this machine's memory when that is less (Ray's own default share)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return OBJECT_STORE_BYTES
    return int(min(OBJECT_STORE_BYTES, 0.3 * total))
