"""The Engine: the round loop of docs/design.md, identical for every backend."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import shlex
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.algorithms import algorithm_class
from hasfl_ray.data import assign_tiers, load_plugin_dataset
from hasfl_ray.data.base import TextFederatedDataset
from hasfl_ray.data.base import BYTES_PER_CLIENT, check_client_memory, physical_memory
from hasfl_ray.engine.backend import Backend, RoundInterrupted
from hasfl_ray.engine.checkpoint import (SNAPSHOT_BYTES, START_AGAIN, Checkpoint, Snapshot, check_checkpoint,
                                         check_resume_config, checkpoint_path, load_checkpoint, load_checkpoint_round,
                                         save_checkpoint, state_bytes, stored_config)
from hasfl_ray.engine.config import RunConfig, parse_fault
from hasfl_ray.aggregation import AggregateResult
from hasfl_ray.clock import Invitation, make_clock
from hasfl_ray.clock.records import clock_summary, profile_columns, round_record
from hasfl_ray.engine.guard import GuardedAlgorithm, PluginError, construct
from hasfl_ray.engine.coverage import CAUSE as COVERAGE_CAUSE
from hasfl_ray.engine.coverage import coverage_warning, frozen_layers_phrase, frozen_streak_start, should_warn
from hasfl_ray.engine.events import RunEvents
from hasfl_ray.engine.factory import make_backend
from hasfl_ray.engine.rundir import (RunDirectory, RunLock, check_no_links, check_run_directory, check_start,
                                     remove_made)
from hasfl_ray.engine.signals import StopSignals
from hasfl_ray.errors import ActorLostError, ConfigError, OutputError, RunInterrupted, TrainerError
from hasfl_ray.models import MODEL_CONFIGS, build_model, register_model
from hasfl_ray.models.choice import model_dataset
from hasfl_ray.registry import call_plugin, lookup, spec_label
from hasfl_ray.schedule import post_warmup_avg_p
from hasfl_ray.training.determinism import apply_determinism
from hasfl_ray.training.local import ClientTask
from hasfl_ray.evaluation import (accuracy_summary, default_eval_widths, is_eval_round, local_accuracies,
                                  submodel_groups, width_key)
from hasfl_ray.federation import WidthLadder, ladder_of
from hasfl_ray.training.seeding import STREAM_INIT, STREAM_SAMPLING, STREAM_TIERS, STREAM_WIDTHS, numpy_rng, stream_seed

logger = logging.getLogger(__name__)

#: summary.json's local_accuracy on a text dataset (docs/metrics.md).
TEXT_LOCAL_ACCURACY = ("not defined for this dataset: a text client's labels are the next characters of its text, "
                       "which cover nearly the whole vocabulary, so restricting the logits to them is not a label "
                       "skew to measure")

#: clients.csv is written this many clients at a time (a million rows never exist at once).
CLIENT_ROWS_CHUNK = 65536



def sample_participants(seed: int, round: int, num_clients: int, per_round: int) -> List[int]:
    """The round's participants, drawn uniformly without replacement from rng(seed, round), sorted."""
    rng = numpy_rng(seed, STREAM_SAMPLING, round)
    return sorted(int(i) for i in rng.choice(num_clients, size=per_round, replace=False))


def capacity_tiers(seed: int, num_clients: int, counts: Optional[Sequence[int]] = None,
                   ladder: Optional[WidthLadder] = None) -> np.ndarray:
    """p_i^max of every client: the run's tier draw from rng(seed, tiers) (``hasfl-ray data inspect`` shares it);
    ``counts`` clients per tier (config ``tier_counts``), default the text's mix (8/5/4/3 of 20), of the width
    ``ladder`` (default the paper's tiers; :func:`hasfl_ray.federation.ladder_of` a config's)."""
    ladder = ladder or WidthLadder()
    return assign_tiers(num_clients, numpy_rng(seed, STREAM_TIERS), ladder.widths, ladder.probabilities,
                        counts=counts)


def round_capacities(seed: int, round: int, num_clients: int, ladder: WidthLadder) -> np.ndarray:
    """``width_assignment: dynamic``: every client's p^max for round ``round``, drawn independently from the
    ladder's mix with rng(seed, widths, round) (HeteroFL's "dynamic"), the same on every backend and after a
    resume."""
    return ladder.draw(num_clients, numpy_rng(seed, STREAM_WIDTHS, round))


