"""`hasfl-ray sweep`: every (dataset, algorithm, seed) cell of an experiment config, resumable."""

from __future__ import annotations

import signal
import sys

import click
from tqdm import tqdm

from hasfl_ray.cli.common import setup_logging, user_errors
from hasfl_ray.cli.options import apply_switches, default_backend, run_options
from hasfl_ray.cli.sections import SectionedCommand
from hasfl_ray.errors import ConfigError
from hasfl_ray.simulation import require_ray

#: Statuses of the cells a stopped sweep leaves to its next run: stopped with a checkpoint, or not started.
STOPPED = ("interrupted", "pending")


@click.command(cls=SectionedCommand)  # --help in sections (hasfl_ray.cli.sections)
@click.argument("config", type=str)
@click.option("--seeds", help="Seeds to run, e.g. 42,43 (default: the config's seeds).")
@click.option("--algorithms", help="Algorithms (or the config's variants) to run, e.g. hasfl,random-budget "
                                   "(default: the config's).")
@click.option("--datasets", help="Datasets to run, e.g. emnist (default: the config's).")
@click.option("--out", type=click.Path(), help="Sweep folder (default: the config's sweep.out, else "
                                               "runs/<config name>, with -<8 hex> of the flags that change its "
                                               "cells, e.g. --rounds 5): one run directory per cell and sweep.json.")
@click.option("--force", is_flag=True, help="Run again the cells whose run directory holds another config "
                                            "(without it such a cell stops the sweep before anything runs).")
@click.option("--cells-per-gpu", type=int,
              help="Ray: run K CUDA cells at once on each GPU (each cell's task asks for 1/K of a GPU; default 8, "
                   "the best of 1, 2, 4, 8 on an H100: docs/gpu.md).")
