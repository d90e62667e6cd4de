"""Preparing a run: the refusals before anything is made; its dataset, tiers, algorithm, w^(0) and clock built."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Optional, Tuple

import numpy as np
import torch

from hasfl_ray import allocator
from hasfl_ray.algorithms import algorithm_class
from hasfl_ray.clock import make_clock
from hasfl_ray.config.inputs import unverified_inputs
from hasfl_ray.data import load_plugin_dataset
from hasfl_ray.data.fingerprint import data_view, dataset_fingerprint
from hasfl_ray.data.memory import BYTES_PER_CLIENT, check_client_memory, physical_memory
from hasfl_ray.engine.checkpoint import (check_checkpoint, check_resume_config, checkpoint_path,
                                         load_checkpoint, start_again, stored_config)
from hasfl_ray.engine.async_state import state_problem
from hasfl_ray.engine.config import RunConfig
from hasfl_ray.engine.guard import GuardedAlgorithm, PluginError, construct
from hasfl_ray.engine.history import History
from hasfl_ray.engine.participants import capacity_tiers, check_one_shape, initial_parameters, round_capacities
from hasfl_ray.engine.earlier_run import settle_unlocked
from hasfl_ray.engine.finished_here import finish_here
from hasfl_ray.engine.rundir import check_no_links, check_output_folder, check_run_directory, check_start
from hasfl_ray.errors import ConfigError, RoundInterrupted, RunInterrupted, progress_phrase
from hasfl_ray.front_end import option
from hasfl_ray.federation import empty_level_note, ladder_of
from hasfl_ray.files import claim_folder
from hasfl_ray.models import MODEL_CONFIGS, register_model
from hasfl_ray.models.choice import model_dataset
from hasfl_ray.models.depth_plan import depth_plan, effective_sub_model
from hasfl_ray.ops.calls import sparse_cuda_kernel
from hasfl_ray.registry import call_plugin, lookup, spec_label
from hasfl_ray.schedule import milestones_note
from hasfl_ray.training.precision import batching_note, check_precision

logger = logging.getLogger(__name__)

#: What a device clock (profiles, availability, per-client times) and the asynchronous loop (Markov state, versions)
#: add to :data:`BYTES_PER_CLIENT`: 10^7 synthetic clients took 2.52 GB with ``--devices lognormal`` and 3.08 GB
#: asynchronous with Markov availability, against 1.66 GB without a clock (battery 5's A183, A184), rounded up.
CLOCK_BYTES_PER_CLIENT, ASYNC_BYTES_PER_CLIENT = 96, 64


def bytes_per_client(config: Any) -> int:
    """The bytes a client :func:`check_client_memory` assumes for a run config: more with a clock (``devices``),
    more again asynchronous."""
    asynchronous = getattr(config, "mode", "sync") == "async"
    clocked = asynchronous or getattr(config, "devices", None) is not None
    return BYTES_PER_CLIENT + CLOCK_BYTES_PER_CLIENT * clocked + ASYNC_BYTES_PER_CLIENT * asynchronous


def prepare(engine: Any) -> None:
    """:func:`prepare_parts`, its seconds kept as ``engine.prepare_s`` (part of the run's start-up, summary.json's
    ``startup_s``)."""
    start = time.perf_counter()
    prepare_parts(engine)
    engine.prepare_s = time.perf_counter() - start


def prepare_parts(engine: Any) -> None:
    """:meth:`Engine.prepare`: the refusals before anything is made (the run directory, the device, the threads,
    the memory, a checkpoint against the run), the run's parts built (:func:`build`), a checkpoint's state
    restored."""
    c = engine.config
    if engine.rundir:
        check_run_directory(engine.rundir.path)
        if os.path.isdir(engine.rundir.path):
            settle_unlocked(engine.rundir.path)  # a --force start killed in between: its folder read as settled
            check_no_links(engine.rundir.path)  # log.txt and the checkpoint are opened by name: never through a link
        check_start(engine.rundir.path, engine.resume, engine.force)  # a new run only where nothing would be lost
    check_control_variates_dir(engine)
    check_device(c)
    check_threads(c)
    allocator.check_variable()  # HASFL_MALLOC_TRIM=off used to trim as if unset
    sparse_cuda_kernel()  # HASFL_SPARSE_CUDA_KERNEL, else refused only by the CUDA op, at the first aggregation
    check_client_memory(c.clients, bytes_per_client(c))
    if engine.rundir and engine.force and not engine.resume:
        engine.rundir.check_clearable()  # --force clears only a run directory: refused before anything runs
    if engine.resume and engine.rundir:
        engine.checkpoint = load_checkpoint(engine.rundir.path)
        if not engine.force:
            check_resume_config(engine.rundir.path, stored_config(engine.rundir.path, engine.checkpoint), c)
        check_same_mode(engine)
        if engine.checkpoint is not None and engine.checkpoint.round > c.rounds:  # --force with fewer rounds
            raise ConfigError(f"checkpoint {checkpoint_path(engine.rundir.path)!r} holds "
                              f"{progress_phrase(engine.checkpoint.round, c.mode)} but rounds is {c.rounds}; expected "
                              f"at least {engine.checkpoint.round} rounds to continue it, {start_again()}")
    finish_here(engine)  # a checkpoint with every round: finished in this process, Ray never started for it
    engine.inputs_unverified = unverified_inputs(c)  # what input_sha256 cannot vouch for: said once the log is open
    engine.backend.warm_up(c)  # Ray and its actors start while the data loads (docs/ray.md, 'Start-up')
    if c.control_variates_dir:  # made and marked before the algorithm (or a checkpoint's state) writes there;
        engine.claimed = claim_folder(c.control_variates_dir, CONTROL_VARIATES)  # undone if the start is refused
    try:
        build(engine)
    except MemoryError:
        total = physical_memory()
        raise ConfigError(f"clients is {c.clients} and memory ran out building the per-client state (about "
                          f"{c.clients * bytes_per_client(c) / 1e9:.3g} GB at {bytes_per_client(c)} bytes a client"
                          + (f", of {total / 1e9:.3g} GB here" if total else "") + "); expected fewer clients, or "
                          "more free memory") from None
    if engine.resume and engine.rundir and not engine.force:  # the data, known once loaded (data/fingerprint.py)
        check_resume_config(engine.rundir.path, stored_config(engine.rundir.path, engine.checkpoint), engine.config)
    if engine.checkpoint is not None:
        path = checkpoint_path(engine.rundir.path)
        check_checkpoint(path, engine.checkpoint, engine.initial_params, engine.algorithm.state_dict())
        try:
            engine.algorithm.algorithm.load_state_dict(engine.checkpoint.algorithm_state)
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # noqa: BLE001 (the plug-in's code, SystemExit included)
            raise ConfigError(f"checkpoint {path!r} does not match this run: algorithm {c.algorithm!r} cannot load "
                              f"its algorithm_state ({type(error).__name__}: {str(error)[:60]}); expected this "
                              f"run's algorithm state, {start_again()}") from None
        engine.history = History(dict(line) for line in engine.checkpoint.history)
        check_clock_state(engine, path)
        if engine.clock is not None and engine.checkpoint.clock is not None:
            engine.clock.load_state_dict(engine.checkpoint.clock)
        if c.width_assignment == "dynamic" and engine.history:  # the capacities of the last round run
            engine.p_max = round_capacities(c.effective_data_seed, len(engine.history) - 1, c.clients, engine.ladder)
        engine.elapsed_before = engine.checkpoint.elapsed_s
        logger.info("resuming %s after round %d", engine.rundir.path, engine.checkpoint.round - 1)
    from hasfl_ray.engine.participants import check_participation
    from hasfl_ray.engine.privacy import check_budget

    check_participation(engine.algorithm, c)  # poisson with a plug-in that selects: refused before anything is written
    check_budget(engine)  # a DP budget the next update would exceed: refused before anything is written
    engine.backend.wait_started()  # Ray's start refused (an address, the cluster's size): before anything is made
    engine.prepared = True


def run_dataset(config: Any) -> Any:
    """The federated dataset a resolved run config trains on (a Flower client of the run loads the same,
    :mod:`hasfl_ray.flower`)."""
    dataset = load_plugin_dataset(lookup("dataset", config.dataset), data_view(config))  # split by the data seed
    # --model: a ResNet in place of the dataset's own network; sBN: the server's view keeps the training data
    return model_dataset(dataset, config, spec_label(config.dataset))  # (docs/models.md)


def check_client_count(dataset: Any, c: RunConfig) -> None:
    """Refuse, in one sentence, a loaded dataset split over another number of clients than ``clients`` (a
    plug-in's loader that ignores config.clients)."""
    if dataset.num_clients != c.clients:
        raise ConfigError(f"dataset {spec_label(c.dataset)!r} loaded {dataset.num_clients} clients but clients is "
                          f"{c.clients}; expected a loader that splits the data over config.clients clients")


def build(engine: Any) -> None:
    """The dataset, the tiers, the algorithm and w^(0) of the config (the per-client arrays are made here)."""
    c = engine.config
    # the dataset is split by the data seed: a loader (built-in or plug-in) reads it as config.seed (docs/plugins.md)
    engine.dataset = load_plugin_dataset(lookup("dataset", c.dataset), data_view(c))
    # the data by their content (config.yaml and summary.json; --resume and a sweep's reuse compare it)
    found = call_plugin(f"dataset {spec_label(c.dataset)!r}", "fingerprint",
                        lambda: dataset_fingerprint(engine.dataset), early=True)
    engine.config = c = dataclasses.replace(c, data_fingerprint=found)
    # --model: a ResNet in place of the dataset's own network; sBN: the server's view keeps the training data
    engine.dataset = model_dataset(engine.dataset, c, spec_label(c.dataset))  # (docs/models.md)
    engine.model_name = engine.dataset.model
    check_statistics_keys(engine)
    images = getattr(engine.dataset, "train_x", None)
    if c.augmentation != "none" and (images is None or images.dim() != 4):
        raise ConfigError(f"augmentation is {c.augmentation!r} but dataset {spec_label(c.dataset)!r} has no image "
                          "batches (inputs N x C x H x W); expected augmentation none, or an image dataset (digits, "
                          "emnist, cifar10, cifar100)")
    if c.sbn_statistics_data == "training_set" and not callable(getattr(engine.dataset, "training_set_batch", None)):
        raise ConfigError(f"sbn_statistics_data is 'training_set' but dataset {spec_label(c.dataset)!r} holds no "
                          "training set as tensors; expected sbn_statistics_data clients, or a built-in image dataset")
    register_model(engine.model_name, engine.dataset.model_config)  # a dataset plug-in's own model, if any
    if engine.model_name not in MODEL_CONFIGS:
        raise ConfigError(f"dataset {c.dataset!r} names model {engine.model_name!r}; expected a built-in model "
                          f"({', '.join(MODEL_CONFIGS)}) or a model_config describing it")
    check_precision(c, engine.model_name)  # bf16 with an LSTM on a CPU without oneDNN's bf16 LSTM: refused here
    check_client_count(engine.dataset, c)
    engine.ladder = ladder_of(c)
    engine.p_max = capacity_tiers(c.effective_data_seed, c.clients, c.tier_counts, engine.ladder)  # dynamic: round 0
    engine.num_samples = call_plugin(f"dataset {spec_label(c.dataset)!r}", "client_sizes",
                                     lambda: np.asarray(engine.dataset.client_sizes(), dtype=np.int64), early=True)
    if engine.num_samples.shape != (c.clients,):  # clients.csv zips it with the other columns: never truncated
        raise PluginError(f"dataset {spec_label(c.dataset)!r} returned {engine.num_samples.size} sizes of shape "
                          f"{engine.num_samples.shape} from client_sizes(); expected one per client ({c.clients})")
    label = spec_label(c.algorithm)
    engine.algorithm = build_algorithm(c, engine.model_name, engine.p_max, engine.num_samples)
    check_one_shape(engine.algorithm.algorithm, effective_sub_model(c), label)  # no channel sets or masks by depth
    engine.algorithm.algorithm.global_params = lambda: engine.backend.get_params()  # FIARSE's thresholds read it
    widths = sorted({float(w) for w in engine.ladder.widths} | {float(w) for w in np.unique(engine.p_max)}
                    | {float(w) for w in engine.eval_widths})  # what it can hand out or be evaluated at
    call_plugin(f"algorithm {label!r}", "check_model", engine.algorithm.algorithm.check_model, widths, early=True)
    engine.initial_params = initial_parameters(engine.model_name, c.seed)
    engine.clock = make_clock(c, engine.model_name, engine.num_samples, engine.p_max, engine.dataset.client_names)
    if engine.clock is not None:  # allocation policies read devices and costs through it (docs/clock.md)
        engine.algorithm.algorithm.clock = engine.clock
        if c.mode == "async":
            check_deliverable(engine.clock, c.devices)


def build_algorithm(c: RunConfig, model_name: str, p_max: np.ndarray, num_samples: np.ndarray) -> GuardedAlgorithm:
    """The run's algorithm, guarded, with its ``model_name`` and ``depth_plan`` set: what a run trains with, and what
    :meth:`hasfl_ray.results.Run.model` cuts a width's evaluated sub-model with."""
    label = spec_label(c.algorithm)
    algorithm = GuardedAlgorithm(construct(algorithm_class(c.algorithm), label, c, p_max, num_samples), label,
                                 c.clients)
    if getattr(algorithm.algorithm, "model_name", None) is None:  # a plug-in's own model_name stays
        algorithm.algorithm.model_name = model_name  # what FedRolex's window reads (channel counts)
    algorithm.algorithm.depth_plan = depth_plan(c, model_name,  # sub_model depth, width_depth
                                                getattr(algorithm_class(c.algorithm), "depths_option", None))
    return algorithm


def check_deliverable(clock: Any, devices: Any) -> None:
    """Refuse an asynchronous run in which no update can ever arrive: every client's longest stretch on is no
    longer than its latency alone, so each dispatch is lost and the loop would dispatch for ever (in rounds, each
    round ends with every update dropped)."""
    longest = getattr(clock.availability, "longest_on", None)
    if longest is None:
        return
    spare = longest() - clock.profiles.latency
    if len(spare) and not (spare > 0).any():
        k = int(np.argmax(spare))
        source = devices.get("trace", devices.get("fedscale")) if isinstance(devices, dict) else devices
        raise ConfigError(f"the trace {source!r} gives no client a stretch of availability longer than its latency "
                          f"(client {k}: on for at most {longest()[k]:.3g} s, latency {clock.profiles.latency[k]:.3g} "
                          "s), so in mode async no update would ever arrive and no server update happen; expected "
                          "longer availability intervals, or mode sync")


def check_same_mode(engine: Any) -> None:
    """Refuse, in one sentence, ``--resume --force`` of a checkpoint in the other run mode (sync to async or back):
    rounds and server updates are not one history, and an asynchronous loop has no state to start from in a
    synchronous checkpoint (nor a synchronous round in the clients an asynchronous one has in flight)."""
    checkpoint = engine.checkpoint
    if checkpoint is None:
        return
    stored = stored_config(engine.rundir.path, checkpoint) or {}
    mode = stored.get("mode", "sync")
    if mode != engine.config.mode:
        done = progress_phrase(checkpoint.round, mode)
        raise ConfigError(f"checkpoint {checkpoint_path(engine.rundir.path)!r} holds a run in mode {mode!r} ({done}) "
                          f"but mode is {engine.config.mode!r}; expected mode {mode!r} to continue it "
                          f"({option('force')} continues a changed config within one mode), {start_again()}")


def check_clock_state(engine: Any, path: str) -> None:
    """Refuse, in one sentence, a checkpoint whose device clock or asynchronous loop does not fit this run, checked
    whole as its parameters are (never negative time, never a restart at version 0, never a run ending at once):
    the clock's fields (:meth:`~hasfl_ray.clock.Clock.state_problem`), then an asynchronous run's loop state
    (:func:`~hasfl_ray.engine.async_state.state_problem`) and its history of server updates."""
    c, checkpoint = engine.config, engine.checkpoint
    clock = checkpoint.clock
    problem = None
    if engine.clock is not None:
        problem = "it holds no clock state" if clock is None and engine.history else \
            None if clock is None else engine.clock.state_problem(clock)
    if problem is None and isinstance(clock, dict) and "async" in clock and c.mode != "async":
        problem = "its clock state holds an asynchronous loop's state but mode is 'sync'"
    if problem is None and c.mode == "async" and engine.history:
        problem = async_history_problem(engine.history)
        if problem is None:
            saved = clock.get("async") if isinstance(clock, dict) else None
            problem = "it holds no asynchronous loop state" if saved is None else state_problem(
                saved, checkpoint.round, float(clock["now"]), c.clients, c.concurrency, c.buffer_size,
                c.async_rule == "fedasync", engine.initial_params)
    if problem:
        what = "asynchronous loop's" if c.mode == "async" else "device clock's"
        raise ConfigError(f"checkpoint {path!r} does not match this run: {problem}; expected the {what} state this "
                          f"run wrote, {start_again()}")


def async_history_problem(history: Any) -> Optional[str]:
    """What makes a checkpoint's history not an asynchronous run's (each line server update ``round``'s, with its
    version and staleness), None when nothing does."""
    for index, line in enumerate(history):
        for key in ("version", "staleness_max"):
            value = line.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 or \
                    (key == "version" and value != index + 1):
                return f"its history line {index} has {key} {value!r}, not server update {index}'s"
    return None


def check_statistics_keys(engine: Any) -> None:
    """Refuse, in one sentence, sBN statistics keys that cannot apply (once the model is known, before anything is
    made): ``sbn_statistics``/``sbn_batch_size`` other than their defaults on a model without static BatchNorm (they
    did nothing; a resumed run is not asked again: version-2 configs carry ``in_order``), and ``test_batch`` where an
    evaluation batch holds one sample (``eval_batch_size`` 1, or ``eval_samples`` leaving a last batch of one),
    whose own statistics normalise nothing: it failed at the first evaluation, after training."""
    c = engine.config
    if not engine.dataset.view_keeps_train:  # the model has no static BatchNorm (hasfl_ray.models.choice)
        if engine.resume:
            return
        for name, default in (("sbn_statistics", "shuffled"), ("sbn_batch_size", 10)):
            if getattr(c, name) != default:
                raise ConfigError(f"{name} is {getattr(c, name)!r} but model {spec_label(engine.model_name)!r} has "
                                  "no static BatchNorm (sBN), so it does nothing; expected it only with sBN layers "
                                  "(--model-norm sbn)")
        return
    if c.sbn_statistics != "test_batch":
        return
    scored = engine.dataset.test_size if c.eval_samples is None else min(c.eval_samples, engine.dataset.test_size)
    if c.eval_batch_size == 1 or scored % c.eval_batch_size == 1:
        raise ConfigError(f"sbn_statistics is 'test_batch' but {scored} test samples in batches of "
                          f"{c.eval_batch_size} leave a batch of one, which its own statistics cannot normalise; "
                          "expected another --eval-batch-size or --eval-samples")


#: The kind of files SCAFFOLD keeps in ``control_variates_dir`` (hasfl_ray.files.FOLDER_KINDS).
CONTROL_VARIATES = "control variates"


def check_control_variates_dir(engine: Any) -> None:
    """Refuse, in one sentence, a ``control_variates_dir`` the run may not write (before anything is made): the
    run directory itself or a folder inside it (which holds only the run's files), and anything
    :func:`~hasfl_ray.engine.rundir.check_output_folder` refuses: a file, a device, a place that cannot be written,
    a folder of the user's files (a client_0.pt of theirs is never overwritten)."""
    folder = engine.config.control_variates_dir
    if not folder:
        return
    fix = "choose another --control-variates-dir"
    if engine.rundir:
        run, real = os.path.realpath(engine.rundir.path), os.path.realpath(folder)
        if real == run or real.startswith(run.rstrip(os.sep) + os.sep):
            where = "is the run directory" if real == run else f"is inside the run directory {engine.rundir.path!r}"
            raise ConfigError(f"control_variates_dir {folder!r} {where}, which holds only the run's files; expected "
                              f"a folder of its own ({fix})")
    check_output_folder(folder, CONTROL_VARIATES, "control_variates_dir", fix)


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


def lock_control_variates(engine: Any) -> Optional[Any]:
    """An exclusive lock on ``control_variates_dir`` while the run writes its c_i files there (prepare made and
    marked the folder): a second run pointed at the same folder is refused in one sentence instead of
    overwriting the first one's control variates (a sweep gives each cell a folder of its own). None when the
    run keeps nothing there."""
    from hasfl_ray.engine.rundir import RunLock

    folder = engine.config.control_variates_dir
    if not folder or not os.path.isdir(folder):
        return None
    try:
        return RunLock(folder, "control_variates_dir", "run", "choose another --control-variates-dir").acquire()
    except ConfigError:
        engine.backend.shutdown()  # Ray and its actors, when prepare started them
        raise


def start_backend(engine: Any) -> None:
    """Start the run's backend inside its stop signals; a stop asked while it starts (a joined Ray cluster whose
    CPUs other jobs hold places the actors only once they end) stops the run as a stop before its next round: the
    checkpoint, if any, is left as it was (:class:`RunInterrupted`)."""
    try:
        engine.backend.start(engine.config, engine.dataset, engine.model_name, engine.initial_params)
    except RoundInterrupted:
        raise RunInterrupted(engine.stop_signals.signal_number, len(engine.history),
                             engine.rundir.path if engine.rundir else None, engine.config.mode) from None


def start_notes(c: RunConfig) -> Tuple[Optional[str], ...]:
    """The warning lines a run gives at its start, on the terminal and in RUN/log.txt (None where none applies):
    batching asked for that its trainers will not do, a width of the ladder asked for that rounding deals no client
    (:func:`hasfl_ray.federation.empty_level_note`), a learning-rate milestone the run never reaches."""
    return batching_note(c), empty_level_note(c), milestones_note(c.lr_milestones, c.rounds)