def check_device(config: RunConfig) -> None:
    """Refuse, in one sentence, a CUDA or MPS device this machine does not have (before anything starts it or a run
    directory is made). A Ray run joining a cluster (``address``) is not checked: its GPUs are on the nodes."""
    device = config.device
    if config.backend == "ray" and config.address is not None:
        return
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device is {device!r} but torch finds no GPU on this machine (torch.cuda.is_available() "
                              "is False); expected --device cpu or auto, or a machine with a CUDA GPU")
        index = int(device.partition(":")[2] or 0)
        if config.backend == "local" and index >= count:
            raise ConfigError(f"device is {device!r} but this machine has {count} GPU(s); expected cuda:0 to "
                              f"cuda:{count - 1}")
    elif device == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ConfigError("device is 'mps' but torch finds no MPS device on this machine; expected --device cpu "
                              "or auto")


def check_threads(config: RunConfig) -> None:
    """Refuse, in one sentence, more trainer threads than this machine has CPUs on the local backend (a Ray run's
    placement refuses them against its cluster's CPUs: :func:`hasfl_ray.simulation.placement.plan_actors`)."""
    cpus = os.cpu_count() or 1
    if config.backend == "local" and config.trainer_threads > cpus:
        raise ConfigError(f"trainer_threads is {config.trainer_threads}, which needs {config.trainer_threads} CPUs, "
                          f"but this machine has {cpus}; expected at most {cpus}")


