"""RayBackend: a round's clients trained on long-lived trainer actors, aggregated by the server (in the driver or on
a server actor: ``server_placement``), any order in, client order out."""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple

import ray
from ray.exceptions import RayActorError, RayTaskError

from hasfl_ray.threads import actor_environment
from hasfl_ray.aggregation.label_split import label_masks_for
from hasfl_ray.engine.backend import Backend, optimizer_settings
from hasfl_ray.engine.config import RunConfig, fault_inject_round
from hasfl_ray.engine.server import NonFiniteModelError, statistics_plan
from hasfl_ray.models import build_model, pads_exactly
from hasfl_ray.registry import FILE_MODULES
from hasfl_ray.simulation import connect_ray, warn_auth_off
from hasfl_ray.simulation.actors import Inline, ServerActor, TrainerActor
from hasfl_ray.simulation.asynchronous import AsyncTransport
from hasfl_ray.simulation.costs import (  # noqa: F401 (calls, evaluation_cost and the two counts re-exported)
    CALLS_PER_TRAINER, UNITS_PER_CALL, CostModel, calls, evaluation_cost)
from hasfl_ray.simulation.placement import ActorPlan, execution, plan_actors
from hasfl_ray.simulation.server_port import ActorServer, DriverServer
from hasfl_ray.simulation.transport import (  # noqa: F401 (re-exported)
    MAX_ATTEMPTS, TASKS_IN_FLIGHT, RoundTiming, Transport, _lost, _Pending, _Slot)
from hasfl_ray.simulation.waiting import wait_placed
from hasfl_ray.simulation.wire import unpack
from hasfl_ray.training.batched import group_tasks
from hasfl_ray.training.evaluate import evaluation_subset
from hasfl_ray.training.task import ClientTask

logger = logging.getLogger(__name__)

#: Object store of a Ray instance this backend starts itself (bytes; Ray spills to disk beyond it).
OBJECT_STORE_BYTES = 2 * 1024 ** 3
#: In a Ray instance this backend starts itself, an object up to this many bytes (a trainer call's packed results,
#: the small models' parameters) travels inside the call's own message, from the process that made it to the one
#: that owns it, instead of through the object store (Ray's ``max_direct_call_object_size``, 100 KiB by default):
#: on the digits' 0.1 s HAS-FL rounds (results 250-530 KiB a call, parameters 207 KiB) the raylet's CPU per round
#: fell from ~6 to ~3 ms and the trainers' result store from 1-8 ms to ~0.3 ms (benchmarks/RESULTS.md, "Short
#: rounds on Ray"). Larger objects (EMNIST's results are ~25 MiB) still go through the object store, whose
#: shared memory is the cheaper path at that size. Placement only: results are the same bits either way.
INLINE_OBJECT_BYTES = 2 * 1024 ** 2