@click.option("--quiet", is_flag=True, help="No progress bar (status lines still print).")
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
# every simulate flag but --config, --out, --force, --resume, --quiet and -v (the sweep's own) overrides all cells;
# --seed/--algorithm/--dataset name a single seed, algorithm or dataset
@run_options()
@user_errors
def sweep(config, seeds, algorithms, datasets, out, force, cells_per_gpu, quiet, verbose, no_coverage, download,
          fast_nondeterministic, **flags) -> None:
    """Run every (dataset, algorithm, seed) cell of the experiment CONFIG (e.g. configs/table3-allocation.yaml).

    Every `simulate` flag overrides the config for all cells (e.g. --rounds 5 --seeds 42 to try it small first).
    Cells run several at once as Ray tasks (each a local-backend run with --trainer-threads CPUs, and a GPU with
    --device cuda), or one after another with --backend local or without Ray. Finished cells are skipped and an
    interrupted cell resumes from its checkpoint, so running the same command again resumes a sweep. random-budget
    cells wait for the HAS-FL cell of their dataset and seed and take its post-warm-up average width as budget."""
    from hasfl_ray.engine.rundir import check_run_directory
    from hasfl_ray.sweep import check_conflicts, parse_list, plan_sweep  # the sweep package: only `sweep` loads it

    setup_logging(verbose)
    if out is not None and not out.strip():  # not the default folder in silence
        raise ConfigError(f"--out is {out!r}; expected a folder path (or no --out for the config's sweep.out, else "
                          "runs/<config name>)")
    seed_list = parse_list(seeds, "seeds", integer=True)
    algorithm_list = parse_list(algorithms, "algorithms")
    dataset_list = parse_list(datasets, "datasets")
    for single, many, name in ((flags.pop("seed"), seed_list, "seed"), (flags.pop("algorithm"), algorithm_list,
                               "algorithm"), (flags.pop("dataset"), dataset_list, "dataset")):
        if single is not None and many is not None:
            raise ConfigError(f"--{name} {single} and --{name}s are both given; expected one of them")
        if single is not None:
            if name == "seed":
                seed_list = [single]
            elif name == "algorithm":
                algorithm_list = [single]
            else:
                dataset_list = [single]
    apply_switches(flags, no_coverage, download, fast_nondeterministic)
    from hasfl_ray.config import parse_option_assignments  # (imported when a sweep runs: --help stays quick)

    options = parse_option_assignments(flags.pop("algo_opt", None))  # merged over the config's algorithm_options
    if options:
        flags["algorithm_options"] = options
    backend = flags.pop("backend")
    address, gpus_per_actor = flags.get("address"), flags.get("gpus_per_actor")
    overrides = {k: v for k, v in flags.items() if v is not None}
    plan = plan_sweep(config, overrides, dataset_list, algorithm_list, seed_list, out)
    check_run_directory(plan.out, "sweep folder")  # a file, a device, /proc, a read-only folder: before anything
    check_conflicts(plan, force)
    if backend not in (None, "local", "ray"):
        raise ConfigError(f"backend is {backend!r}; expected local or ray")
    if cells_per_gpu is not None and (isinstance(cells_per_gpu, bool) or cells_per_gpu < 1):
        raise ConfigError(f"--cells-per-gpu is {cells_per_gpu}; expected a positive number of cells sharing a GPU")
    if cells_per_gpu is not None and gpus_per_actor is not None:
        raise ConfigError(f"--cells-per-gpu {cells_per_gpu} and --gpus-per-actor {gpus_per_actor} both size a cell's "
                          "GPU share; expected one of them")
    from hasfl_ray.sweep.data_check import check_cell_data, ladder_notes

    check_cell_data(plan, force, cluster=address is not None)  # the clients the data can give, the partition: after
    # the flags (no data loaded for a refused flag), before Ray, the folder or any cell
    for line in ladder_notes(plan, force):  # a width of a cell's ladder that rounding deals no client
        click.echo(f"warning: {line}", err=True)
    executor = _executor(backend, address, gpus_per_actor, force, quiet, cells_per_gpu)
    from hasfl_ray.engine.signals import StopSignals
    from hasfl_ray.sweep.run import lock_sweep_folder

    try:
        if hasattr(executor, "check_fits"):  # a Ray cell asking for more than any node has would wait for ever
            executor.check_fits(plan.cells)
        lock = lock_sweep_folder(plan.out)  # a second sweep into the folder: one sentence before anything prints
    except ConfigError:
        executor.shutdown()
        raise
    stop = StopSignals()  # one SIGINT or SIGTERM stops the whole sweep, its running cells with a checkpoint
    refused: list = []  # the cells refused as they started (bad input), not failed while they ran
    statuses = _run(plan, executor, force, quiet, stop, lock, refused)
    failed = [name for name, status in statuses.items() if status in ("failed", "blocked") and name not in refused]
    click.echo(f"sweep folder: {plan.out} (sweep.json); report it with `hasfl-ray report {plan.out}`")
    stopped = [name for name, status in statuses.items() if status in STOPPED]
    if stop.requested() and stopped:  # (a signal once every cell had ended stopped nothing)
        click.echo(f"Stopped by {signal.Signals(stop.signal_number).name}: {len(stopped)} of {len(statuses)} cells "
                   f"did not finish ({', '.join(stopped)}); run the same command again to resume them (finished "
                   "cells are skipped, interrupted ones resume from their checkpoints)", err=True)
        sys.exit(128 + stop.signal_number)
    if refused:  # running them again refuses them again
        one = len(refused) == 1
        accept = "it accepts: change it" if one else "they accept: change them"
        click.echo(f"Error: {len(refused)} of {len(statuses)} cells {'was' if one else 'were'} refused as "
                   f"{'it' if one else 'they'} started, for bad input ({', '.join(refused)}: the sentence"
                   f"{'' if one else 's'} above); expected a config {accept}, then run the same command again "
                   "(finished cells are skipped)", err=True)
    if failed:
        click.echo(f"Error: {len(failed)} of {len(statuses)} cells did not finish ({', '.join(failed)}); run the same "
                   "command again to retry them (finished cells are skipped)", err=True)
    if failed or refused:
        sys.exit(1)


