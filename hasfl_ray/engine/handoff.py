"""Local first, Ray takes over: a run that starts Ray on this machine trains in this process, starts Ray and its
actors in the background once its first round is done, and hands over at the first round boundary after they are
ready (docs/ray.md, 'Start-up').

Results never depend on the backend (the local backend and Ray with any actor count give the same bits) and the
server's whole state is its parameters, so the handover is one ``set_params``: the rounds are those of a run on
either backend alone. No Ray import here: the backend to hand over to comes from a function given
(:func:`hasfl_ray.engine.factory.make_backend`), called in the background thread, so even Ray's import is off the
first round's path."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional

from hasfl_ray.engine.backend import Backend, LocalBackend, RoundInterrupted

logger = logging.getLogger(__name__)

#: Seconds :meth:`HandoffBackend.shutdown` waits for a start under way (Ray's processes, the actors' set-up) to
#: return before stopping what it started.
START_WAIT_S = 120.0
#: Ray is started only when the rounds left are expected to take at least this long in this process (the mean
#: round so far times the rounds left): starting Ray and its actors costs several CPU-seconds, taken from the rounds
#: beside it, and a run that ends before Ray is ready would only be slowed by it.
MIN_REMAINING_S = 30.0


class HandoffBackend(Backend):
    """The local backend until the backend ``make_inner()`` returns (a Ray backend that starts Ray here) has
    started; then that backend, from the next round on.

    The start begins in a background thread once the first round has run here (so it takes no CPU from the first
    round; at once with ``takeover_round`` 0), and only when the rounds left are expected to take at least
    :data:`MIN_REMAINING_S` here (a short run ends in this process, where Ray would only have slowed it). ``execution`` is what config.yaml records of the run's execution
    before Ray is ready (the actors' plan); ``takeover_round``, a hook for tests, holds the handover until that round
    and waits there for Ray. Ray failing to start does not stop the run: one warning, and it goes on here.
    """

    name = "ray"

    def __init__(self, make_inner: Callable[[], Backend], execution: Mapping[str, Any],
                 takeover_round: Optional[int] = None):
        self.make_inner = make_inner
        self.inner: Optional[Backend] = None
        self.local = LocalBackend()
        self.active: Backend = self.local
        self.execution = dict(execution)
        self.takeover_round = takeover_round
        #: The round Ray took over at; None while (or when, to the end) every round ran in this process.
        self.ray_from_round: Optional[int] = None
        self._run: Optional[tuple] = None  # start()'s arguments, for the start in the background
        self._rounds_here = 0  # rounds run (in this process or by Ray) so far by this backend
        self._first_round_at: Optional[float] = None  # perf_counter when the first round began
        self._thread: Optional[threading.Thread] = None
        self._waiting = False  # the start began and no round has decided yet whether Ray takes over
        self._started, self._cancel = threading.Event(), threading.Event()
        self._start_error: Optional[BaseException] = None
        self._stop: Callable[[], bool] = lambda: False

    @property
    def should_stop(self) -> Callable[[], bool]:  # type: ignore[override]
        return self._stop

    @should_stop.setter
    def should_stop(self, value: Callable[[], bool]) -> None:  # the engine's stop request reaches both backends
        self._stop = self.local.should_stop = value
        if self.inner is not None:
            self.inner.should_stop = value

    # -- lifecycle ---------------------------------------------------------------------------------------

    def wait_started(self) -> None:
        """Nothing to wait for: the rounds start in this process (a refused placement never gets here: the factory
        keeps the waiting backend for it)."""

    def start(self, config, dataset, model_name, initial_params) -> None:
        self.local.start(config, dataset, model_name, initial_params)
        params = {name: tensor.clone() for name, tensor in initial_params.items()}  # never the tensors training uses
        self._run = (config, dataset, model_name, params)
        if self.takeover_round == 0:
            self._begin()

    def _begin(self) -> None:
        """Start the inner backend in the background: Ray, its actors' processes, then the actors given the run."""
        self._waiting = True
        self._thread = threading.Thread(target=self._start_inner, name="hasfl-ray-handoff", daemon=True)
        self._thread.start()

    def _start_inner(self) -> None:
        config, dataset, model_name, params = self._run
        try:
            inner = self.make_inner()  # imports Ray
            inner.should_stop = self._stop
            self.inner = inner
            inner.warm_up(config)  # Ray and the actors' processes start in its own thread
            inner.wait_started()
            if not self._cancel.is_set():
                inner.start(config, dataset, model_name, params)  # the actors given the run
        except BaseException as error:  # reported by the round that would have handed over
            self._start_error = error
        finally:
            self._started.set()

    def shutdown(self) -> None:
        """Stop the start under way (waiting up to START_WAIT_S for it to return), then everything Ray started."""
        self._cancel.set()
        try:
            if self._thread is not None:
                self._thread.join(START_WAIT_S)
        finally:
            if self.inner is not None:
                self.inner.shutdown()

    # -- the handover ------------------------------------------------------------------------------------

    def _ready(self, round: int) -> bool:
        """Whether Ray takes over at ``round``: once its start has ended (at once), or, with ``takeover_round``, at
        that round exactly (waiting for the start there; a stop request still stops the run)."""
        if not self._waiting:
            return False
        if self.takeover_round is None:
            return self._started.is_set()
        if round < self.takeover_round:
            return False
        while not self._started.wait(0.1):
            if self.should_stop():
                raise RoundInterrupted
        return True

    def _take_over(self, round: int) -> None:
        self._waiting = False  # decided: Ray, or this process to the end
        try:
            if self._start_error is not None:
                raise self._start_error
            self.inner.set_params(self.local.get_params())
            self.inner.restore_server_momentum(self.local.server_momentum())  # the server optimiser's m (and v)
            privacy = getattr(getattr(self.local, "server", None), "privacy", None)
            if privacy is not None:  # DP's update count and clip so far (docs/privacy.md) go with the parameters
                self.inner.set_privacy(privacy)
        except Exception as error:  # noqa: BLE001 (Ray's start, or the first call to its server)
            self._start_error = None
            logger.warning("%s; the run continues in this process, results are identical", _failure(error))
            if self.inner is not None:
                self.inner.shutdown()
            return
        self.active, self.ray_from_round = self.inner, round
        self.local = LocalBackend()  # the in-process model and trainer are no longer needed
        logger.info("Ray took over at round %d", round)

    # -- rounds, on whichever backend is active ------------------------------------------------------------

    def _worth_starting(self, round: int) -> bool:
        """Whether to start Ray before ``round``: once a round ran here, when the rounds left would take at least
        :data:`MIN_REMAINING_S` at the mean pace so far (with ``takeover_round``, always: the test decides)."""
        if self._thread is not None or self._run is None or not self._rounds_here:
            return False
        if self.takeover_round is not None:
            return True
        per_round = (time.perf_counter() - self._first_round_at) / self._rounds_here
        return (self._run[0].rounds - round) * per_round >= MIN_REMAINING_S

    def run_round(self, tasks, weights, server_lr, optimizer=None, keep_updates=False):
        if self._first_round_at is None:
            self._first_round_at = time.perf_counter()
        if tasks and self._worth_starting(tasks[0].round):
            self._begin()  # Ray starts now, beside the next rounds
        if tasks and self._ready(tasks[0].round):
            self._take_over(tasks[0].round)
        self.active.while_training = self.while_training  # the engine's, for whichever backend trains the round
        result = self.active.run_round(tasks, weights, server_lr, optimizer,
                                       **({"keep_updates": True} if keep_updates else {}))
        self._rounds_here += 1
        return result

    @property
    def overlaps_evaluation(self) -> bool:
        return self.active.overlaps_evaluation

    def request(self, method, *args):
        return self.active.request(method, *args)

    def evaluate(self):
        return self.active.evaluate()

    def evaluate_widths(self, widths, submodels=None):
        return self.active.evaluate_widths(widths, submodels)

    def evaluate_depths(self, depths):
        return self.active.evaluate_depths(depths)

    def test_beats(self, widths, submodels=None):
        return self.active.test_beats(widths, submodels)

    def test_logits(self, indices, width=1.0, groups=None):
        return self.active.test_logits(indices, width, groups)

    def frozen_fraction(self):
        return self.active.frozen_fraction()

    def frozen_by_layer(self):
        return self.active.frozen_by_layer()

    def get_params(self):
        return self.active.get_params()

    def params_later(self):
        return self.active.params_later()

    def set_params(self, params) -> None:
        self.active.set_params(params)  # a resume's checkpoint, before the first round: the handover copies it

    def server_momentum(self):
        return self.active.server_momentum()

    def restore_server_momentum(self, state) -> None:
        self.active.restore_server_momentum(state)

    def params_sha256(self):
        return self.active.params_sha256()

    def set_privacy(self, settings) -> None:
        self.active.set_privacy(settings)

    def describe(self) -> Dict[str, object]:
        """The actors' plan (the inner backend's own description once it took over)."""
        return self.inner.describe() if self.active is self.inner else dict(self.execution)

    def summary(self) -> Dict[str, object]:
        """The round Ray took over at (None: every round ran in this process)."""
        return {"ray_from_round": self.ray_from_round}


def _failure(error: BaseException) -> str:
    """'Ray could not start (...)' from a start's error (its sentence without the advice after '; expected')."""
    text = " ".join(str(error).split("; expected")[0].split())[:200] or type(error).__name__
    return text if text.startswith("Ray could not start") else f"Ray could not start ({text})"
