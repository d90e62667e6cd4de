"""Execution backends: how a round's client tasks are trained and handed to the server."""

from __future__ import annotations

import traceback
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.aggregation.label_split import label_masks_for
from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.config import RunConfig
from hasfl_ray.engine.server import Server
from hasfl_ray.errors import ConfigError, RoundInterrupted, TrainerError
from hasfl_ray.training.batched import group_tasks
from hasfl_ray.engine.server import statistics_plan
from hasfl_ray.training.evaluate import evaluation_subset
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.task import ClientTask, OptimizerSettings
from hasfl_ray.training.trainer import Trainer


def optimizer_settings(config: RunConfig) -> OptimizerSettings:
    return OptimizerSettings(momentum=config.momentum, weight_decay=config.weight_decay, clip_norm=config.clip_norm,
                             local_epochs=config.local_epochs, batch_size=config.batch_size,
                             local_steps=config.local_steps, augmentation=config.augmentation,
                             optimizer=config.local_optimizer, optimizer_options=dict(config.local_optimizer_options),
                             precision=config.precision)


def trainer_error(tasks: Sequence[ClientTask], error: BaseException, remote_traceback: str,
                  unit: str = "round") -> "TrainerError":
    """One sentence naming the client(s) and round (``unit``: an asynchronous client's is its dispatch) of a trainer
    that raised; the traceback travels with it."""
    clients = ", ".join(str(task.client) for task in tasks)
    detail = " ".join(str(error).split())[:120] or type(error).__name__
    return TrainerError(f"training client {clients} of {unit} {tasks[0].round} failed ({type(error).__name__}: "
                        f"{detail}); the trainer's traceback is in RUN/log.txt", remote_traceback)