def _executor(backend, address, gpus_per_actor, force, quiet, cells_per_gpu=None):
    from hasfl_ray.sweep import LocalExecutor

    ray_options = address is not None or gpus_per_actor is not None or cells_per_gpu is not None
    backend = backend or default_backend(ray_options)
    if backend == "local":
        if ray_options:
            raise ConfigError("--address, --gpus-per-actor and --cells-per-gpu place Ray tasks, but backend is "
                              "'local'; expected --backend ray or none of them")
        return LocalExecutor(force=force, progress=not quiet)  # the running cell's own round bar below the sweep's
    require_ray()
    from hasfl_ray.simulation.sweep import RayExecutor  # imports Ray

    return RayExecutor(address=address, gpus_per_task=gpus_per_actor, force=force, cells_per_gpu=cells_per_gpu)


def _run(plan, executor, force, quiet, stop=None, lock=None, refused=None):
    from hasfl_ray.sweep import describe_result, rounds_done, run_sweep, sweep_summary_line

    what = f" ({plan.reproduces})" if plan.reproduces else ""
    grid = len(plan.datasets) * len(plan.algorithms) * len(plan.seeds)
    extra = f", plus {len(plan.cells) - grid} HAS-FL cell(s) random-budget waits for" if len(plan.cells) > grid else ""
    mode = executor.describe()
    click.echo(f"sweep {plan.config_file}{what}: {len(plan.cells)} cells ({len(plan.datasets)} dataset(s) x "
               f"{len(plan.algorithms)} algorithm(s) x {len(plan.seeds)} seed(s){extra}) into {plan.out}, {mode}")
    from hasfl_ray.sweep import RAY_RUN_ONLY
    unapplied = {k: plan.shared[k] for k in RAY_RUN_ONLY if plan.shared.get(k) is not None}
    if unapplied:  # the file's keys for `simulate --config` (one run on Ray): named, never dropped without a word
        keys = ", ".join(f"{k} {v!r}" for k, v in unapplied.items())
        verb = "apply" if len(unapplied) > 1 else "applies"
        click.echo(f"note: the config's {keys} {verb} to `simulate --config` only; every sweep cell runs the local "
                   "backend, one Ray task per cell, without them")
    # a live bar on a terminal only: elsewhere (a log file, a pipe) its \r frames would be one unreadable line, and
    # each cell's line below says the same (issue 45 item 5)
    live = not quiet and _terminal(sys.stderr)
    bar = tqdm(total=len(plan.cells), unit="cell", desc="sweep", dynamic_ncols=True, disable=not live)

    ended = [0]

    def on_result(cell, result):
        if refused is not None and result.get("refused"):
            refused.append(cell.name)
        ended[0] += 1
        bar.update(1)
        line = f"[{ended[0]}/{len(plan.cells)}] {describe_result(cell, result)}"
        tqdm.write(line) if live else click.echo(line)
        show_running()

    def show_running(cell=None):
        running = ["{} {}/{}".format(c.name, *rounds_done(c)) for c in plan.cells if c.status == "running"]
        bar.set_postfix_str(f"running: {', '.join(running)}" if running else "")

    try:
        statuses = run_sweep(plan, executor, on_result, force, show_running, stop, lock)
    except KeyboardInterrupt:  # a second signal: stopped at once (the running cells recorded interrupted)
        if stop is None or not stop.requested():
            raise
        statuses = {c.name: c.status for c in plan.cells}
    finally:
        bar.close()
    stopped = stop is not None and stop.requested() and any(s in STOPPED for s in statuses.values())
    ended = f"stopped by {signal.Signals(stop.signal_number).name}" if stopped else "done"
    click.echo(f"sweep {ended}: {sweep_summary_line(statuses)}")
    return statuses


def _terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False
