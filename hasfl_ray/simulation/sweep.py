"""Sweep cells as Ray tasks: each cell a local-backend run inside one task that asks for the resources the run
needs (``trainer_threads`` CPUs, a GPU or ``--gpus-per-actor`` of one for a CUDA run). Ray queues the tasks that do
not fit, so as many cells run at once as the cluster has room for. The orchestration (cells, dependencies, skip and
resume) is the package :mod:`hasfl_ray.sweep`; this is only its executor."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Dict, Optional, Tuple

import ray

from hasfl_ray.errors import ConfigError
from hasfl_ray.front_end import command_line, on_command_line
from hasfl_ray.simulation import connect_ray
from hasfl_ray.sweep.plan import Cell
from hasfl_ray.sweep.run import interrupted_result, run_cell


def _run_cell(cell: Dict[str, Any], force: bool, cwd: str, from_command_line: bool = False) -> Dict[str, Any]:
    """The body of a cell's task: the cell's run, in the driver's working directory (relative paths agree), its
    sentences in the words of the driver's front end (hasfl_ray/front_end.py: a task does not inherit it)."""
    os.chdir(cwd)
    with command_line() if from_command_line else contextlib.nullcontext():
        return run_cell(cell, force, progress=False)


#: CUDA cells sharing one GPU when neither --cells-per-gpu nor --gpus-per-actor says: the best of K = 1, 2, 4, 8
#: measured on an NVIDIA H100 (2026-11-27, benchmarks/bench_cells_per_gpu.py, EMNIST sample cells): a steady round
#: slows 1.38x, 2.81x, 4.89x at K = 2, 4, 8, so K cells finish 1.45x, 1.42x, 1.64x the work of one; 385, 608, 838
#: and 1,075 four-round cells per hour (benchmarks/RESULTS.md).
DEFAULT_CELLS_PER_GPU = 8


class RayExecutor:
    """Submits cells as Ray tasks to the running Ray instance (``ray.init`` here when none runs: ``address`` joins a
    cluster, None starts one on this machine) and hands back results as they finish (a
    :class:`hasfl_ray.sweep.run.Executor`)."""

    def __init__(self, address: Optional[str] = None, gpus_per_task: Optional[float] = None, force: bool = False,
                 cells_per_gpu: Optional[int] = None):
        self.started = connect_ray(address, {})  # one sentence when Ray cannot start or the address does not answer
        #: whether the first line names a CUDA cell's GPU share: given, or a cluster with GPUs (not a CPU sweep's)
        self.names_share = cells_per_gpu is not None or gpus_per_task is not None or \
            ray.cluster_resources().get("GPU", 0) > 0
        if cells_per_gpu is None and gpus_per_task is None:
            cells_per_gpu = DEFAULT_CELLS_PER_GPU
        if cells_per_gpu is not None:  # K cells share each GPU: each asks for 1/K of one
            gpus_per_task = 1.0 / cells_per_gpu
        self.gpus_per_task, self.force = gpus_per_task, force
        self.remote = ray.remote(_run_cell)
        self.refs: Dict[Any, str] = {}
        self.interrupted = False
        self.dirs: Dict[str, str] = {}  # cell name -> run directory

    def resources(self, cell: Cell) -> Tuple[int, float]:
        """(num_cpus, num_gpus) of a cell's task: its trainer threads, and a GPU (or the given fraction) when it
        runs on CUDA (device cuda, or auto on a cluster that has GPUs)."""
        values = cell.values
        cpus = int(values.get("trainer_threads") or 1)
        device = str(values.get("device") or "auto")
        cuda = device.startswith("cuda") or (device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
        gpus = (self.gpus_per_task if self.gpus_per_task is not None else 1.0) if cuda else 0.0
        return cpus, gpus

    def check_fits(self, cells) -> None:
        """One sentence, before any cell is submitted, for a cell whose task asks for more CPUs or GPUs than the
        largest node of the cluster has: Ray would queue it for ever."""
        nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
        most_cpus = max((node.get("CPU", 0) for node in nodes), default=0)
        most_gpus = max((node.get("GPU", 0) for node in nodes), default=0)
        for cell in cells:
            cpus, gpus = self.resources(cell)
            if cpus > most_cpus:
                raise ConfigError(f"sweep cell {cell.name} asks for trainer_threads {cpus} but the largest node of the "
                                  f"Ray cluster has {most_cpus:g} CPUs; expected at most {most_cpus:g} (a task asking "
                                  "for more would wait for ever)")
            if gpus > most_gpus:
                raise ConfigError(f"sweep cell {cell.name} asks for {gpus:g} GPU but the largest node of the Ray "
                                  f"cluster has {most_gpus:g}; expected --device cpu, or a cluster with GPUs")

    def describe(self) -> str:
        """How cells run, for the sweep's first line."""
        gpus = self.gpus_per_task if self.gpus_per_task is not None else 1.0
        share = f"; a CUDA cell takes {gpus:g} GPU ({round(1 / gpus)} per GPU)" if gpus < 1 and self.names_share else ""
        return f"one Ray task per cell{share}"

    def submit(self, cell: Cell) -> None:
        cpus, gpus = self.resources(cell)
        ref = self.remote.options(num_cpus=cpus, num_gpus=gpus, name=f"sweep:{cell.name}", max_retries=0) \
            .remote(cell.to_dict(), self.force, os.getcwd(), on_command_line())
        self.refs[ref] = cell.name
        self.dirs[cell.name] = cell.dir

    def wait(self, on_idle: Optional[Callable[[], None]] = None, poll_s: float = 2.0) -> Tuple[str, Dict[str, Any]]:
        """The next cell to end and its result; ``on_idle`` runs every ``poll_s`` seconds until then."""
        done: list = []
        while not done:
            done, _ = ray.wait(list(self.refs), num_returns=1, timeout=poll_s)
            if not done and on_idle is not None:
                on_idle()
        name = self.refs.pop(done[0])
        try:
            return name, ray.get(done[0])
        except ray.exceptions.TaskCancelledError:  # stopped by interrupt() before its run took the signal
            if self.interrupted and os.path.exists(os.path.join(self.dirs[name], "config.yaml")):
                return name, interrupted_result(name, None, None)
            if self.interrupted:  # still queued: it never started
                return name, {"name": name, "status": "pending"}
            return name, {"name": name, "status": "failed", "error": "its Ray task was cancelled"}
        except Exception as error:  # the worker died (out of memory, a lost node): the cell failed
            return name, {"name": name, "status": "failed", "error": f"its Ray task failed ({type(error).__name__})"}

    def interrupt(self) -> None:
        """Cancel every cell's task without force: Ray raises the interrupt of SIGINT in the task, which the
        cell's run takes as a stop at the end of its current client, with a checkpoint (a task still queued never
        starts)."""
        self.interrupted = True
        for ref in list(self.refs):
            ray.cancel(ref, force=False)

    def shutdown(self) -> None:
        for ref in list(self.refs):
            ray.cancel(ref, force=True)
        self.refs.clear()
        if self.started:
            ray.shutdown()
