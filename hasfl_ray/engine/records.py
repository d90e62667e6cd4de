"""The records a run leaves: each round's line (and those pending), clients.csv's rows, summary.json, log.txt."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from hasfl_ray import allocator
from hasfl_ray.callbacks import call_end, call_line, run_info
from hasfl_ray.engine import privacy
from hasfl_ray.clock.records import clock_summary, profile_columns
from hasfl_ray.engine.checkpoint import Snapshot, load_checkpoint_round
from hasfl_ray.engine.coverage import CAUSE as COVERAGE_CAUSE
from hasfl_ray.engine.coverage import coverage_warning, frozen_layers_phrase, streak_after, warns
from hasfl_ray.engine.guard import PluginError
from hasfl_ray.engine.losses import final_train_loss, last_losses, loss_keys  # noqa: F401 (loss_keys: the engine's)
from hasfl_ray.engine.participants import round_participants
from hasfl_ray.engine.progress import show_line, startup_seconds
from hasfl_ray.engine.rundir import RunDirectory
from hasfl_ray.errors import ConfigError, OutputError
from hasfl_ray.front_end import option
from hasfl_ray.registry import call_plugin, spec_label
from hasfl_ray.schedule import post_warmup_avg_p

logger = logging.getLogger(__name__)

#: summary.json's keys that time the run (the rounds, the start-up): the only ones two runs of one config differ in.
TIMINGS = ("wall_s", "startup_s")

#: clients.csv is written this many clients at a time (a million rows never exist at once).
CLIENT_ROWS_CHUNK = 65536

#: Rounds whose line may wait for its evaluation at once (a backend whose evaluation overlaps training, Ray): the
#: loop waits for the oldest beyond these, so metrics.jsonl is never more than this many rounds behind.
MAX_PENDING_LINES = 3


def complete(line: Dict[str, Any], evaluation, round_start: Optional[float] = None,
             wall_s: Optional[float] = None) -> Dict[str, Any]:
    """``line`` with its evaluation's fields filled in (in the order a line has always had), and wall_s: the
    given one (a deferred line's, measured when its round ended) or the seconds since ``round_start``."""
    accuracy, loss, evaluated = evaluation()
    line["test_accuracy"], line["test_loss"] = accuracy, loss
    del line["wall_s"]
    line.update(evaluated)
    line["wall_s"] = wall_s if wall_s is not None else time.perf_counter() - round_start
    return line


def record_pending(engine: Any, wait: bool = True) -> None:
    """Record the lines waiting for their evaluation (see :meth:`Engine.run_round`), oldest first: all of them, or
    (``wait`` False) those whose evaluation is in, up to the first that is not. A backend that trains elsewhere
    (Ray) calls it without waiting once a round's training is under way (:attr:`Backend.while_training`), so
    the lines are written while the trainers train."""
    while engine._pending and (wait or getattr(engine._pending[0][1], "ready", lambda: True)()):
        record(engine, engine._pending.pop(0))


def release_memory(engine: Any) -> None:
    """The round's freed memory back to the system, once a round (hasfl_ray/allocator.py: RSS stays flat): now, or,
    where the next round trains elsewhere (Ray), once it is under way (:func:`while_training`), not on the hand-off
    between the rounds, where the trainers wait for this process."""
    if engine.backend.overlaps_evaluation:
        engine.trim_owed = True
    else:
        allocator.release()


def while_training(engine: Any) -> None:
    """What the engine does while a backend that trains elsewhere trains (:attr:`Backend.while_training`): the
    lines whose evaluation is in (:func:`record_pending`), and the memory release the last round owes."""
    record_pending(engine, wait=False)
    if getattr(engine, "trim_owed", False):
        engine.trim_owed = False
        allocator.release()


def record(engine: Any, pending: Optional[Tuple[Dict[str, Any], Any, Any, Optional[Snapshot]]]) -> None:
    """Record a round's line ``pending[0]`` (completed first when it waits for its evaluation, see
    :meth:`Engine.run_round`): the history, the coverage warning, metrics.jsonl, TensorBoard, the checkpoint (of the
    state ``pending[3]`` kept as the round ended, when a later round may have run since), the bar. Nothing for
    None."""
    if pending is None:
        return
    line, evaluation, wall_s, snapshot = pending
    if evaluation is not None:
        line = complete(line, evaluation, wall_s=wall_s)
    start, bar = engine._loop_start, engine._bar
    c, t = engine.config, line["round"]
    engine.history.append(line)
    engine.frozen_streak = streak_after(engine.history, *engine.frozen_streak)
    if warns(engine.frozen_streak[1], t, c.warmup):
        logger.warning("round %d: %.1f %% of the global model has stayed at w^(0) since round %d%s; %s", t,
                       100 * line["frozen_fraction"], engine.frozen_streak[1],
                       frozen_layers_phrase(line), COVERAGE_CAUSE)
    if engine.rundir:
        with writing(engine.rundir, "metrics.jsonl"):
            engine.rundir.append_metrics(line)
    stop = call_line(engine, line)  # yours and TensorBoard's (hasfl_ray/callbacks.py): they read the line
    if stop is not None and engine.stopped_early is None:
        engine.stopped_early = {"round": t, "reason": stop.reason}
        logger.warning("stopping after round %d: %s", t, stop.reason)
        if line["test_accuracy"] is None or "accuracy_at_width" not in line:  # now the run's last round, which is
            evaluate_last(engine, line)  # always evaluated, at each width too
    if engine.rundir:
        if engine._checkpoints(t) or (stop is not None and engine.config.checkpoint_every):
            with writing(engine.rundir, "checkpoints/latest.pt"):
                engine.save_checkpoint(engine.elapsed_before + time.perf_counter() - start, snapshot)
    if bar:
        show_line(bar, line)  # (an asynchronous line between evaluations has no accuracy: the bar keeps the last)


def evaluate_last(engine: Any, line: Dict[str, Any]) -> None:
    """A round (or server update) that a callback's Stop made the run's last, recorded without an evaluation
    (``--test-every``, ``--eval-every-updates``) or without one at each width (``--eval-every``): evaluated now, as every last round is (the global model is still
    its own: a run with callbacks never trains a round ahead), its history line and metrics.jsonl completed. The
    callback saw the line before its evaluation."""
    complete(line, engine.request_evaluation(line["round"]), wall_s=line["wall_s"])
    if engine.rundir:
        with writing(engine.rundir, "metrics.jsonl"):
            engine.rundir.reset_metrics(engine.history)


def sampled_clients(engine: Any) -> np.ndarray:
    """Boolean mask (num_clients,) of the clients sampled in the rounds run so far (recomputed from the seed,
    so a resumed run gets the same)."""
    c = engine.config
    if engine.clock is not None:  # its own invitations: the clock keeps count
        return engine.clock.invited.copy()
    mask = np.zeros(c.clients, dtype=bool)
    for t in range(len(engine.history)):
        mask[round_participants(engine.algorithm, c, t)] = True
    return mask


def client_rows(engine: Any) -> Iterator[Tuple[Any, ...]]:
    """clients.csv's rows in CLIENT_COLUMNS order, one at a time (per-client state stays in numpy arrays; an
    empty tv_distance or h_tilde is one the run did not compute)."""
    h = engine.algorithm.h_tilde()
    tv = call_plugin(f"dataset {spec_label(engine.config.dataset)!r}", "run_tv_distances",
                     lambda: np.asarray(engine.dataset.run_tv_distances(engine.sampled_clients()),
                                        dtype=np.float64))
    if tv.shape != (engine.config.clients,):
        raise PluginError(f"dataset {spec_label(engine.config.dataset)!r} returned {tv.size} values of shape "
                          f"{tv.shape} from run_tv_distances(); expected one per client ({engine.config.clients})")
    p_final = np.asarray(engine.algorithm.p_current, dtype=np.float64)
    names = engine.dataset.client_names
    local = engine.local if isinstance(engine.local, dict) else None
    clocked = list(extra_columns(engine).values())
    losses = last_losses(engine.history, engine.config.clients)  # each client's at the last round it trained
    for start in range(0, engine.config.clients, CLIENT_ROWS_CHUNK):  # Python numbers for one chunk at a time
        part = slice(start, start + CLIENT_ROWS_CHUNK)
        tv_part = [("" if x != x else x) for x in tv[part].tolist()]  # NaN: not computed
        h_part = h[part].tolist() if h is not None else [""] * len(tv_part)
        local_part = local_columns(local, start, len(tv_part))
        yield from zip(range(start, start + len(tv_part)), engine.num_samples[part].tolist(),
                       engine.p_max[part].tolist(), tv_part, h_part, p_final[part].tolist(), names[part],
                       *local_part, [("" if x != x else x) for x in losses[part].tolist()],
                       *[[("" if x != x else x) for x in column[part].tolist()] for column in clocked])


def local_columns(local: Optional[Dict[str, Any]], start: int, count: int) -> List[List[Any]]:
    """clients.csv's four local columns for clients ``start`` .. ``start + count - 1``: the values of the clients the
    last local-accuracy pass scored (``local["clients"]``: their ids, None for every client), empty for the others
    and where a value is NaN (no test sample of its labels)."""
    keys = ("masked", "unmasked", "widths", "samples")
    if local is None:
        return [[""] * count for _ in keys]
    clients = local.get("clients")
    if clients is None:
        return [[("" if x != x else x) for x in local[k][start:start + count].tolist()] for k in keys]
    low, high = np.searchsorted(clients, [start, start + count])
    at = (clients[low:high] - start).tolist()
    columns = []
    for k in keys:
        column: List[Any] = [""] * count
        for position, x in zip(at, local[k][low:high].tolist()):
            column[position] = "" if x != x else x
        columns.append(column)
    return columns


def finish(engine: Any, wall_s: float) -> Dict[str, Any]:
    """summary.json of the rounds recorded, which ``wall_s`` took; the run directory's clients.csv and summary.json
    written (when the run has one)."""
    accuracies = [line["test_accuracy"] for line in engine.history if line["test_accuracy"] is not None]
    avg_p = [line["avg_p"] for line in engine.history]
    summary = {"best_accuracy": max(accuracies), "final_accuracy": accuracies[-1],
               "avg_p": float(np.mean(avg_p)),
               "avg_p_post_warmup": post_warmup_avg_p(avg_p, engine.config.warmup, engine.config.t_adapt),
               "rounds": len(engine.history),
               "final_test_loss": [line["test_loss"] for line in engine.history
                                   if line["test_accuracy"] is not None][-1],
               "final_train_loss": final_train_loss(engine.history),
               "params_sha256": engine.backend.params_sha256(), "wall_s": wall_s,
               "startup_s": startup_seconds(engine), **engine.backend.summary()}
    warning = coverage_warning(engine.history, engine.config.warmup)
    if warning is not None:
        summary["coverage_warning"] = warning
    if getattr(engine, "inputs_unverified", None):  # inputs known by their path only (config/inputs.py)
        summary["inputs_unverified"] = engine.inputs_unverified
    if engine.config.data_fingerprint is not None:  # the data trained on, by content (hasfl_ray/data/fingerprint.py)
        summary["data_fingerprint"] = dict(engine.config.data_fingerprint)
    if getattr(engine.algorithm, "source_status", None):  # a method whose rules stand in for its authors' (FedGMR)
        summary["source_status"] = str(engine.algorithm.source_status)
    if engine.config.eval_samples is not None:  # the test samples each round evaluated (a seeded subset)
        summary["eval_samples"] = min(engine.config.eval_samples, engine.dataset.test_size)
    summary.update(engine.evaluation_summary())
    if engine.clock is not None:  # simulated hours, GB and time-to-accuracy (docs/clock.md)
        summary.update(clock_summary(engine.history))
    if engine.asynchronous is not None:  # server updates, clients dispatched, staleness (docs/async.md)
        summary.update(async_summary(engine))
    summary.update(privacy.summary_keys(engine))  # epsilon at delta, the sampling assumed (docs/privacy.md)
    if engine.stopped_early is not None:  # a callback's Stop (hasfl_ray/callbacks.py)
        summary["stopped_early"] = dict(engine.stopped_early)
    if engine.rundir:
        with writing(engine.rundir, "clients.csv"):
            engine.rundir.write_clients(engine.client_rows(), tuple(extra_columns(engine)))
        with writing(engine.rundir, "summary.json"):
            engine.rundir.write_summary(summary)
    call_end(engine.callbacks, summary, run_info(engine))
    return summary


def extra_columns(engine: Any) -> Dict[str, np.ndarray]:
    """clients.csv's columns beyond the protocol's: the clock's (a device population), then an asynchronous run's
    updates_sent and mean_staleness (empty: none applied)."""
    columns = dict(profile_columns(engine.clock)) if engine.clock is not None else {}
    if engine.asynchronous is not None:
        state = engine.asynchronous.state
        columns["updates_sent"] = state.sent
        columns["mean_staleness"] = state.mean_staleness()
    return columns


def async_summary(engine: Any) -> Dict[str, Any]:
    """summary.json's asynchronous keys: server updates applied, clients dispatched, updates applied, and the
    staleness of the applied updates (mean over them, and the largest)."""
    history, state = engine.history, engine.asynchronous.state
    applied = int(state.sent.sum()) - len(state.buffer)
    return {"mode": "async", "async_rule": engine.config.async_rule, "server_updates": len(history),
            "clients_dispatched": state.dispatches, "updates_applied": applied,
            "staleness_mean": float(state.stale_sum.sum() / applied) if applied else None,
            "staleness_max": max((line["staleness_max"] for line in history), default=None)}


@contextlib.contextmanager
def writing(rundir: RunDirectory, what: str):
    """Turn a failed write of ``what`` (disk full, permissions) into one sentence saying what survives."""
    try:
        yield
    except OSError as error:
        raise OutputError(f"could not write {what} in {rundir.path!r} ({error.strerror or error}); "
                          f"{kept(rundir)} once the problem is fixed") from None


def kept(rundir: RunDirectory) -> str:
    """What survives a failed write, for its sentence (which ends "once the problem is fixed")."""
    saved = load_checkpoint_round(rundir.path)
    if saved:
        return f"the checkpoint after round {saved - 1} is intact, so {option('resume')} continues from it"
    return f"no checkpoint was written yet, so {option('resume')} starts the run again from round 0"


class _LogFile(logging.StreamHandler):
    """A log handler on a stream it owns: closing the handler closes the file (RUN/log.txt, opened O_NOFOLLOW)."""

    def close(self) -> None:
        try:
            self.acquire()
            try:
                if self.stream is not None and not self.stream.closed:
                    self.stream.close()
            finally:
                self.release()
        finally:
            super().close()


def open_log(rundir: Optional[RunDirectory]) -> Optional[logging.Handler]:
    """RUN/log.txt: what the package logs during the run, and the traceback of a trainer that raised. Opened
    with O_NOFOLLOW: a link on its name (planted after :meth:`Engine.prepare` looked) is refused, never written
    through."""
    if not rundir:
        return None
    path = rundir.file("log.txt")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        if os.path.islink(path):
            raise ConfigError(f"run directory {rundir.path!r} has log.txt as a link to "
                              f"{os.readlink(path)!r}; expected the run's own file, never followed (remove the "
                              f"link, or choose another {option('out')})") from None
        raise OutputError(f"could not open log.txt in {rundir.path!r} ({error.strerror or error}); "
                          f"{kept(rundir)} once the problem is fixed") from None
    handler = _LogFile(os.fdopen(fd, "a", encoding="utf-8"))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("hasfl_ray").addHandler(handler)
    return handler
