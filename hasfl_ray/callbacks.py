"""Callbacks: code of yours called as a run goes (docs/notebook.md).

A callback is any object with some of these methods (subclass :class:`Callback` to get the others as no-ops):

- ``on_run_start(run)``: once, before the first round (or the first round a resume runs);
- ``on_round_end(line, run)``: after each round of a synchronous run is recorded (``line`` is its metrics.jsonl line,
  a dict; ``run.history`` holds every line so far);
- ``on_update(line, run)``: the same after each server update of an asynchronous run (``--mode async``);
- ``on_run_end(summary, run)``: once, with the summary, after summary.json is written (not when the run is stopped
  by a signal or fails).

``on_round_end`` and ``on_update`` may return :class:`Stop` to end the run after that round: the round is
recorded, a checkpoint is written (when the run has a folder and checkpoints), and the summary says
``stopped_early`` with the round and the reason. Callbacks only read: they are called after the round's results are
final, so a run's params_sha256 does not depend on them (except where one stops it early).

A callback that raises stops the run with its error (a bug in your code is not hidden); the built-in trackers
(:mod:`hasfl_ray.trackers`) and the TensorBoard writer (:mod:`hasfl_ray.engine.events`) catch their own failures,
log one warning and stop writing, so a full disk or an unreachable server never costs a run.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Stop:
    """Returned by ``on_round_end`` / ``on_update``: end the run after this round, for ``reason``."""

    reason: str = "a callback asked to stop"


@dataclasses.dataclass
class RunInfo:
    """What a callback sees of the run: its resolved config, its folder (None without one), every metrics line
    recorded so far (read-only by convention) and the algorithm object (for its ``p_current``, ``h_tilde()``)."""

    config: Any
    out_dir: Optional[str]
    history: List[Dict[str, Any]]
    algorithm: Any = None

    @property
    def mode(self) -> str:
        return getattr(self.config, "mode", "sync")


class Callback:
    """The callback interface with every method a no-op; override those you need (module docstring)."""

    def on_run_start(self, run: RunInfo) -> None:
        """Before the first round this start runs."""

    def on_round_end(self, line: Dict[str, Any], run: RunInfo) -> Optional[Stop]:
        """After each synchronous round is recorded; return :class:`Stop` to end the run after it."""
        return None

    def on_update(self, line: Dict[str, Any], run: RunInfo) -> Optional[Stop]:
        """After each asynchronous server update is recorded; return :class:`Stop` to end the run after it."""
        return None

    def on_run_end(self, summary: Dict[str, Any], run: RunInfo) -> None:
        """After summary.json is written."""


class EarlyStopping(Callback):
    """Stop when ``metric`` (a metrics.jsonl key, default test_accuracy) has not improved by more than ``min_delta``
    over ``patience`` evaluated rounds (rounds whose value is None, between evaluations, do not count)."""

    def __init__(self, patience: int = 10, metric: str = "test_accuracy", min_delta: float = 0.0,
                 mode: str = "max"):
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
            raise ValueError(f"patience is {patience!r}; expected a positive number of evaluated rounds")
        if mode not in ("max", "min"):
            raise ValueError(f"mode is {mode!r}; expected max (accuracy) or min (loss)")
        self.patience, self.metric, self.min_delta, self.mode = patience, metric, float(min_delta), mode
        self.best: Optional[float] = None
        self.waited = 0

    def _seen(self, line: Dict[str, Any]) -> Optional[Stop]:
        value = line.get(self.metric)
        if value is None:
            return None
        value = float(value)
        better = self.best is None or (value > self.best + self.min_delta if self.mode == "max"
                                       else value < self.best - self.min_delta)
        if better:
            self.best, self.waited = value, 0
            return None
        self.waited += 1
        if self.waited >= self.patience:
            return Stop(f"{self.metric} has not improved on {self.best:.6g} for {self.patience} evaluated rounds")
        return None

    def on_round_end(self, line: Dict[str, Any], run: RunInfo) -> Optional[Stop]:
        return self._seen(line)

    def on_update(self, line: Dict[str, Any], run: RunInfo) -> Optional[Stop]:
        return self._seen(line)


def check_callbacks(callbacks: Any) -> List[Any]:
    """``callbacks`` as a list, each an object with at least one callback method (one sentence otherwise)."""
    from hasfl_ray.errors import ConfigError

    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)):
        callbacks = [callbacks]
    names = ("on_run_start", "on_round_end", "on_update", "on_run_end")
    for index, callback in enumerate(callbacks):
        if isinstance(callback, type) or not any(callable(getattr(callback, name, None)) for name in names):
            raise ConfigError(f"callbacks[{index}] is {callback!r}; expected an object with on_round_end, on_update, "
                              "on_run_start or on_run_end (an instance, e.g. a hasfl_ray.callbacks.Callback "
                              "subclass's)")
    return list(callbacks)


def run_info(engine: Any) -> RunInfo:
    return RunInfo(engine.config, engine.rundir.path if engine.rundir else None, engine.history, engine.algorithm)


def call_start(engine: Any) -> None:
    info = run_info(engine)
    for callback in engine.callbacks:
        method = getattr(callback, "on_run_start", None)
        if callable(method):
            method(info)


def call_line(engine: Any, line: Dict[str, Any]) -> Optional[Stop]:
    """Every callback's ``on_round_end`` (``on_update`` in async mode) on ``line``; the first :class:`Stop` asked
    for (every callback is still called)."""
    info = run_info(engine)
    name = "on_update" if engine.asynchronous is not None else "on_round_end"
    stop: Optional[Stop] = None
    for callback in engine.callbacks:
        method = getattr(callback, name, None)
        if callable(method):
            answer = method(line, info)
            if stop is None and isinstance(answer, Stop):
                stop = answer
    return stop


def call_end(callbacks: Sequence[Any], summary: Dict[str, Any], info: RunInfo) -> None:
    for callback in callbacks:
        method = getattr(callback, "on_run_end", None)
        if callable(method):
            method(summary, info)