def initial_parameters(model_name: str, seed: int) -> Dict[str, torch.Tensor]:
    """w^(0): the full-width model initialised from the run seed (the global torch RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(stream_seed(seed, STREAM_INIT))
        model = build_model(model_name)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


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


#: Rounds whose line may wait for its evaluation at once (a backend whose evaluation overlaps training, Ray): the
#: loop waits for the oldest beyond these, so metrics.jsonl is never more than this many rounds behind.
MAX_PENDING_LINES = 3


class Engine:
    """Runs one federated experiment from a config.

    Args:
        config: the run config (resolved here).
        out_dir: run directory to write, or None to write nothing.
        backend: execution backend (default: the one ``config.backend`` names).
        progress: show a live progress bar.
        resume: continue ``out_dir`` from its checkpoint (from round 0 when it has none), bit-identically.
        force: with ``resume``, continue even when the stored config's result-affecting fields differ.
    """

    def __init__(self, config: RunConfig, out_dir: Optional[str] = None, backend: Optional[Backend] = None,
                 progress: bool = False, resume: bool = False, force: bool = False):
        apply_determinism(config.deterministic)  # before anything in this process starts CUDA
        self.config = config.resolved()
        self.rundir = RunDirectory(out_dir) if out_dir else None
        self.backend = backend or make_backend(self.config)
        self.progress = progress
        self.resume, self.force = resume, force
        self.history: List[Dict[str, Any]] = []
        self.checkpoint: Optional[Checkpoint] = None
        self.elapsed_before = 0.0
        self.local: Any = None  # the last local-accuracy evaluation (Engine.local_accuracy)
        #: Rounds' lines waiting for their evaluation, oldest first, each with the function completing it, its
        #: wall_s and, for a round that checkpoints, the run's state as the round ended (see run_round).
        self._pending: List[Tuple[Dict[str, Any], Any, float, Optional[Snapshot]]] = []
        self._in_loop = False  # run_round called by the loop (which records deferred lines), not by a caller
        self._loop_start, self._bar = 0.0, None
        self.prepared = False
        self.clock: Any = None  # the device clock (hasfl_ray.clock, docs/clock.md) when devices are configured
        self.events: Optional[RunEvents] = None  # RUN/events/ while run() runs, when tensorboard imports
        self.stop_signals = StopSignals()  # replaced by the active one while run() runs

    def prepare(self) -> None:
        """Load data, draw tiers, build the algorithm and w^(0); raises ConfigError before anything is written (or
        made: the run directory, the device): a run directory that cannot be written, a device this machine lacks,
        more clients than memory holds, a run file that is a link, a checkpoint that does not match the run."""
        try:
            self._prepare()
        except BaseException:
            self.backend.shutdown()  # Ray, when warm_up started it while the data loaded
            raise

    def _prepare(self) -> None:
        c = self.config
        if self.rundir:
            check_run_directory(self.rundir.path)
            if os.path.isdir(self.rundir.path):
                check_no_links(self.rundir.path)  # log.txt and the checkpoint are opened by name: never through a link
            check_start(self.rundir.path, self.resume, self.force)  # a new run only where nothing would be lost
        check_device(c)
        check_threads(c)
        check_client_memory(c.clients)
        if self.rundir and self.force and not self.resume:
            self.rundir.check_clearable()  # --force clears only a run directory: refused before anything runs
        if self.resume and self.rundir:
            self.checkpoint = load_checkpoint(self.rundir.path)
            if not self.force:
                check_resume_config(self.rundir.path, stored_config(self.rundir.path, self.checkpoint), c)
            if self.checkpoint is not None and self.checkpoint.round > c.rounds:  # --force with fewer rounds
                raise ConfigError(f"checkpoint {checkpoint_path(self.rundir.path)!r} holds {self.checkpoint.round} "
                                  f"completed rounds but rounds is {c.rounds}; expected at least "
                                  f"{self.checkpoint.round} rounds to continue it, {START_AGAIN}")
        self.backend.warm_up(c)  # Ray and its actors start while the data loads (docs/ray.md, 'Start-up')
        try:
            self._build()
        except MemoryError:
            total = physical_memory()
            raise ConfigError(f"clients is {c.clients} and memory ran out building the per-client state (about "
                              f"{c.clients * BYTES_PER_CLIENT / 1e9:.3g} GB at {BYTES_PER_CLIENT} bytes a client"
                              + (f", of {total / 1e9:.3g} GB here" if total else "") + "); expected fewer clients, or "
                              "more free memory") from None
        if self.checkpoint is not None:
            path = checkpoint_path(self.rundir.path)
            check_checkpoint(path, self.checkpoint, self.initial_params, self.algorithm.state_dict())
            try:
                self.algorithm.algorithm.load_state_dict(self.checkpoint.algorithm_state)
            except KeyboardInterrupt:
                raise
            except BaseException as error:  # noqa: BLE001 (the plug-in's code, SystemExit included)
                raise ConfigError(f"checkpoint {path!r} does not match this run: algorithm {c.algorithm!r} cannot load "
                                  f"its algorithm_state ({type(error).__name__}: {str(error)[:60]}); expected this "
                                  f"run's algorithm state, {START_AGAIN}") from None
            self.history = [dict(line) for line in self.checkpoint.history]
            if self.clock is not None and self.checkpoint.clock is not None:
                self.clock.load_state_dict(self.checkpoint.clock)
            if c.width_assignment == "dynamic" and self.history:  # the capacities of the last round run
                self.p_max = round_capacities(c.seed, len(self.history) - 1, c.clients, self.ladder)
            self.elapsed_before = self.checkpoint.elapsed_s
            logger.info("resuming %s after round %d", self.rundir.path, self.checkpoint.round - 1)
        self.backend.wait_started()  # Ray's start refused (an address, the cluster's size): before anything is made
        self.prepared = True

    def _build(self) -> None:
        """The dataset, the tiers, the algorithm and w^(0) of the config (the per-client arrays are made here)."""
        c = self.config
        self.dataset = load_plugin_dataset(lookup("dataset", c.dataset), c)
        # --model: a ResNet in place of the dataset's own network; sBN: the server's view keeps the training data
        self.dataset = model_dataset(self.dataset, c, spec_label(c.dataset))  # (docs/models.md)
        self.model_name = self.dataset.model
        register_model(self.model_name, self.dataset.model_config)  # a dataset plug-in's own model, if any
        if self.model_name not in MODEL_CONFIGS:
            raise ConfigError(f"dataset {c.dataset!r} names model {self.model_name!r}; expected a built-in model "
                              f"({', '.join(MODEL_CONFIGS)}) or a model_config describing it")
        if self.dataset.num_clients != c.clients:
            raise ConfigError(f"dataset {c.dataset!r} loaded {self.dataset.num_clients} clients but clients is "
                              f"{c.clients}; expected a loader that splits the data over config.clients clients")
        self.ladder = ladder_of(c)
        self.p_max = capacity_tiers(c.seed, c.clients, c.tier_counts, self.ladder)  # dynamic: before round 0
        self.num_samples = call_plugin(f"dataset {spec_label(c.dataset)!r}", "client_sizes",
                                       lambda: np.asarray(self.dataset.client_sizes(), dtype=np.int64), early=True)
        if self.num_samples.shape != (c.clients,):  # clients.csv zips it with the other columns: never truncated
            raise PluginError(f"dataset {spec_label(c.dataset)!r} returned {self.num_samples.size} sizes of shape "
                              f"{self.num_samples.shape} from client_sizes(); expected one per client ({c.clients})")
        label = spec_label(c.algorithm)
        self.algorithm = GuardedAlgorithm(construct(algorithm_class(c.algorithm), label, c, self.p_max,
                                                    self.num_samples), label, c.clients)
        self.initial_params = initial_parameters(self.model_name, c.seed)
        self.clock = make_clock(c, self.model_name, self.num_samples, self.p_max, self.dataset.client_names)
        if self.clock is not None:  # allocation policies read devices and costs through it (docs/clock.md)
            self.algorithm.algorithm.clock = self.clock

    def run(self) -> Dict[str, Any]:
        """Run every round, write the run directory, return the summary."""
        apply_determinism(self.config.deterministic)  # again: another engine in this process may have changed it
        if not self.prepared:
            self.prepare()
        c = self.config
        lock = RunLock(self.rundir.path).acquire() if self.rundir else None  # before anything is written
        log = shared = None
        made_log = started = False  # log.txt made by this start; config.yaml written, the run directory the run's
        try:
            shared = self._lock_control_variates()
            if self.rundir and self.force and not self.resume:
                self.rundir.clear()
            made_log = bool(self.rundir) and not os.path.lexists(self.rundir.file("log.txt"))
            log = self._open_log()
            with StopSignals() as self.stop_signals:
                self.backend.should_stop = self.stop_signals.requested
                self.backend.while_training = lambda: self.record_pending(wait=False)
                self.backend.start(c, self.dataset, self.model_name, self.initial_params)
                try:
                    if self.checkpoint is not None:
                        self.backend.set_params(self.checkpoint.params)
                    if self.rundir:
                        with self._writing("config.yaml"):
                            self.rundir.create(c.to_dict(), self.backend.describe())
                        started = True
                        with self._writing("metrics.jsonl"):
                            self.rundir.reset_metrics(self.history)  # on resume: the lines up to the checkpoint
                        self.events = RunEvents.open(self.rundir.path, first_round=len(self.history))
                    return self._loop()
                except (TrainerError, PluginError) as error:
                    if log is not None:  # the sentence goes to the terminal (CLI); the traceback only here
                        log.stream.write(f"{error}\n{error.remote_traceback.rstrip()}\n")
                        log.flush()
                    if isinstance(error, ActorLostError) and self.rundir:  # the run's state is lost, its checkpoint not
                        raise ActorLostError(f"{error}; {self._kept()}: hasfl-ray simulate --out "
                                             f"{shlex.quote(self.rundir.path)} --resume") from None
                    raise
                finally:
                    if self.events is not None:
                        self.events.close()
                    self.backend.shutdown()  # every actor and Ray process the run started, however it ends
        finally:
            if log is not None:
                logging.getLogger("hasfl_ray").removeHandler(log)
                log.close()
            if shared is not None:
                shared.release()
            if lock is not None:
                lock.release()
                if not started:  # a start refused (Ray, the placement) leaves nothing it made
                    remove_made(lock.made, [self.rundir.file("log.txt")] if made_log else [])

    def _lock_control_variates(self) -> Optional[RunLock]:
        """An exclusive lock on ``control_variates_dir`` while the run writes its c_i files there (SCAFFOLD made the
        folder as it was built): a second run pointed at the same folder is refused in one sentence instead of
        overwriting the first one's control variates (a sweep gives each cell a folder of its own). None when the
        run keeps nothing there."""
        folder = self.config.control_variates_dir
        if not folder or not os.path.isdir(folder):
            return None
        try:
            return RunLock(folder, "control_variates_dir", "run", "choose another --control-variates-dir").acquire()
        except ConfigError:
            self.backend.shutdown()  # Ray and its actors, when prepare started them
            raise

    def _open_log(self) -> Optional[logging.Handler]:
        """RUN/log.txt: what the package logs during the run, and the traceback of a trainer that raised. Opened
        with O_NOFOLLOW: a link on its name (planted after :meth:`prepare` looked) is refused, never written
        through."""
        if not self.rundir:
            return None
        path = self.rundir.file("log.txt")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as error:
            if os.path.islink(path):
                raise ConfigError(f"run directory {self.rundir.path!r} has log.txt as a link to "
                                  f"{os.readlink(path)!r}; expected the run's own file, never followed (remove the "
                                  "link, or choose another --out)") from None
            raise OutputError(f"could not open log.txt in {self.rundir.path!r} ({error.strerror or error}); "
                              f"{self._kept()} once the problem is fixed") from None
        handler = _LogFile(os.fdopen(fd, "a", encoding="utf-8"))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("hasfl_ray").addHandler(handler)
        return handler

    def _interrupted(self, start: float) -> None:
        """Checkpoint the completed rounds and raise :class:`RunInterrupted` (the backend is shut down after)."""
        if self.rundir and self.history:
            with self._writing("checkpoints/latest.pt"):
                self.save_checkpoint(self.elapsed_before + time.perf_counter() - start)
        logger.warning("stopped by signal %d after %d completed rounds", self.stop_signals.signal_number,
                       len(self.history))
        raise RunInterrupted(self.stop_signals.signal_number, len(self.history),
                             self.rundir.path if self.rundir else None)

    @contextlib.contextmanager
    def _writing(self, what: str):
        """Turn a failed write of ``what`` (disk full, permissions) into one sentence saying what survives."""
        try:
            yield
        except OSError as error:
            raise OutputError(f"could not write {what} in {self.rundir.path!r} ({error.strerror or error}); "
                              f"{self._kept()} once the problem is fixed") from None

    def _kept(self) -> str:
        """What survives a failed write, for its sentence (which ends "once the problem is fixed")."""
        saved = load_checkpoint_round(self.rundir.path)
        if saved:
            return f"the checkpoint after round {saved - 1} is intact, so --resume continues from it"
        return "no checkpoint was written yet, so --resume starts the run again from round 0"

    def _loop(self) -> Dict[str, Any]:
        c = self.config
        start = time.perf_counter()
        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = tqdm(total=c.rounds, desc=f"{spec_label(c.algorithm)} on {spec_label(c.dataset)}", unit="round",
                       dynamic_ncols=True,
                       initial=len(self.history))
        self._in_loop, self._loop_start, self._bar = True, start, bar
        for t in range(len(self.history), c.rounds):
            try:
                line = self.run_round(t)
            except RoundInterrupted:
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
                self._record((line, None, None, None))
            while len(self._pending) > MAX_PENDING_LINES:  # never more than a few rounds behind
                self._record(self._pending.pop(0))
            if self.stop_signals.requested() and t + 1 < c.rounds:
                self.record_pending()
                if bar:
                    bar.close()
                self._interrupted(start)
        self._in_loop = False
        if bar:
            bar.close()
        return self.finish(self.elapsed_before + time.perf_counter() - start)

    def record_pending(self, wait: bool = True) -> None:
        """Record the lines waiting for their evaluation (see :meth:`run_round`), oldest first: all of them, or
        (``wait`` False) those whose evaluation is in, up to the first that is not. A backend that trains elsewhere
        (Ray) calls it without waiting once a round's training is under way (:attr:`Backend.while_training`), so
        the lines are written while the trainers train."""
        while self._pending and (wait or getattr(self._pending[0][1], "ready", lambda: True)()):
            self._record(self._pending.pop(0))

    def _record(self, pending: Optional[Tuple[Dict[str, Any], Any, Any, Optional[Snapshot]]]) -> None:
        """Record a round's line ``pending[0]`` (completed first when it waits for its evaluation, see
        :meth:`run_round`): the history, the coverage warning, metrics.jsonl, TensorBoard, the checkpoint (of the
        state ``pending[3]`` kept as the round ended, when a later round may have run since), the bar. Nothing for
        None."""
        if pending is None:
            return
        line, evaluation, wall_s, snapshot = pending
        if evaluation is not None:
            line = self._complete(line, evaluation, wall_s=wall_s)
        start, bar = self._loop_start, self._bar
        c, t = self.config, line["round"]
        self.history.append(line)
        if should_warn(self.history, c.warmup):
            logger.warning("round %d: %.1f %% of the global model has stayed at w^(0) since round %d%s; %s", t,
                           100 * line["frozen_fraction"], frozen_streak_start(self.history),
                           frozen_layers_phrase(line), COVERAGE_CAUSE)
        if self.rundir:
            with self._writing("metrics.jsonl"):
                self.rundir.append_metrics(line)
            if self.events is not None:
                self.events.write(line, self.algorithm)  # reads only: TensorBoard's view of the round
            if self._checkpoints(t):
                with self._writing("checkpoints/latest.pt"):
                    self.save_checkpoint(self.elapsed_before + time.perf_counter() - start, snapshot)
        if bar:
            bar.set_postfix(acc=f"{line['test_accuracy']:.3f}", avg_p=f"{line['avg_p']:.2f}",
                            cov=f"{line['coverage']:.2f}")
            bar.update(1)

    def save_checkpoint(self, elapsed_s: float, snapshot: Optional[Snapshot] = None) -> None:
        """Checkpoint the rounds recorded so far into the run directory (atomically): the run's state now, or the
        ``snapshot`` taken as the last recorded round ended (:meth:`snapshot`)."""
        if snapshot is None:
            params, state = self.backend.get_params(), self.algorithm.state_dict()
            clock = self.clock.state_dict() if self.clock is not None else None
        else:
            params, state, clock = snapshot.params(), snapshot.algorithm_state, snapshot.clock
        save_checkpoint(self.rundir.path, Checkpoint(
            round=len(self.history), params=params, algorithm_state=state,
            history=[dict(line) for line in self.history], config=self.config.to_dict(), elapsed_s=elapsed_s,
            clock=clock))

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
        return Snapshot(self.backend.params_later(), copy.deepcopy(state), copy.deepcopy(clock))

    def run_round(self, t: int) -> Dict[str, Any]:
        """One round: sample, allocate, train, aggregate, observe, evaluate; returns its metrics line."""
        c = self.config
        round_start = time.perf_counter()
        invitation = self.clock.invite(t, c.clients_per_round) if self.clock is not None else None
        participants = invitation.clients if invitation is not None else \
            sample_participants(c.seed, t, c.clients, c.clients_per_round)
        if c.width_assignment == "dynamic":  # every client's p^max redrawn from the ladder's mix
            self.p_max = round_capacities(c.seed, t, c.clients, self.ladder)
            self.algorithm.set_capacities(t, self.p_max)
        widths = self.algorithm.allocate(t, participants)
        clocked: Dict[str, Any] = {}  # the clock's keys of the line (none without a device population)
        steps: Dict[int, int] = {}  # local steps of the clients a partial deadline cuts short
        if self.clock is not None:  # who the deadline keeps, and how far a partial client gets (docs/clock.md)
            participants, steps, clocked = self._clocked_round(t, invitation or Invitation(participants), widths)
        lr = c.lr * c.lr_decay ** t
        tasks = [ClientTask(i, t, widths[i], lr, c.seed, self.algorithm.objective(t, i, widths[i]),
                            offset=self.algorithm.window_offset(t, i), max_steps=steps.get(i))
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
        if tasks:
            results, aggregate = self.backend.run_round(tasks, weights, self.algorithm.server_lr)
        else:  # (a clocked round) every invited client dropped out or came late: the global model stays as it was
            results, aggregate = [], self._empty_aggregate()
        accepted = {r.client for r in results}
        rejected = [task.client for task in tasks if task.client not in accepted]
        if rejected:
            logger.warning("round %d: rejected the non-finite update or diverged loss of client(s) %s%s", t,
                           ", ".join(map(str, rejected)),
                           "; every update was rejected, so the global model is unchanged" if not results else "")
        self.algorithm.observe(t, results, aggregate)
        evaluation = self.request_evaluation(t)
        used = [r.width if r.trained_width is None else r.trained_width for r in results] or \
            [widths[i] for i in participants] or list(widths.values())
        h = self.algorithm.h_tilde()
        line = {"round": t, "test_accuracy": None, "test_loss": None, "avg_p": float(np.mean(used)),
                "coverage": aggregate.covered_fraction, "frozen_fraction": self.backend.frozen_fraction(),
                "mean_h": float(h.mean()) if h is not None else None, "rejected_updates": len(rejected),
                "frozen_by_layer": self.backend.frozen_by_layer(), "coverage_by_layer": aggregate.covered_by_layer,
                **clocked, "wall_s": None}
        if self.backend.overlaps_evaluation and self._may_defer(t):
            # recorded once its evaluation is in, while a later round trains; wall_s is the round's time up to here;
            # a round that checkpoints keeps the state its checkpoint holds (or is completed now when it cannot)
            checkpoints = self._checkpoints(t)
            snapshot = self.snapshot() if checkpoints else None
            if snapshot is not None or not checkpoints:
                self._pending.append((line, evaluation, time.perf_counter() - round_start, snapshot))
                return line
        return self._complete(line, evaluation, round_start)

    def _clocked_round(self, t: int, invitation: Invitation, widths: Dict[int, float]
                       ) -> Tuple[List[int], Dict[int, int], Dict[str, Any]]:
        """Round ``t`` on the device clock (docs/clock.md): each invited client's cost at its width (the algorithm's
        extras included), the deadline policy's verdict, the clock moved past the round. Returns the clients kept
        (sorted), the local steps of those cut short, and the clock's keys of the metrics line."""
        clock, invited = self.clock, invitation.clients
        costs = {i: self.algorithm.client_cost(t, i, widths[i], clock.base_cost(i, widths[i])) for i in invited}
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
        return self._in_loop and t + 1 < self.config.rounds and not self.stop_signals.requested()

    def _checkpoints(self, t: int) -> bool:
        """Whether round ``t`` ends with a checkpoint (every ``checkpoint_every`` rounds and after the last)."""
        every = self.config.checkpoint_every
        return bool(self.rundir) and bool(every) and ((t + 1) % every == 0 or t + 1 == self.config.rounds)

    @staticmethod
    def _complete(line: Dict[str, Any], evaluation, round_start: Optional[float] = None,
                  wall_s: Optional[float] = None) -> Dict[str, Any]:
        """``line`` with its evaluation's fields filled in (in the order a line has always had), and wall_s: the
        given one (a deferred line's, measured when its round ended) or the seconds since ``round_start``."""
        accuracy, loss, evaluated = evaluation()
        line["test_accuracy"], line["test_loss"] = accuracy, loss
        del line["wall_s"]
        line.update(evaluated)
        line["wall_s"] = wall_s if wall_s is not None else time.perf_counter() - round_start
        return line

    # -- evaluation beside test_accuracy (docs/metrics.md) -------------------------------------------------------

    @property
    def eval_widths(self) -> List[float]:
        """The widths evaluated on evaluation rounds, ascending, 1.0 last (``eval_widths``, else the tiers' p^max;
        with dynamic assignment every width of the ladder)."""
        if self.config.eval_widths:
            return self.config.eval_widths
        if self.config.width_assignment == "dynamic":
            return default_eval_widths(np.asarray(self.ladder.widths))
        return default_eval_widths(self.p_max)

    def request_evaluation(self, t: int):
        """Start round ``t``'s evaluation of the global model: test accuracy and loss, accuracy_at_width and
        loss_at_width (on its evaluation rounds; width 1 is test_accuracy itself) and every client's local accuracy
        (on its local-evaluation rounds). Returns a function giving (accuracy, loss, the line's other evaluation
        fields); everything it reads of the run is read now, so it may be called after the next round."""
        c = self.config
        full = self.backend.request("evaluate")
        at_widths = local = None
        if is_eval_round(t, c.rounds, c.eval_every):
            all_widths = list(self.eval_widths)
            widths = [w for w in all_widths if w != 1.0]
            at_widths = (all_widths, self.backend.request("evaluate_widths", widths, self._submodels(widths))
                         if widths else (lambda: {}))
        if is_eval_round(t, c.rounds, c.local_eval_every):
            local = self.request_local_accuracy()

        parts = [full] + ([at_widths[1]] if at_widths is not None else []) + ([local] if local is not None else [])

        def finish() -> Tuple[float, float, Dict[str, Any]]:
            accuracy, loss = full()
            out: Dict[str, Any] = {}
            if at_widths is not None:
                all_widths, requested = at_widths
                results = dict(requested())
                results[1.0] = (accuracy, loss)
                out["accuracy_at_width"] = {width_key(w): results[w][0] for w in all_widths}
                out["loss_at_width"] = {width_key(w): results[w][1] for w in all_widths}
            if local is not None:
                self.local = local()
                if not isinstance(self.local, str):
                    out["local_accuracy_mean"] = self.local["summary"]["mean"]
            return accuracy, loss, out

        finish.ready = lambda: all(getattr(part, "ready", lambda: True)() for part in parts)
        return finish

    def _submodels(self, widths: Sequence[float]) -> Optional[Dict[float, Dict[str, torch.Tensor]]]:
        """A plug-in's own sub-models (``Algorithm.submodel_for_eval``) of ``widths`` below 1, where it defines them;
        None: the nested prefix, cut on the server."""
        algorithm = self.algorithm if isinstance(self.algorithm, GuardedAlgorithm) else \
            GuardedAlgorithm(self.algorithm, spec_label(self.config.algorithm))  # one a caller set unguarded
        if not algorithm.overrides_submodel_for_eval or not any(w != 1.0 for w in widths):
            return None
        params, specs = self.backend.get_params(), build_model(self.model_name).param_specs()
        out = {}
        for w in widths:
            if w != 1.0:
                sub = algorithm.submodel_for_eval(params, w, {n: s.sliced_shape(w) for n, s in specs.items()})
                if sub is not None:
                    out[w] = sub
        return out or None

    def local_accuracy(self) -> Any:
        """Every client's local accuracy now: {"masked", "unmasked", "samples", "widths" (N,) arrays, "summary",
        "summary_unmasked"}, or the sentence saying why the dataset does not define it."""
        return self.request_local_accuracy()()

    def request_local_accuracy(self):
        """:meth:`local_accuracy`, started now (the widths and tiers are today's), given by the function returned."""
        if isinstance(self.dataset, TextFederatedDataset):
            return lambda: TEXT_LOCAL_ACCURACY
        c = self.config
        if getattr(self, "_label_counts", None) is None:  # the training partition's label histograms: once a run
            label = f"dataset {spec_label(c.dataset)!r}"
            self._label_counts = call_plugin(label, "label_histograms",
                                             lambda: np.asarray(self.dataset.label_histograms(), dtype=np.int64))
            if self._label_counts.ndim != 2 or self._label_counts.shape[0] != c.clients:
                raise PluginError(f"{label} returned label histograms of shape {self._label_counts.shape} from "
                                  f"label_histograms(); expected (clients, classes) = ({c.clients}, classes)")
        widths = np.array(self.algorithm.p_current if c.local_eval_width == "final" else self.p_max,
                          dtype=np.float64)
        p_max, label_counts = np.array(self.p_max, dtype=np.float64), self._label_counts
        specs = build_model(self.model_name).param_specs()
        chosen, groups = submodel_groups(widths, lambda w: tuple(s.sliced_shape(w) for s in specs.values()))
        requested = self.backend.request("test_beats", chosen, self._submodels(chosen))

        def finish() -> Dict[str, Any]:
            labels, beats = requested()
            masked, unmasked, samples = local_accuracies(labels, np.stack([beats[w] for w in chosen]), groups,
                                                         label_counts)
            return {"masked": masked, "unmasked": unmasked, "samples": samples, "widths": widths,
                    "summary": accuracy_summary(masked, p_max, c.local_eval_width, True),
                    "summary_unmasked": accuracy_summary(unmasked, p_max, c.local_eval_width, False)}

        finish.ready = getattr(requested, "ready", lambda: True)
        return finish

    def evaluation_summary(self) -> Dict[str, Any]:
        """summary.json's accuracy at each width (the last evaluation's and the best over the run's evaluations)
        and local accuracy (computed here when the last round's was not: a resumed run that had finished)."""
        out: Dict[str, Any] = {}
        evaluated = [line["accuracy_at_width"] for line in self.history if "accuracy_at_width" in line]
        if evaluated:
            out["accuracy_at_width_final"] = dict(evaluated[-1])
            out["accuracy_at_width_best"] = {k: max(e[k] for e in evaluated if k in e) for k in evaluated[-1]}
        if self.local is None:
            self.local = self.local_accuracy()
        if isinstance(self.local, str):
            out["local_accuracy"] = out["local_accuracy_unmasked"] = self.local
        else:
            out["local_accuracy"], out["local_accuracy_unmasked"] = self.local["summary"], \
                self.local["summary_unmasked"]
        return out

    def sampled_clients(self) -> np.ndarray:
        """Boolean mask (num_clients,) of the clients sampled in the rounds run so far (recomputed from the seed,
        so a resumed run gets the same)."""
        c = self.config
        if self.clock is not None:  # its own invitations: the clock keeps count
            return self.clock.invited.copy()
        mask = np.zeros(c.clients, dtype=bool)
        for t in range(len(self.history)):
            mask[sample_participants(c.seed, t, c.clients, c.clients_per_round)] = True
        return mask

    def client_rows(self) -> Iterator[Tuple[Any, ...]]:
        """clients.csv's rows in CLIENT_COLUMNS order, one at a time (per-client state stays in numpy arrays; an
        empty tv_distance or h_tilde is one the run did not compute)."""
        h = self.algorithm.h_tilde()
        tv = call_plugin(f"dataset {spec_label(self.config.dataset)!r}", "run_tv_distances",
                         lambda: np.asarray(self.dataset.run_tv_distances(self.sampled_clients()), dtype=np.float64))
        if tv.shape != (self.config.clients,):
            raise PluginError(f"dataset {spec_label(self.config.dataset)!r} returned {tv.size} values of shape "
                              f"{tv.shape} from run_tv_distances(); expected one per client ({self.config.clients})")
        p_final = np.asarray(self.algorithm.p_current, dtype=np.float64)
        names = self.dataset.client_names
        local = self.local if isinstance(self.local, dict) else None
        clocked = list(profile_columns(self.clock).values()) if self.clock is not None else []
        for start in range(0, self.config.clients, CLIENT_ROWS_CHUNK):  # Python numbers for one chunk at a time
            part = slice(start, start + CLIENT_ROWS_CHUNK)
            tv_part = [("" if x != x else x) for x in tv[part].tolist()]  # NaN: not computed
            h_part = h[part].tolist() if h is not None else [""] * len(tv_part)
            empty = [""] * len(tv_part)
            local_part = [[("" if x != x else x) for x in local[k][part].tolist()] if local else empty
                          for k in ("masked", "unmasked", "widths", "samples")]
            yield from zip(range(start, start + len(tv_part)), self.num_samples[part].tolist(),
                           self.p_max[part].tolist(), tv_part, h_part, p_final[part].tolist(), names[part],
                           *local_part, *[[("" if x != x else x) for x in column[part].tolist()] for column in clocked])

    def finish(self, wall_s: float) -> Dict[str, Any]:
        accuracies = [line["test_accuracy"] for line in self.history]
        avg_p = [line["avg_p"] for line in self.history]
        summary = {"best_accuracy": max(accuracies), "final_accuracy": accuracies[-1],
                   "avg_p": float(np.mean(avg_p)),
                   "avg_p_post_warmup": post_warmup_avg_p(avg_p, self.config.warmup, self.config.t_adapt),
                   "rounds": len(self.history),
                   "params_sha256": self.backend.params_sha256(), "wall_s": wall_s, **self.backend.summary()}
        warning = coverage_warning(self.history, self.config.warmup)
        if warning is not None:
            summary["coverage_warning"] = warning
        if self.config.eval_samples is not None:  # the test samples each round evaluated (a seeded subset)
            summary["eval_samples"] = min(self.config.eval_samples, self.dataset.test_size)
        summary.update(self.evaluation_summary())
        if self.clock is not None:  # simulated hours, GB and time-to-accuracy (docs/clock.md)
            summary.update(clock_summary(self.history))
        if self.rundir:
            with self._writing("clients.csv"):
                self.rundir.write_clients(self.client_rows(),
                                          tuple(profile_columns(self.clock)) if self.clock is not None else ())
            with self._writing("summary.json"):
                self.rundir.write_summary(summary)
        return summary


