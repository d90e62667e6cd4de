"""The Ray backend's transport: trainer slots, the calls pending on them, and a dead trainer's calls retried."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Iterable, List, Sequence, Tuple

import ray
from ray.exceptions import RayActorError, RayTaskError

from hasfl_ray.engine.backend import RoundInterrupted, trainer_error
from hasfl_ray.errors import ActorLostError, ConfigError
from hasfl_ray.simulation.actors import Held, Inline, TaskReport
from hasfl_ray.simulation.wire import pack_units
from hasfl_ray.training.task import ClientTask

#: The Ray backend's own logger: RUN/log.txt names these lines hasfl_ray.simulation.backend, as it always has.
logger = logging.getLogger("hasfl_ray.simulation.backend")

#: Tasks queued on one trainer at a time: the next starts as soon as one ends, with no round trip between.
TASKS_IN_FLIGHT = 2
#: How often one client may lose its trainer (actor death) in one round before the run gives up.
MAX_ATTEMPTS = 3


@dataclass
class _Slot:
    """One trainer position: its current actor, which generation it is, and its tasks in flight."""

    index: int
    actor: Any
    generation: int = 0
    in_flight: int = 0
    #: The version of the last :class:`Inline` parameters sent to this actor (None: none, or a new actor).
    sent: Any = None


@dataclass
class _Pending:
    """A submitted trainer call: its units (``(positions, batched)`` each), their task positions in call order,
    where it runs, and the reference to its results (one object)."""

    call: List[Tuple[List[int], bool]]
    positions: List[int]
    slot: int
    generation: int
    #: The reference to its results, or None where the call's one object holds its report and its results
    #: together (the server in the driver, which reads both at once: :meth:`Transport._send`).
    result: Any
    #: Per method, the evaluation cost (:func:`~hasfl_ray.simulation.costs.evaluation_cost`) sent to its trainer
    #: since the trainer's previous call: what this call's report measures the seconds of.
    eval_cost: Dict[str, float] = field(default_factory=dict)


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


class Transport:
    """How :class:`~hasfl_ray.simulation.backend.RayBackend` reaches its actors (mixed into it): a round's calls
    sent to the trainer slots and gathered, a dead trainer replaced and its calls sent again, a dead server one
    sentence. It uses the backend's ``slots``, ``timing``, ``total_train_seconds``, ``replaced_actors``,
    ``_params_ref``, ``server``, ``fault_round``, ``_trainer_class``, ``_process``, ``_trainer_args``,
    ``_submit_queued``, ``_observe``, ``_eval_pending``, ``while_training`` and ``should_stop``."""

    #: The engine's records (``while_training``) were not made during the last round: the next one makes them as
    #: soon as its calls are sent (:meth:`_send`).
    _records_owed = False

    def _send(self, tasks: Sequence[ClientTask],
              order: Deque[List[Tuple[List[int], bool]]]) -> Tuple[List[List[int]], List[Any]]:
        """Send ``order``, a round's planned calls (heaviest first), to the trainers, ``TASKS_IN_FLIGHT`` calls
        per trainer, whichever trainer is free; a call whose trainer died goes again to its replacement. Returns,
        per trainer call, the task positions it trained and the reference to its results (one object per call)."""
        attempts = [0] * len(tasks)
        layout: List[List[int]] = []
        results: List[Any] = []
        pending: Dict[Any, _Pending] = {}
        inject = self.fault_round is not None and tasks and tasks[0].round == self.fault_round
        params = [self._params_ref]
        # A server in the driver reads every call's results as they arrive: each call returns them with its report
        # as one object (a server actor takes the results by reference, so there they are a return of their own).
        together = getattr(self.server, "where", None) == "driver"

        def submit(slot: _Slot, most: int = TASKS_IN_FLIGHT) -> None:
            while order and slot.in_flight < most:
                call = order.popleft()
                positions = [k for unit, _ in call for k in unit]
                for position in positions:
                    attempts[position] += 1
                # the tasks' masks in one buffer (wire.pack_units), not pickled tensor by tensor
                carried, units = self._carried(slot, params), pack_units([([tasks[k] for k in unit], batched)
                                                                          for unit, batched in call])
                if together:  # one object, (report, results): one return for the trainer to store, one read here
                    report, result = slot.actor.run.remote(carried, units), None
                else:  # the report for this driver, the results by reference for the server actor
                    report, result = slot.actor.run.options(num_returns=2).remote(carried, units)
                pending[report] = _Pending(call, positions, slot.index, slot.generation, result,
                                           self._eval_pending.pop(slot.index, {}))
                slot.in_flight += 1

        for most in range(1, TASKS_IN_FLIGHT + 1):  # the heaviest calls first, one to each trainer in turn
            for slot in self.slots:
                submit(slot, most)
        # the last round's evaluations, behind this round's training: {reference: trainer slot}
        evaluations = dict(self._submit_queued())
        if inject:  # testing only: kill the busiest trainer while its call is in flight
            self._inject_fault(tasks[0].round, pending.values())
        # The engine records the lines evaluated by now (metrics, TensorBoard, a checkpoint: ~3 ms of CPU and four
        # fsyncs, 2.5-8 ms of the driver's wall) once a trainer has nothing left to do this round while another
        # still trains: on a core no trainer needs, off the hand-off between rounds. A round without such a moment
        # owes them to the next, which records them here, its calls sent: while the trainers train, not while they
        # wait for this driver (docs/ray.md, 'A round on Ray'). One trainer: while it trains, as there is no moment.
        recorded = len(self.slots) < 2
        if recorded or self._records_owed:
            self._records_owed = False
            self.while_training()

        def record_if_idle(index: int) -> bool:
            if order or not pending or self.slots[index].in_flight or index in evaluations.values():
                return False
            self.while_training()
            return True

        while pending:
            [ready], _ = ray.wait(list(pending) + ([] if recorded else list(evaluations)), num_returns=1)
            if ready in evaluations:
                recorded = record_if_idle(evaluations.pop(ready))
                continue
            job = pending.pop(ready)
            slot = self.slots[job.slot]
            same_actor = job.generation == slot.generation
            if same_actor:
                slot.in_flight -= 1
            try:
                report: TaskReport = ray.get(ready)
                if job.result is None:  # (report, results) in one object
                    report, job.result = report
            except RayActorError as error:
                self._lost(tasks, job, attempts, error)
                order.appendleft(job.call)
                if same_actor:
                    self._replace(slot)
                submit(self.slots[job.slot])
                continue
            except RayTaskError as error:
                cause = error.as_instanceof_cause()
                if isinstance(cause, ConfigError):
                    raise cause from None  # bad input met while training: its own sentence
                raise trainer_error([tasks[k] for k in job.positions], getattr(error, "cause", None) or error,
                                    str(error)) from None
            layout.append(job.positions)
            results.append(self.server.receive(job.result))  # a driver's server reads it now, while others train
            if self.should_stop():
                raise RoundInterrupted  # before anything reaches the server: the model is the last round's
            self.timing.train_seconds += report.train_seconds
            self._observe(job, report)
            self.timing.slot_train_seconds[job.slot] = \
                self.timing.slot_train_seconds.get(job.slot, 0.0) + report.train_seconds
            if same_actor:
                submit(slot)
            if not recorded:
                recorded = record_if_idle(job.slot)
        if not recorded:  # no trainer was done before the last call came back: after the next round's calls
            self._records_owed = True
        self.total_train_seconds += self.timing.train_seconds
        return layout, results

    def _lost(self, tasks: Sequence[ClientTask], job: _Pending, attempts: List[int], error: Exception) -> None:
        for position in job.positions:
            task = tasks[position]
            if attempts[position] >= MAX_ATTEMPTS:
                raise _lost(f"client {task.client} of round {task.round} lost its trainer actor "
                            f"{attempts[position]} times", error)
        for position in job.positions:
            task = tasks[position]
            logger.warning("trainer actor %d died while training client %d of round %d; training it again",
                           job.slot, task.client, task.round)
            self.timing.retrained_clients.append(task.client)

    @staticmethod
    def _carried(slot: _Slot, params: List[Any]) -> List[Any]:
        """``params`` (``[ref]`` or ``[Inline]``) as a call to ``slot``'s trainer carries them: an :class:`Inline`
        of the version this trainer's previous parameters were (sent by an earlier call, which Ray runs first) as
        that version alone (:class:`Held`), so the parameters travel once per trainer and model: not with the
        round's evaluations queued behind its training, nor with each client of an asynchronous run (207 KiB on
        the digits, serialised by the driver and read by the trainer each time)."""
        carried = params[0]
        if not isinstance(carried, Inline):
            return params
        if slot.sent == carried.version:
            return [Held(carried.version)]
        slot.sent = carried.version
        return params

    def _replace(self, slot: _Slot) -> None:
        """Start a new trainer in ``slot`` (same resources), give it the round's parameters."""
        ray.kill(slot.actor, no_restart=True)
        slot.actor = self._trainer_class.remote(**self._process)
        slot.actor.setup.remote(*self._trainer_args)
        slot.generation += 1
        slot.in_flight = 0
        slot.sent = None  # the new actor holds no parameters yet
        self.replaced_actors += 1
        self.timing.replaced_actors += 1

    def _inject_fault(self, round: int, pending: Iterable[_Pending]) -> bool:
        """Kill the trainer with the most calls in flight (testing only); its warning counts their clients (a
        call holds several), the clients trained again. True once one was killed."""
        busy = [slot for slot in self.slots if slot.in_flight > 0]
        if not busy:
            return False
        victim = max(busy, key=lambda slot: (slot.in_flight, -slot.index))
        clients = sum(len(job.positions) for job in pending if job.slot == victim.index)
        logger.warning("fault injection: killing trainer actor %d with %d clients in flight in round %d",
                       victim.index, clients, round)
        ray.kill(victim.actor, no_restart=True)
        return True

    @staticmethod
    def _from_server(ref):
        """``ray.get`` of a server call: a dead server actor (killed, out of memory, its node lost) ends the run in
        one sentence (the run's state lives there; the checkpoint on disk does not)."""
        try:
            return ray.get(ref)
        except RayActorError as error:
            raise _lost("the Ray server actor died", error) from None
        except RayTaskError as error:  # bad input the server met (index sets beside a label split): its sentence
            cause = getattr(error, "cause", None)
            if isinstance(cause, ConfigError):
                raise type(cause)(str(cause)) from None
            raise


def _lost(what: str, error: BaseException) -> ActorLostError:
    """One sentence for a lost actor (``what`` and Ray's error class); Ray's report goes to RUN/log.txt."""
    return ActorLostError(f"{what} ({type(error).__name__})",
                          "".join(traceback.format_exception(type(error), error, error.__traceback__)))