class RayBackend(AsyncTransport, Transport, Backend):
    """Trainer actors (each a :class:`Trainer` on a CPU core, a GPU or a GPU fraction) and one server, in the driver
    or on an actor of its own (:mod:`hasfl_ray.simulation.server_port`).

    Per round: the server's parameters become one object-store object; every trainer reads it once; the
    driver hands clients out longest-first, ``TASKS_IN_FLIGHT`` calls per trainer, whichever trainer is free (with
    ``client_batching`` on, the batchable clients of one width go to one trainer together, as one unit; mixed: of
    every width, for a model that pads exactly; when a round has many single clients, a call carries several of
    them, see :func:`calls`);
    the results' references go, in client order, to the server, which aggregates: in the driver, which reads them
    from the object store itself, or on the server actor, which Ray hands them to. A trainer
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
        self._params_ref = self._frozen = self._frozen_layers = None
        self._eval_loads: Dict[int, float] = {}  # per slot, the evaluation cost sent to it since the last round
        self._eval_pending: Dict[int, Dict[str, float]] = {}  # per slot and method, the evaluation cost sent to it
        # since its last call
        self._queued: List[Any] = []  # the submissions of evaluations held back for the next round (request)
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
            self.owns_ray = connect_ray(config.address, {
                "num_cpus": os.cpu_count(), "object_store_memory": _object_store_bytes(),
                "_system_config": {"max_direct_call_object_size": INLINE_OBJECT_BYTES}}, warn=self.warn_at_warm_up)
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
        environment = {"env_vars": actor_environment()}  # OMP_WAIT_POLICY before the actor loads torch
        self._trainer_class = ray.remote(TrainerActor).options(
            num_cpus=self.plan.cpus_per_actor, num_gpus=self.plan.gpus_per_actor, max_restarts=0,
            max_task_retries=0, runtime_env=environment)
        if self.plan.server == "actor":  # else the driver's, made with the run's data (_start_actors)
            self.server = ActorServer(ray.remote(ServerActor).options(
                num_cpus=0, num_gpus=self.plan.server_gpus, runtime_env=environment).remote(**self._process))
        self.slots = [_Slot(i, self._trainer_class.remote(**self._process)) for i in range(self.plan.actors)]

    def _start_actors(self, config: RunConfig, dataset, model_name, initial_params) -> None:
        """Give the started actors the run: the dataset, the model, w^(0); wait until every one is set up."""
        self.fault_round = fault_inject_round(config.fault_inject) if config.fault_inject else None
        self.dataset = dataset
        self.client_sizes = dataset.client_size
        self.costs = CostModel(dataset.client_size, config.batch_size, config.local_epochs, config.local_steps)
        self._features: Dict[Tuple[int, ...], Tuple[float, float]] = {}
        # whether clients of several widths may train padded to the widest (--client-batching mixed); the driver
        # plans the units, so it asks the model (registered by the engine) itself
        self.pads_exactly = config.client_batching == "mixed" and pads_exactly(build_model(model_name))
        for module in FILE_MODULES:  # plug-ins loaded from FILE.py: actors cannot import them, so ship them by value
            ray.cloudpickle.register_pickle_by_value(module)
        dataset_ref = ray.put(dataset)  # one copy in the object store; every actor reads it once
        eval_indices = evaluation_subset(config.seed, dataset.test_size, config.eval_samples)
        self._trainer_args = (dataset_ref, model_name, optimizer_settings(config), self.plan.device,
                              config.trainer_threads, config.deterministic, config.cuda_graphs == "on",
                              (config.eval_batch_size, eval_indices, statistics_plan(config)))
        setups = [slot.actor.setup.remote(*self._trainer_args) for slot in self.slots]
        server_args = (model_name, initial_params, dataset.test_view(), config.eval_batch_size,
                       config.aggregation_backend, self.plan.device, config.trainer_threads, config.deterministic,
                       eval_indices, config.estimator, statistics_plan(config),
                       label_masks_for(config, dataset, model_name))
        if self.plan.server == "actor":
            setups.append(self.server.actor.setup.remote(*server_args[:2], ray.put(server_args[2]), *server_args[3:]))
        try:
            wait_placed(setups, self.should_stop, self.plan.describe_actors())
            places = ray.get([slot.actor.ready.remote() for slot in self.slots] +
                             ([self.server.actor.ready.remote()] if self.plan.server == "actor" else []))
        except (RayActorError, RayTaskError) as error:
            raise _lost("a Ray actor failed to start", error) from None
        if self.plan.server == "driver":  # the driver's torch settings are the run's already (Engine, local backend)
            # the parameters inside the calls where Ray sends a call's arguments up to INLINE_OBJECT_BYTES as they
            # are: in the Ray this run started (a joined cluster's calls would put them in the store each time)
            self.server = DriverServer(ServerActor(*server_args), INLINE_OBJECT_BYTES if self.owns_ray else 0)
        self.places = places  # where each trainer (then the server actor) runs, and its determinism settings
        self.nodes = len({place["node"] for place in places})
        logger.info("Ray backend: %d trainer actors on %d node(s), server in the %s on %s", len(self.slots),
                    self.nodes, self.plan.server, self.plan.device)

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
        for slot in self.slots:
            ray.kill(slot.actor, no_restart=True)
        if self.server is not None:
            self.server.stop()
        self.slots, self.server = [], None
        if self.owns_ray:
            ray.shutdown()
            self.owns_ray = False

    def describe(self) -> Dict[str, object]:
        return execution(self.config, self.plan, self.nodes)

    # -- one round ---------------------------------------------------------------------------------------

    def run_round(self, tasks: Sequence[ClientTask], weights: Sequence[float], server_lr: float,
                  optimizer: Any = None, keep_updates: bool = False):
        if self._params_ref is None:
            self._params_ref = self.server.params()
        layout, results = self._train_all(tasks)
        self._eval_loads = {}
        try:
            (accepted, aggregate, self._frozen, self._frozen_layers), self._params_ref = self.server.round(
                weights, server_lr, layout, optimizer, results, keep_updates)
        except NonFiniteModelError as error:  # the server refused the update: its sentence, not Ray's traceback
            self._params_ref = None
            raise NonFiniteModelError(str(getattr(error, "cause", error))) from None
        # the next round's calls (training, evaluation) carry self._params_ref; each trainer reads it once
        return accepted, aggregate

    def _train_all(self, tasks: Sequence[ClientTask]) -> Tuple[List[List[int]], List[Any]]:
        """Train every task; returns, per trainer call, the task positions it trained and the reference to its
        results (one object per call)."""
        self.timing = RoundTiming()
        # Units: one client each, or (client_batching on) the batchable clients of one width together, or (mixed)
        # of every width; the grouping depends only on the tasks (and the model), never on the trainers, so results
        # do not depend on the actors.
        batching = self.config.client_batching if self.config.client_batching in ("on", "mixed") else "off"
        units = group_tasks(tasks, batching=batching, pads_exactly=self.pads_exactly)
        # each unit's cost (hasfl_ray/simulation/costs.py: its steps' fixed price and width-squared arithmetic, the
        # two fitted from the trainers' reported seconds), and its terms kept to fit them with (_observe)
        features = [self.costs.features(tasks, unit, batching) for unit in units]
        self._features = {tuple(unit): terms for unit, terms in zip(units, features)}
        planned = self._plan_with_evaluations(units, features)
        order: Deque[List[Tuple[List[int], bool]]] = deque(
            planned or calls(units, self.costs.costs(features), len(self.slots)))
        return self._send(tasks, order)

    def _plan_with_evaluations(self, units, features) -> Optional[List[List[Tuple[List[int], bool]]]]:
        """With one call per trainer, the last round's evaluations (queued by :meth:`request`, each run behind its
        trainer's call) placed first, heaviest first on the least loaded trainer, and the units planned around them,
        all in measured seconds (hasfl_ray/simulation/costs.py): call i for trainer i. None (the plan by costs alone)
        until both prices are measured, with several calls per trainer, or when a trainer would get no unit."""
        queued = [submit for submit in self._queued if "ref" not in submit.call]
        seconds = self.costs.seconds(features)
        predicted = [self.costs.evaluation_seconds(submit.method, submit.cost) for submit in queued]
        if not queued or seconds is None or None in predicted or len(units) > UNITS_PER_CALL * len(self.slots):
            return None
        loads = [0.0] * len(self.slots)
        places = []
        for k in sorted(range(len(queued)), key=lambda k: -predicted[k]):
            target = min(reversed(range(len(loads))), key=loads.__getitem__)  # the last first on a tie, as request
            loads[target] += predicted[k]
            places.append((queued[k], target))
        planned = calls(units, seconds, len(self.slots), preload=loads)
        if not all(planned):
            return None
        for submit, target in places:
            submit.call["slot"] = target
        return planned

    def _observe(self, job: _Pending, report: Any) -> None:
        """A trainer call of this round reported: its units' CPU seconds, and those of the evaluations its trainer
        ran since its previous call, points for the cost model."""
        spent = getattr(report, "unit_seconds", ())
        if len(spent) == len(job.call):
            for (unit, _), seconds in zip(job.call, spent):
                if tuple(unit) in self._features:
                    self.costs.observe(self._features[tuple(unit)], seconds)
        for method, seconds in getattr(report, "eval_seconds", ()):
            self.costs.observe_evaluation(method, job.eval_cost.get(method, 0.0), seconds)

    # -- the server ---------------------------------------------------------------------------------------

    overlaps_evaluation = True

    def request(self, method: str, *args: Any):
        """The evaluation of this round's model, on a trainer (the last first), submitted behind the next round's
        training there (or at once, when its result is asked for first): the trainers hold these parameters
        anyway, and the evaluation then runs while the server aggregates that round, when the trainers would wait
        (docs/ray.md, 'A round on Ray'). A trainer lost before it answers: the server evaluates the same
        parameters."""
        if self._params_ref is None:
            self._params_ref = self.server.params()
        params = [self._params_ref]
        cost = evaluation_cost(method, args)
        call: Dict[str, Any] = {}

        def submit() -> None:
            if "ref" not in call:  # where the round's plan put it (_plan_with_evaluations), else to the trainer
                # with the least evaluation so far, the lightest-trained on a tie
                slot = self.slots[call["slot"]] if call.get("slot", len(self.slots)) < len(self.slots) else \
                    min(reversed(self.slots), key=lambda s: self._eval_loads.get(s.index, 0.0))
                self._eval_loads[slot.index] = self._eval_loads.get(slot.index, 0.0) + cost
                sent = self._eval_pending.setdefault(slot.index, {})
                sent[method] = sent.get(method, 0.0) + cost
                call["ref"], call["on"] = slot.actor.evaluate_at.remote(self._carried(slot, params), method,
                                                                        *args), slot.index

        submit.call, submit.cost, submit.method = call, cost, method  # type: ignore[attr-defined]  # for the plan
        self._queued.append(submit)

        def result():
            submit()
            try:
                return ray.get(call["ref"])
            except RayActorError:
                return self.server.call("evaluate_at", params, method, *args)

        result.ready = lambda: "ref" in call and bool(ray.wait([call["ref"]], timeout=0)[0])
        return result

    def _submit_queued(self) -> List[Tuple[Any, int]]:
        """Submit the evaluations :meth:`request` holds back (behind the training just submitted); returns the
        reference and trainer slot of each submitted now."""
        queued, self._queued = self._queued, []
        sent = []
        for submit in queued:
            if "ref" not in submit.call:
                submit()
                sent.append((submit.call["ref"], submit.call["on"]))
        return sent

    def evaluate(self) -> Tuple[float, float]:
        return self.request("evaluate")()

    def evaluate_widths(self, widths, submodels=None):
        return self.request("evaluate_widths", widths, submodels)()

    def test_beats(self, widths, submodels=None):
        return self.request("test_beats", widths, submodels)()

    def evaluate_depths(self, depths):
        return self.request("evaluate_depths", depths)()

    def test_logits(self, indices, width=1.0, groups=None):
        return self.request("test_logits", indices, width, groups)()

    def frozen_fraction(self) -> float:
        value, self._frozen = self._frozen, None  # the round's, read with its summary
        return self.server.call("frozen_fraction") if value is None else value

    def frozen_by_layer(self) -> Dict[str, float]:
        value, self._frozen_layers = self._frozen_layers, None
        return self.server.call("frozen_by_layer") if value is None else value

    def get_params(self):
        return self.params_later()()

    def params_later(self):
        """This round's parameters as the calls carry them (a reference to one object-store object, kept while it
        is held, or the :class:`Inline` copy), read when called."""
        ref = self._params_ref if self._params_ref is not None else self.server.params()
        return lambda: unpack(ref.packed if isinstance(ref, Inline) else self._from_server(ref))

    def set_params(self, params) -> None:
        self.server.call("set_params", params)
        self._params_ref = self._frozen = self._frozen_layers = None  # of the replaced params

    def params_sha256(self) -> str:
        return self.server.call("params_sha256")


def _object_store_bytes() -> int:
    """OBJECT_STORE_BYTES, or 30% of this machine's memory when that is less (Ray's own default share)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return OBJECT_STORE_BYTES
    return int(min(OBJECT_STORE_BYTES, 0.3 * total))
