"""The Engine: the round loop of docs/design.md, identical for every backend."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.clock import Invitation
from hasfl_ray.clock.records import round_record
from hasfl_ray.callbacks import call_start, check_callbacks
from hasfl_ray.engine import asynchronous, evaluating, finished_here, preparing, privacy, records
from hasfl_ray.engine.backend import Backend, RoundInterrupted
from hasfl_ray.aggregation.server_optim import server_call, server_state
from hasfl_ray.engine.checkpoint import SNAPSHOT_BYTES, Checkpoint, Snapshot, save_checkpoint, state_bytes
from hasfl_ray.engine.config import RunConfig, parse_fault
from hasfl_ray.engine.events import RunEvents
from hasfl_ray.engine.factory import make_backend
from hasfl_ray.engine.guard import PluginError
from hasfl_ray.engine.history import History
from hasfl_ray.schedule import round_lr
from hasfl_ray.engine.progress import mark_run_start, open_bar
from hasfl_ray.engine.participants import (round_capacities, round_participants, sample_participants,  # noqa: F401
                                           client_task, client_price, sub_models)
from hasfl_ray.engine.post_aggregate import aggregate_round
from hasfl_ray.engine.records import MAX_PENDING_LINES, complete, kept, open_log, writing
from hasfl_ray.engine.refused_start import begin_start, end_start, undo_refused_start
from hasfl_ray.engine.rundir import RunDirectory, RunLock, remove_made
from hasfl_ray.engine.signals import StopSignals
from hasfl_ray.errors import ActorLostError, EvaluationInterrupted, RunInterrupted, TrainerError
from hasfl_ray.front_end import resume_command
from hasfl_ray.models import build_model
from hasfl_ray.training.determinism import apply_determinism

# Importable from here as before the engine's rooms were split out (tests, benchmarks and plug-ins import them).
from hasfl_ray.engine.evaluating import TEXT_LOCAL_ACCURACY  # noqa: F401
from hasfl_ray.engine.participants import capacity_tiers, initial_parameters  # noqa: F401
from hasfl_ray.engine.preparing import check_device, check_threads  # noqa: F401
from hasfl_ray.engine.records import CLIENT_ROWS_CHUNK  # noqa: F401
from hasfl_ray.training.seeding import STREAM_TIERS  # noqa: F401

logger = logging.getLogger(__name__)


class Engine:
    """Runs one federated experiment from a config: the round loop. Preparing the run (:mod:`.preparing`), planning
    each round's evaluation (:mod:`.evaluating`) and the records a round leaves (:mod:`.records`) are rooms of their
    own that it calls with itself.

    Args:
        config: the run config (resolved here).
        out_dir: run directory to write, or None to write nothing.
        backend: execution backend (default: the one ``config.backend`` names).
        progress: show a live progress bar.
        resume: continue ``out_dir`` from its checkpoint (from round 0 when it has none), bit-identically.
        force: with ``resume``, continue even when the stored config's result-affecting fields differ.
    """

    def __init__(self, config: RunConfig, out_dir: Optional[str] = None, backend: Optional[Backend] = None,
                 progress: bool = False, resume: bool = False, force: bool = False, callbacks: Any = None):
        apply_determinism(config.deterministic)  # before anything in this process starts CUDA
        self.config = config.resolved()
        self.rundir = RunDirectory(out_dir) if out_dir else None
        self.backend = backend or make_backend(self.config)
        self.progress = progress
        self.resume, self.force = resume, force
        self.history = History()  # every line so far, kept compactly (hasfl_ray/engine/history.py)
        self.frozen_streak: Tuple[int, Optional[int]] = (0, None)  # (lines counted, coverage.frozen_streak_start)
        self.checkpoint: Optional[Checkpoint] = None
        self.elapsed_before = 0.0
        self.local: Any = None  # the last local-accuracy evaluation (Engine.local_accuracy)
        self.local_owed: Optional[int] = None  # the round whose local-accuracy pass a stop cut short
        #: Rounds' lines waiting for their evaluation, oldest first, each with the function completing it, its
        #: wall_s and, for a round that checkpoints, the run's state as the round ended (see run_round).
        self._pending: List[Tuple[Dict[str, Any], Any, float, Optional[Snapshot]]] = []
        self._in_loop = False  # run_round called by the loop (which records deferred lines), not by a caller
        self._clock_before_round: Optional[Dict[str, Any]] = None  # the clock's state as the running round began
        self._loop_start, self._bar = 0.0, None
        self.prepared = False
        self.clock: Any = None  # the device clock (hasfl_ray.clock, docs/clock.md) when devices are configured
        self.events: Optional[RunEvents] = None  # RUN/events/ while run() runs, when tensorboard imports
        self.stop_signals = StopSignals()  # replaced by the active one while run() runs
        self.claimed: Any = None  # control_variates_dir as prepare made and marked it (hasfl_ray.files.FolderClaim)
        self.inputs_unverified: Any = None  # the sentence of inputs known by their path only (config/inputs.py)
        self.asynchronous: Any = None  # the event loop of an asynchronous run (mode async, docs/async.md)
        self.callbacks = check_callbacks(callbacks)  # yours, then the TensorBoard writer (hasfl_ray/callbacks.py)
        self.stopping = bool(self.callbacks)  # a callback may stop the run: its rounds' lines are not deferred
        self.stopped_early: Optional[Dict[str, Any]] = None  # {round, reason} once a callback returned Stop

    def prepare(self) -> None:
        """Load data, draw tiers, build the algorithm and w^(0); raises ConfigError before anything is written (or
        made: the run directory, the device): a run directory that cannot be written, a device this machine lacks,
        more clients than memory holds, a run file that is a link, a checkpoint that does not match the run."""
        try:
            preparing.prepare(self)
        except BaseException:
            self.backend.shutdown()  # Ray, when warm_up started it while the data loaded
            self._undo_claim()
            raise

    def _undo_claim(self) -> None:
        """A start refused: the control-variates folder prepare made (or marked) goes again, with what was written
        into it since."""
        if self.claimed is not None:
            self.claimed.undo()
            self.claimed = None

    def run(self) -> Dict[str, Any]:
        """Run every round, write the run directory, return the summary."""
        apply_determinism(self.config.deterministic)  # again: another engine in this process may have changed it
        mark_run_start(self)  # the start-up (data, model, Ray) is timed apart from the rounds
        if not self.prepared:
            self.prepare()
        c = self.config
        try:
            lock = RunLock(self.rundir.path).acquire() if self.rundir else None  # before anything is written
        except BaseException:
            self._undo_claim()
            raise
        log = shared = found = None
        made_log = started = False  # log.txt made by this start; config.yaml written, the run directory the run's
        try:
            shared = preparing.lock_control_variates(self)
            found = begin_start(self, lock)  # --force sets the earlier run aside; what a new run's holds, else None
            made_log = bool(self.rundir) and not os.path.lexists(self.rundir.file("log.txt"))
            log = open_log(self.rundir)
            for note in filter(None, (self.inputs_unverified, *preparing.start_notes(c))):  # paths only; batching
                logger.warning("%s", note)  # asked for but not done: on the terminal and in RUN/log.txt
            with StopSignals() as self.stop_signals:
                self.backend.should_stop = self.stop_signals.requested
                if self.clock is not None:  # its scan for an available client stops on the first signal too
                    self.clock.stop_when(self.stop_signals.requested)
                self.backend.while_training = lambda: records.while_training(self)  # records, memory
                preparing.start_backend(self)  # a stop while a cluster places the actors: RunInterrupted
                try:
                    if self.checkpoint is not None:
                        self.backend.set_params(self.checkpoint.params)
                        if self.checkpoint.server_state is not None:  # the server optimiser's m (and v)
                            self.backend.restore_server_momentum(self.checkpoint.server_state)
                        try:  # a local-accuracy pass a stop cut short: its line as if never stopped
                            evaluating.settle_owed_local(self)
                        except EvaluationInterrupted:  # stopped again: the checkpoint stays as it was
                            raise RunInterrupted(self.stop_signals.signal_number, len(self.history),
                                                 self.rundir.path if self.rundir else None) from None
                    if self.rundir:
                        with writing(self.rundir, "config.yaml"):  # a finished run's stays as it ran
                            finished_here.record_config(self)
                        started = True
                        with writing(self.rundir, "metrics.jsonl"):
                            self.rundir.reset_metrics(self.history)  # on resume: the lines up to the checkpoint
                        self.events = RunEvents.open(self.rundir.path, first_round=len(self.history))
                        self.callbacks += [self.events] if self.events is not None else []
                    started = True
                    privacy.start(self)  # the server's DP settings (docs/privacy.md); nothing without DP
                    call_start(self)
                    return self._loop()
                except (TrainerError, PluginError) as error:
                    if log is not None:  # the sentence goes to the terminal (CLI); the traceback only here
                        log.stream.write(f"{error}\n{error.remote_traceback.rstrip()}\n")
                        log.flush()
                    if isinstance(error, ActorLostError) and self.rundir:  # the run's state is lost, its checkpoint not
                        lost = f"{error}; {kept(self.rundir)}: {resume_command(self.rundir.path)}"
                        raise ActorLostError(lost) from None
                    raise
                finally:
                    if self.events is not None:
                        self.events.close()
                    self.backend.shutdown()  # every actor and Ray process the run started, however it ends
        finally:  # bad input once a new run began (a first dispatch), no round recorded: undone as a start refused
            started = started and not undo_refused_start(self, found)
            if log is not None:
                logging.getLogger("hasfl_ray").removeHandler(log)
                log.close()
            if shared is not None:
                shared.release()
            if lock is not None:  # a start refused (Ray, the placement, a first dispatch) leaves nothing it made,
                end_start(self, started, made_log)  # its log.txt included; --force's earlier run back, or gone
                lock.release()
                remove_made(lock.made if not started else [])  # the folders it made, once empty
            if not started:
                self._undo_claim()

    def _interrupted(self, start: float) -> None:
        """Checkpoint the completed rounds and raise :class:`RunInterrupted` (the backend is shut down after)."""
        if self.rundir and self.history:
            with writing(self.rundir, "checkpoints/latest.pt"):
                self.save_checkpoint(self.elapsed_before + time.perf_counter() - start)
        stop = RunInterrupted(self.stop_signals.signal_number, len(self.history),
                              self.rundir.path if self.rundir else None, self.config.mode)
        logger.warning("stopped by signal %d after %s", stop.signal_number, stop.done)
        raise stop

    def _loop(self) -> Dict[str, Any]:
        c = self.config
        if c.mode == "async":  # the event loop on the device clock, over the same rooms
            return asynchronous.run(self)
        start = time.perf_counter()
        bar = open_bar(self, "round")  # a tqdm bar on a terminal, a line a round elsewhere
        self._in_loop, self._loop_start, self._bar = True, start, bar
        for t in range(len(self.history), c.rounds):
            try:
                line = self.run_round(t)
            except RoundInterrupted:  # stopped while the round's clients trained: the round is not run, on the
                if self._clock_before_round is not None:  # clock either (it moved past the round as it began)
                    self.clock.load_state_dict(self._clock_before_round)
                self.record_pending()
                if bar:
                    bar.close()
                self._interrupted(start)
            except BaseException:
                with contextlib.suppress(Exception):  # keep the completed rounds; the run's own error goes on
                    self.record_pending()
                raise
            if not self._pending or self._pending[-1][0] is not line:  # evaluated: every line before it, then it
                self.record_pending()
                records.record(self, (line, None, None, None))
            while len(self._pending) > MAX_PENDING_LINES:  # never more than a few rounds behind
                records.record(self, self._pending.pop(0))
            records.release_memory(self)  # the round's freed memory back to the system: RSS stays flat
            if self.stopped_early is not None:  # a callback's Stop (the line asking it is recorded)
                break
            if self.stop_signals.requested() and (t + 1 < c.rounds or self.local_owed is not None):
                self.record_pending()
                if bar:
                    bar.close()
                self._interrupted(start)
        self._in_loop = False
        if bar:
            bar.close()
        return self.finish(self.elapsed_before + time.perf_counter() - start)

    def record_pending(self, wait: bool = True) -> None:
        """Record the lines waiting for their evaluation, oldest first: all of them, or (``wait`` False) those whose
        evaluation is in (:func:`records.record_pending`; a backend training elsewhere calls it while it trains)."""
        records.record_pending(self, wait)

    def save_checkpoint(self, elapsed_s: float, snapshot: Optional[Snapshot] = None) -> None:
        """Checkpoint the rounds recorded so far into the run directory (atomically): the run's state now, or the
        ``snapshot`` taken as the last recorded round ended (:meth:`snapshot`)."""
        if snapshot is None:
            params, state, server = self.backend.get_params(), self.algorithm.state_dict(), server_state(self)
            clock = self.clock.state_dict() if self.clock is not None else None
            if self.asynchronous is not None:  # the clients in flight, the buffer and the event queue
                clock["async"] = self.asynchronous.state_dict()
        else:
            params, state, clock = snapshot.params(), snapshot.algorithm_state, snapshot.clock
            server = snapshot.server_state
        save_checkpoint(self.rundir.path, Checkpoint(
            round=len(self.history), params=params, algorithm_state=state,
            history=[dict(line) for line in self.history], config=self.config.to_dict(), elapsed_s=elapsed_s,
            clock=clock, server_state=server))

    def snapshot(self) -> Optional[Snapshot]:
        """What the checkpoint after the round just run holds of the run's state, kept so that it can be written
        once the round's line is complete, a round or two later, while later rounds train (on Ray its evaluation
        runs behind the next round's training): the parameters (an object-store reference on Ray), copies of the
        algorithm's and the clock's state. None when those states hold more than SNAPSHOT_BYTES (copying them
        would cost more than waiting): the round's line is then completed and its checkpoint written before the
        next round begins."""
        state = self.algorithm.state_dict()
        clock = self.clock.state_dict() if self.clock is not None else None
        if state_bytes(state) + state_bytes(clock) > SNAPSHOT_BYTES:
            return None
        return Snapshot(self.backend.params_later(), copy.deepcopy(state), copy.deepcopy(clock), server_state(self))

    def run_round(self, t: int) -> Dict[str, Any]:
        """One round: sample, allocate, train, aggregate, observe, evaluate; returns its metrics line."""
        c = self.config
        round_start = time.perf_counter()
        # the clock as the round begins (a copy): a stop while its clients train puts it back (_loop)
        self._clock_before_round = self.clock.state_dict() if self.clock is not None else None
        invitation = self.clock.invite(t, c.clients_per_round) if self.clock is not None else None
        participants = invitation.clients if invitation is not None else \
            round_participants(self.algorithm, c, t)
        if c.width_assignment == "dynamic":  # every client's p^max redrawn from the ladder's mix
            self.p_max = round_capacities(c.effective_data_seed, t, c.clients, self.ladder)
            self.algorithm.set_capacities(t, self.p_max)
        widths = self.algorithm.allocate(t, participants)
        shapes = sub_models(self.algorithm, t, widths)  # (width, depth) each trains: depth None but with sub_model
        clocked: Dict[str, Any] = {}  # the clock's keys of the line (none without a device population)
        steps: Dict[int, int] = {}  # local steps of the clients a partial deadline cuts short
        if self.clock is not None:  # who the deadline keeps, and how far a partial client gets (docs/clock.md)
            participants, steps, clocked = self._clocked_round(t, invitation or Invitation(participants), shapes)
        lr = round_lr(c.lr, c.lr_decay, t, c.lr_milestones, c.lr_gamma)
        tasks = [client_task(self.algorithm, c, t, i, widths[i], shapes[i], lr, max_steps=steps.get(i))
                 for i in participants]
        fault = parse_fault(c.fault_inject) if c.fault_inject else None
        if fault is not None and fault[0] != "kill-trainer" and fault[1] == t and tasks:
            tasks[0].fault = fault[0].split("-")[0]  # the round's first participant: nan, inf or error
        weights = self.algorithm.aggregation_weights(participants) if participants else []
        if not all(weights):  # a zero weight: that participant counts for nothing, so it is not trained either
            kept = [k for k, weight in enumerate(weights) if weight > 0]
            logger.warning("round %d: client(s) %s have aggregation weight 0 and are left out", t,
                        ", ".join(str(tasks[k].client) for k in range(len(tasks)) if k not in kept))
            tasks, weights = [tasks[k] for k in kept], [weights[k] for k in kept]
        if tasks or privacy.releases_empty_rounds(c):  # (DP under Poisson participation: the noise alone)
            results, aggregate = aggregate_round(self, t, tasks, weights, server_call(c, self.algorithm.server_lr))
        else:  # (a clocked round) every invited client dropped out or came late: the global model stays as it was
            results, aggregate = [], self._empty_aggregate()
        accepted = {r.client for r in results}
        rejected = [task.client for task in tasks if task.client not in accepted]
        if rejected:
            logger.warning("round %d: rejected the non-finite update or diverged loss of client(s) %s%s", t,
                           ", ".join(map(str, rejected)),
                           "; every update was rejected, so the global model is unchanged" if not results else "")
        self.algorithm.observe(t, results, aggregate)
        dp = privacy.line_keys(self, t, aggregate)  # first: it may end the run here, and a last round is evaluated
        evaluation = self.request_evaluation(t)
        used = [r.width if r.trained_width is None else r.trained_width for r in results] or \
            [widths[i] for i in participants] or list(widths.values()) or [0.0]  # (Poisson: nobody came)
        h = self.algorithm.h_tilde()
        line = {"round": t, "test_accuracy": None, "test_loss": None, "avg_p": float(np.mean(used)),
                "coverage": aggregate.covered_fraction, "frozen_fraction": self.backend.frozen_fraction(),
                "mean_h": float(h.mean()) if h is not None else None, "rejected_updates": len(rejected),
                "frozen_by_layer": self.backend.frozen_by_layer(), "coverage_by_layer": aggregate.covered_by_layer,
                **clocked, **records.loss_keys(results), **dp, "wall_s": None}
        if self.backend.overlaps_evaluation and self._may_defer(t):
            # recorded once its evaluation is in, while a later round trains; wall_s is the round's time up to here;
            # a round that checkpoints keeps the state its checkpoint holds (or is completed now when it cannot)
            checkpoints = self._checkpoints(t)
            snapshot = self.snapshot() if checkpoints else None
            if snapshot is not None or not checkpoints:
                self._pending.append((line, evaluation, time.perf_counter() - round_start, snapshot))
                return line
        return complete(line, evaluation, round_start)

    def _clocked_round(self, t: int, invitation: Invitation, shapes: Dict[int, Tuple[float, Optional[int]]]
                       ) -> Tuple[List[int], Dict[int, int], Dict[str, Any]]:
        """Round ``t`` on the device clock (docs/clock.md): each invited client's cost at its (width, depth) (the
        algorithm's extras included), the deadline policy's verdict, the clock moved past the round. Returns the
        clients kept (sorted), the local steps of those cut short, and the clock's keys of the metrics line."""
        clock, invited = self.clock, invitation.clients
        costs = {i: client_price(self.algorithm, clock, t, i, shapes[i]) for i in invited}
        outcome = clock.settle(t, invited, costs, self.config.clients_per_round, start=clock.now + invitation.idle_s)
        clock.advance(invitation, outcome, invited)
        if outcome.late or outcome.dropped:
            logger.info("round %d: %d late and %d dropped-out update(s) of %d invited", t, len(outcome.late),
                        len(outcome.dropped), len(invited))
        return outcome.kept, outcome.steps, round_record(invitation, outcome, clock.now,
                                                         [self.p_max[i] for i in outcome.kept])

    def _empty_aggregate(self) -> AggregateResult:
        """The aggregate of a round without a single update (what the server returns when it rejects them all)."""
        empty = torch.zeros(0, dtype=torch.float64)
        return AggregateResult({}, empty, empty, 0.0, dict.fromkeys(build_model(self.model_name).param_specs(), 0.0))

    def _may_defer(self, t: int) -> bool:
        """Whether round ``t``'s line may be completed after round t + 1 trained (its evaluation running beside that
        training): not the last round, nor when a stop was asked for (a round that checkpoints: only with its
        :meth:`snapshot`, see :meth:`run_round`)."""
        return self._in_loop and t + 1 < self.config.rounds and not self.stop_signals.requested() and \
            not self.stopping

    def _checkpoints(self, t: int) -> bool:
        """Whether round ``t`` ends with a checkpoint (every ``checkpoint_every`` rounds and after the last)."""
        every = self.config.checkpoint_every
        return bool(self.rundir) and bool(every) and ((t + 1) % every == 0 or t + 1 == self.config.rounds)

    # -- evaluation (hasfl_ray.engine.evaluating) and the records of a run (hasfl_ray.engine.records) -----------

    @property
    def eval_widths(self) -> List[float]:
        """The widths evaluated on evaluation rounds, ascending, 1.0 last (:func:`evaluating.eval_widths`)."""
        return evaluating.eval_widths(self)

    def request_evaluation(self, t: int):
        """Start round ``t``'s evaluation; returns the function completing its line (``evaluating``)."""
        return evaluating.request_evaluation(self, t)

    def local_accuracy(self) -> Any:
        """Every client's local accuracy now: {"masked", "unmasked", "samples", "widths" (N,) arrays, "summary",
        "summary_unmasked"}, or the sentence saying why the dataset does not define it."""
        return self.request_local_accuracy()()

    def request_local_accuracy(self):
        """:meth:`local_accuracy`, started now, given by the function returned (``evaluating``)."""
        return evaluating.request_local_accuracy(self)

    def evaluation_summary(self) -> Dict[str, Any]:
        """summary.json's accuracy at each width and local accuracy (:func:`evaluating.evaluation_summary`)."""
        return evaluating.evaluation_summary(self)

    def sampled_clients(self) -> np.ndarray:
        """Boolean mask (num_clients,) of the clients sampled in the rounds run so far (``records``)."""
        return records.sampled_clients(self)

    def client_rows(self) -> Iterator[Tuple[Any, ...]]:
        """clients.csv's rows in CLIENT_COLUMNS order, one at a time (:func:`records.client_rows`)."""
        return records.client_rows(self)

    def finish(self, wall_s: float) -> Dict[str, Any]:
        """The summary; clients.csv and summary.json written (:func:`records.finish`)."""
        return records.finish(self, wall_s)
