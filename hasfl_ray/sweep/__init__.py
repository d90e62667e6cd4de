"""Sweeps: every (dataset, algorithm, seed) cell of an experiment config, run once.

- :mod:`~hasfl_ray.sweep.plan`: the cells of a sweep config (:func:`plan_sweep`, :class:`Cell`, :class:`Sweep`);
- :mod:`~hasfl_ray.sweep.state`: what the sweep's folder holds (each cell's state, a finished run another sweep can
  reuse, ``OUT/sweep.json``);
- :mod:`~hasfl_ray.sweep.run`: running the cells (:func:`run_sweep` through an :class:`Executor`, one cell at a time
  here with :class:`LocalExecutor`) and their status lines.

Cells are written to ``OUT/<dataset>-<algorithm>-seed<seed>/`` (a normal run directory), and ``OUT/sweep.json``
describes them. A cell whose summary.json exists is skipped; a cell with a run directory but no summary (an
interrupted run) resumes from its checkpoint. A random-budget cell waits for the HAS-FL cell of its dataset and seed
and takes that run's post-warm-up average width as its budget (``budget_from``).

This package never imports Ray: cells run one after another in this process, or through an executor such as
:class:`hasfl_ray.simulation.sweep.RayExecutor`, which runs each cell as a Ray task. ``simulate --config`` reads one
run of a sweep config with :func:`hasfl_ray.config.single_run_values`, without this package.
"""

from hasfl_ray.config import SWEEP_FIELDS, SWEEP_KEY, single_run_values, split_sweep_config
from hasfl_ray.sweep.plan import FINISHED, RAY_RUN_ONLY, Cell, Sweep, parse_list, plan_sweep
from hasfl_ray.sweep.run import (Executor, LocalExecutor, describe_result, execute_cell, failure_message, run_sweep,
                                 sweep_summary_line, write_cell_analysis)
from hasfl_ray.sweep.state import (cell_differences, cell_state, check_conflicts, conflict_error, read_summary,
                                   reuse_finished_run, rounds_done, write_sweep_json)

__all__ = [
    "SWEEP_FIELDS", "SWEEP_KEY", "single_run_values", "split_sweep_config",
    "FINISHED", "RAY_RUN_ONLY", "Cell", "Sweep", "parse_list", "plan_sweep",
    "Executor", "LocalExecutor", "describe_result", "execute_cell", "failure_message", "run_sweep",
    "sweep_summary_line", "write_cell_analysis",
    "cell_differences", "cell_state", "check_conflicts", "conflict_error", "read_summary", "reuse_finished_run",
    "rounds_done", "write_sweep_json",
]