class Backend(ABC):
    """Runs rounds for the :class:`~hasfl_ray.engine.engine.Engine`; results never depend on the backend."""

    name: str = "base"
    #: Asked at the end of every client: True stops the round with :class:`RoundInterrupted` (set by the Engine).
    should_stop: Callable[[], bool] = staticmethod(lambda: False)
    #: Called by a backend that trains elsewhere (Ray) once a round's training is under way (set by the Engine: it
    #: records the previous round's line then, see :attr:`overlaps_evaluation`).
    while_training: Callable[[], None] = staticmethod(lambda: None)

    def warm_up(self, config: RunConfig) -> None:
        """Begin, in the background, what takes long to start (Ray and its actors' processes) while the engine loads
        the data; :meth:`wait_started` and :meth:`start` raise its errors. Nothing for an in-process backend."""

    def wait_started(self) -> None:
        """Wait for :meth:`warm_up`'s start; raise its one-sentence error (called before the run directory is made)."""

    @abstractmethod
    def start(self, config: RunConfig, dataset: FederatedDataset, model_name: str,
              initial_params: Mapping[str, torch.Tensor]) -> None:
        """Create trainers and the server holding ``initial_params``."""

    @abstractmethod
    def run_round(self, tasks: Sequence[ClientTask], weights: Sequence[float], server_lr: float,
                  optimizer: Any = None, keep_updates: bool = False) -> Tuple[List[ClientResult], AggregateResult]:
        """Train ``tasks`` (sorted by client), aggregate in that order, update the global model (with the server
        ``optimizer``, :class:`~hasfl_ray.aggregation.server_optim.ServerOptimizer`; None, or not passed: w + η Δ̄).

        Returns :meth:`Server.apply`'s accepted results (updates emptied, unless ``keep_updates``: asked only for
        an algorithm that inspects them, :mod:`hasfl_ray.engine.inspection`) and aggregate statistics.
        """

    #: True where an evaluation started by :meth:`request` runs beside the next round's training (Ray: on the
    #: server actor while the trainers train), so the engine may record a round's line once the next round has
    #: trained (docs/ray.md, 'A round on Ray'). False here: everything runs in turn in this process.
    overlaps_evaluation: bool = False

    def request(self, method: str, *args: Any) -> Callable[[], Any]:
        """Start the evaluation ``method(*args)`` of the current global model (``evaluate``, ``evaluate_widths`` or
        ``test_beats``) and return a function giving its result (its ``ready()`` says whether the result is in); a
        later round's training does not change it. Here it is computed at once."""
        value = getattr(self, method)(*args)

        def result():
            return value

        result.ready = lambda: True  # whether the result is in (asking for it would not wait)
        return result

    @abstractmethod
    def evaluate(self) -> Tuple[float, float]:
        """(accuracy, loss) of the full-width global model."""

    @abstractmethod
    def evaluate_widths(self, widths: Sequence[float], submodels: Optional[Mapping[float, Mapping[str, torch.Tensor]]]
                        = None) -> Dict[float, Tuple[float, float]]:
        """(accuracy, loss) of the global model cut to each width (:meth:`Server.evaluate_widths`)."""

    @abstractmethod
    def test_beats(self, widths: Sequence[float], submodels: Optional[Mapping[float, Mapping[str, torch.Tensor]]]
                   = None) -> Tuple[np.ndarray, Dict[float, np.ndarray]]:
        """The test labels and each width's beats bitmasks, for local accuracy (:meth:`Server.test_beats`)."""

    def test_logits(self, indices: np.ndarray, width: float = 1.0,
                    groups: Optional[Sequence[int]] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The labels and the global model's logits on the test samples ``indices`` (:meth:`Server.test_logits`)."""
        raise NotImplementedError(f"{type(self).__name__} does not evaluate test logits")

    @abstractmethod
    def frozen_fraction(self) -> float: ...

    @abstractmethod
    def frozen_by_layer(self) -> Dict[str, float]:
        """Parameter name -> fraction of its entries still bit-identical to w^(0) (:meth:`Server.frozen_by_layer`)."""

    @abstractmethod
    def get_params(self) -> Dict[str, torch.Tensor]: ...

    def params_later(self) -> Callable[[], Dict[str, torch.Tensor]]:
        """The current global parameters, to be read later (after further rounds changed them): a deferred
        checkpoint's (:meth:`Engine.run_round`). By default a copy taken now."""
        params = self.get_params()
        return lambda: params

    @abstractmethod
    def set_params(self, params: Mapping[str, torch.Tensor]) -> None: ...

    @abstractmethod
    def params_sha256(self) -> str: ...

    # -- the asynchronous mode (hasfl_ray.engine.asynchronous, docs/async.md) ---------------------------------------

    def dispatch(self, task: ClientTask) -> Any:
        """Start training ``task`` from the current global model (an asynchronous client dispatched now); returns a
        handle that :meth:`apply_arrivals` takes once the client's update arrives. Results depend on the task and
        the model only, never on when or where it trains."""
        raise NotImplementedError(f"{type(self).__name__} does not run asynchronous clients")

    def defer_dispatches(self, on: bool, train_left: bool = True) -> None:
        """Whether :meth:`dispatch` may leave the training for later (:meth:`train_deferred`): a backend that trains
        in this process (the local one) then runs the loop's bookkeeping of several dispatches back to back. Those
        left when it is switched off are trained (``train_left``) or forgotten (the run is over: their updates
        never arrive). Here: never deferred (a backend training elsewhere starts each task at its dispatch)."""

    def train_deferred(self) -> None:
        """Train the dispatches left for later, in dispatch order, from the model they were dispatched from (the
        asynchronous loop calls it before the server's model changes; reading a handle does too)."""

    def apply_arrivals(self, handles: Sequence[Any], weights: Sequence[float], server_lr: float,
                       bases: Optional[Sequence[Optional[int]]] = None, optimizer: Any = None
                       ) -> Tuple[List[ClientResult], AggregateResult]:
        """One server update from the arrived clients ``handles`` (in arrival order): :meth:`Server.apply` with
        ``weights``, ``server_lr``, (FedAsync) the model ``bases`` they started from and the server ``optimizer``
        (FedBuff's server momentum among them)."""
        raise NotImplementedError(f"{type(self).__name__} does not run asynchronous clients")

    def server_momentum(self) -> Optional[Dict[str, Any]]:
        """:meth:`Server.momentum_state` (the server optimiser's state, a checkpoint's)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no server-optimiser state")

    def restore_server_momentum(self, state: Optional[Mapping[str, Any]]) -> None:
        raise NotImplementedError(f"{type(self).__name__} keeps no server-optimiser state")

    def handle_result(self, handle: Any) -> ClientResult:
        """The full result (update included) behind a handle: what a checkpoint keeps of a client in flight."""
        raise NotImplementedError(f"{type(self).__name__} does not run asynchronous clients")

    def restore_handle(self, result: ClientResult) -> Any:
        """A handle holding ``result`` (a resumed run's client in flight)."""
        raise NotImplementedError(f"{type(self).__name__} does not run asynchronous clients")

    def keep_version(self, version: int) -> None:
        """:meth:`Server.keep_version` (FedAsync's clients in flight)."""
        raise NotImplementedError(f"{type(self).__name__} does not run asynchronous clients")

    def release_version(self, version: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not run asynchronous clients")

    def kept_versions(self) -> Dict[int, Any]:
        raise NotImplementedError(f"{type(self).__name__} does not run asynchronous clients")

    def restore_versions(self, versions: Mapping[int, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not run asynchronous clients")

    def set_privacy(self, settings: Any) -> None:
        """:meth:`Server.set_privacy`: differential privacy of the server's later updates (docs/privacy.md)."""
        raise NotImplementedError

    def describe(self) -> Dict[str, object]:
        """What to record about the execution (actor counts, threads), for config.yaml/summary.json."""
        return {"backend": self.name}

    def summary(self) -> Dict[str, object]:
        """What summary.json records of the execution, beside the results (the round Ray took over at)."""
        return {}

    def shutdown(self) -> None:
        """Release everything the backend started."""


#: The most dispatches the local backend leaves untrained at once (:meth:`LocalBackend.dispatch`): their bookkeeping
#: runs back to back (warm caches), and a stop or a checkpoint waits for at most this many clients' training.
DEFER_MAX = 64


class Deferred:
    """A dispatched client whose training the local backend left for later: its task, then its result."""

    __slots__ = ("task", "result")

    def __init__(self, task: ClientTask):
        self.task, self.result = task, None


class LocalBackend(Backend):
    """Everything in this process: one :class:`Trainer` trains the clients in order, one :class:`Server`.

    The round's training units are planned once (:func:`~hasfl_ray.training.batched.group_tasks`) and the trainer
    trains each as it is (:meth:`Trainer.train_unit`): with ``client_batching`` on, the batchable clients of one
    width as one batched computation (mixed: of every width, padded to the widest), every other client alone;
    results stay in client order. With ``cuda_graphs`` on, the clients trained one at a time replay a captured
    local step where their objective allows it (:mod:`hasfl_ray.training.graphed`).
    """

    name = "local"
    #: Whether :meth:`dispatch` leaves training for later, and the :class:`Deferred` handles waiting, oldest first
    #: (class defaults: a backend not started, or whose start a subclass replaced, has nothing waiting)
    deferring: bool = False
    deferred: Any = ()

    def start(self, config, dataset, model_name, initial_params) -> None:
        self.threads = config.trainer_threads
        self.batching = config.client_batching if config.client_batching in ("on", "mixed") else "off"
        self.trainer = Trainer(dataset, model_name, optimizer_settings(config), config.device, config.trainer_threads,
                               cuda_graphs=config.cuda_graphs == "on")
        self.server = Server(model_name, initial_params, dataset, config.eval_batch_size,
                             config.aggregation_backend, config.device,
                             evaluation_subset(config.seed, dataset.test_size, config.eval_samples),
                             config.estimator, statistics_plan(config), label_masks_for(config, dataset, model_name))

    def run_round(self, tasks, weights, server_lr, optimizer=None, keep_updates=False):
        self._train_deferred()  # (before the model changes)
        params = self.server.params
        results: List[ClientResult] = []
        # single clients, or one width's batchable ones (on), or every width's (mixed, for a model that pads exactly)
        for unit in group_tasks(tasks, batching=self.batching, pads_exactly=self.trainer.workspace.pads_exactly):
            group = [tasks[k] for k in unit]
            try:
                results += self.trainer.train_unit(group, params)
            except (ConfigError, KeyboardInterrupt):
                raise  # bad input found while training (a data file): its own sentence; a second Ctrl-C
            except BaseException as error:  # a plug-in's SystemExit too: never a silent end of the run
                raise trainer_error(group, error, traceback.format_exc()) from None
            if self.should_stop():
                raise RoundInterrupted
        order = {task.client: position for position, task in enumerate(tasks)}
        results.sort(key=lambda result: order[result.client])
        return self.server.apply(results, weights, server_lr, None, optimizer, keep_updates=keep_updates)

    def evaluate(self):
        return self._evaluating(self.server.evaluate)

    def evaluate_widths(self, widths, submodels=None):
        return self._evaluating(self.server.evaluate_widths, widths, submodels)

    def test_beats(self, widths, submodels=None):
        return self._evaluating(self.server.test_beats, widths, submodels)

    def evaluate_depths(self, depths):
        return self._evaluating(self.server.evaluate_depths, depths)

    def test_logits(self, indices, width=1.0, groups=None):
        return self._evaluating(self.server.test_logits, indices, width, groups)

    def _evaluating(self, method, *args):
        """``method(*args)``, an evaluation on the server, with the trainers' thread count; a failure in one
        sentence."""
        torch.set_num_threads(self.threads)
        try:
            return method(*args)
        except (ConfigError, KeyboardInterrupt):
            raise
        except BaseException as error:  # a dataset plug-in's test_batches(), SystemExit included: one sentence
            raise TrainerError(f"evaluating the global model failed ({type(error).__name__}: "
                               f"{' '.join(str(error).split())[:120] or 'no message'}); the traceback is in "
                               "RUN/log.txt", traceback.format_exc()) from None

    def frozen_fraction(self):
        return self.server.frozen_fraction()

    def frozen_by_layer(self):
        return self.server.frozen_by_layer()

    def get_params(self):
        return self.server.get_params()

    def set_params(self, params):
        self._train_deferred()  # (from the model they were dispatched from)
        self.server.set_params(params)

    def params_sha256(self):
        return self.server.params_sha256()

    def dispatch(self, task):
        """Train ``task`` now, or (deferring) leave it for later: a :class:`Deferred` handle, trained before the
        model changes or anything reads it (the same model, so the same bits). A task that injects a fault
        (``--fault-inject``) trains at once, after those left before it, so a failure stops the run where it did."""
        if self.deferring and task.fault is None:
            handle = Deferred(task)
            self.deferred.append(handle)
            if len(self.deferred) >= DEFER_MAX:
                self._train_deferred()
            return handle
        self._train_deferred()
        return self._train(task)

    def _train(self, task):
        try:
            return self.trainer.train(task, self.server.params)
        except (ConfigError, KeyboardInterrupt):
            raise
        except BaseException as error:
            raise trainer_error([task], error, traceback.format_exc(), "dispatch") from None

    def defer_dispatches(self, on, train_left=True):
        if train_left:
            self._train_deferred()
        self.deferring, self.deferred = bool(on), deque()

    def train_deferred(self):
        self._train_deferred()

    def _train_deferred(self):
        """(One at a time, each taken off the queue once trained: a failure or a second Ctrl-C leaves the rest, and
        itself, for the next call.)"""
        deferred = self.deferred
        while deferred:
            handle = deferred[0]
            handle.result = self._train(handle.task)
            handle.task = None
            deferred.popleft()

    def _result(self, handle):
        if type(handle) is Deferred:
            if handle.result is None:
                self._train_deferred()
            return handle.result
        return handle

    def apply_arrivals(self, handles, weights, server_lr, bases=None, optimizer=None):
        self._train_deferred()
        return self.server.apply([self._result(handle) for handle in handles], weights, server_lr, bases, optimizer)

    def server_momentum(self):
        return self.server.momentum_state()

    def restore_server_momentum(self, state):
        self.server.restore_momentum(state)

    def set_privacy(self, settings):
        self.server.set_privacy(settings)

    def handle_result(self, handle):
        return self._result(handle)

    def restore_handle(self, result):
        return result

    def keep_version(self, version):
        self.server.keep_version(version)

    def release_version(self, version):
        self.server.release_version(version)

    def kept_versions(self):
        return self.server.kept_versions()

    def restore_versions(self, versions):
        self.server.restore_versions(versions)

    def describe(self):
        return {"backend": self.name, "actors": 1, "trainer_threads": self.threads}
