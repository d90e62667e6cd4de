"""Running a planned sweep: each cell to its end (skipped, resumed or started), through an executor that runs cells
one after another here (:class:`LocalExecutor`) or elsewhere (:class:`hasfl_ray.simulation.sweep.RayExecutor`, one
Ray task per cell), dependants after the cell they wait for, and the status lines of the cells that end. One sweep
writes a folder at a time (a lock on it), and one SIGINT or SIGTERM stops the whole sweep: the running cells stop at
the end of their current client with a checkpoint (``interrupted``; the next run of the sweep resumes them)."""

from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Tuple

from hasfl_ray.analysis.report import read_run, write_analysis
from hasfl_ray.engine import Engine
from hasfl_ray.config import RunConfig
from hasfl_ray.engine.rundir import RunLock
from hasfl_ray.engine.signals import StopSignals
from hasfl_ray.errors import ConfigError, RunInterrupted, progress_phrase
from hasfl_ray.sweep.plan import FINISHED, Cell, Sweep
from hasfl_ray.sweep.state import cell_state, read_summary, reuse_finished_run, write_sweep_json


def execute_cell(cell: Mapping[str, Any], force: bool = False, progress: bool = False) -> Dict[str, Any]:
    """Run one cell to its end (skip, resume from its checkpoint, or start it); returns
    ``{name, status, summary, from_round, wall_s}``. Raises what the run raises."""
    start = time.perf_counter()
    state = cell_state(cell, force)
    run_dir = cell["dir"]
    if state == "finished":  # its summary.json read and checked as cell_state read it
        return {"name": cell["name"], "status": "skipped",
                "summary": read_summary(run_dir, "summary.json of the finished cell"), "from_round": None,
                "wall_s": 0.0}
    config = RunConfig.from_dict(cell["values"], f"sweep cell {cell['name']}", foreign="drop").resolved()
    resume = state == "interrupted"
    # a redo is simulate --force's start: the earlier run set aside (engine/earlier_run.py), back if it is refused
    engine = Engine(config, out_dir=run_dir, progress=progress, resume=resume, force=state == "redo")
    engine.prepare()
    from_round = len(engine.history)
    summary = engine.run()
    write_cell_analysis(run_dir)
    return {"name": cell["name"], "status": "resumed" if resume else "done", "summary": summary,
            "from_round": from_round, "wall_s": time.perf_counter() - start}


def run_cell(cell: Mapping[str, Any], force: bool = False, progress: bool = False) -> Dict[str, Any]:
    """:func:`execute_cell`'s result, or how the cell ended otherwise: ``interrupted`` (a signal stopped it after a
    checkpoint; the next run of the sweep resumes it) or ``failed`` (one line), so one cell's failure never stops
    the others."""
    try:
        return execute_cell(cell, force, progress)
    except RunInterrupted as stop:
        return interrupted_result(cell["name"], stop.signal_number, stop.rounds_done)
    except Exception as error:
        return failed_result(cell["name"], error, cell["dir"])


def failed_result(name: str, error: BaseException, run_dir: Optional[str] = None) -> Dict[str, Any]:
    """The result of a cell that raised: its one line (naming the cell's own log.txt, ``run_dir``), and whether it
    was refused (bad input, a ConfigError: the same command fails the same way until its config changes) rather than
    failed while it ran."""
    return {"name": name, "status": "failed", "error": failure_message(error, run_dir),
            "refused": isinstance(error, ConfigError)}


def interrupted_result(name: str, signal_number: Optional[int], rounds_done: Optional[int]) -> Dict[str, Any]:
    """The result of a cell a signal stopped (``rounds_done`` None where unknown: a Ray task cancelled)."""
    return {"name": name, "status": "interrupted", "signal": signal_number, "rounds_done": rounds_done}


def write_cell_analysis(run_dir: str) -> None:
    """The Table 5 analysis block in the finished run's summary.json (runs with H̃ estimates only)."""
    write_analysis(read_run(run_dir))


def failure_message(error: BaseException, run_dir: Optional[str] = None) -> str:
    """One line for a failed cell: the sentence of a ConfigError, else the exception and where it was raised; the
    ``RUN/log.txt`` a run's sentence names (a trainer's or a plug-in's traceback) is the cell's, ``run_dir``."""
    if run_dir is not None:
        return failure_message(error).replace("RUN/log.txt", os.path.join(run_dir, "log.txt"))
    if isinstance(error, ConfigError):
        return str(error)
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


# ------------------------------------------------------------------------------------------------------ executors

class Executor(Protocol):
    """What runs a sweep's cells: :class:`LocalExecutor` here, :class:`hasfl_ray.simulation.sweep.RayExecutor` as
    Ray tasks. A cell's result is :func:`execute_cell`'s, or ``{name, status: "failed", error}`` (one line) for a
    cell that raised: one failed cell never stops the others."""

    def submit(self, cell: Cell) -> None:
        """Start ``cell`` (or queue it until there is room)."""

    def wait(self, on_idle: Optional[Callable[[], None]] = None) -> Tuple[str, Dict[str, Any]]:
        """(name, result) of the next submitted cell to end; ``on_idle`` may run now and then until then."""

    def interrupt(self) -> None:
        """Ask the running cells to stop at the end of their current client and write a checkpoint (a signal stopped
        the sweep); :meth:`wait` then hands back their ``interrupted`` results."""

    def shutdown(self) -> None:
        """Stop what still runs and release what the executor holds (called once, at the end of the sweep)."""

    def describe(self) -> str:
        """How cells run, for the sweep's first line."""


class LocalExecutor:
    """Runs cells one after another in this process (``--backend local``, or where Ray is not installed)."""

    def __init__(self, force: bool = False, progress: bool = False):
        self.force, self.progress = force, progress
        self.queue: List[Cell] = []
        self.interrupted = False

    def describe(self) -> str:
        """How cells run, for the sweep's first line."""
        return "one cell after another"

    def submit(self, cell: Cell) -> None:
        self.queue.append(cell)

    def wait(self, on_idle: Optional[Callable[[], None]] = None) -> Tuple[str, Dict[str, Any]]:
        cell = self.queue.pop(0)
        if self.interrupted:  # queued, never started: the next run of the sweep starts it
            return cell.name, {"name": cell.name, "status": "pending"}
        return cell.name, run_cell(cell.to_dict(), self.force, self.progress)

    def interrupt(self) -> None:
        self.interrupted = True  # the cell running in this process saw the signal itself; the queued ones wait

    def shutdown(self) -> None:
        pass


# ------------------------------------------------------------------------------------------------------ the runner

def lock_sweep_folder(out: str) -> RunLock:
    """The sweep folder's lock (made if missing), held while the sweep runs; ConfigError (one sentence) while
    another sweep holds it."""
    return RunLock(out, "sweep folder", "sweep").acquire()


def run_sweep(sweep: Sweep, executor: Executor,
              on_result: Callable[[Cell, Dict[str, Any]], None] = lambda c, r: None,
              force: bool = False, on_start: Callable[[Optional[Cell]], None] = lambda c: None,
              stop: Optional[StopSignals] = None, lock: Optional[RunLock] = None) -> Dict[str, str]:
    """Run every cell through ``executor`` (``submit(cell)``, ``wait() -> (name, result)``), dependants after the
    cell they wait for; finished cells are skipped here without reaching the executor. Returns name -> status.

    The sweep's folder is locked while it runs (another sweep into it is refused in one sentence, ConfigError):
    ``lock`` is :func:`lock_sweep_folder`'s when the caller took it first (before printing anything), released here.
    While it runs, ``stop`` (a :class:`StopSignals`, entered here) takes SIGINT and SIGTERM: the first one stops the
    whole sweep (no cell starts after it, the running ones stop with a checkpoint as ``interrupted``, cells not
    started stay ``pending``) and the caller reads ``stop.signal_number``; a second one raises KeyboardInterrupt
    at once, the running cells then recorded ``interrupted``."""
    stop = stop if stop is not None else StopSignals()
    pending = list(sweep.cells)
    running = set()
    interrupting = []  # [True] once the running cells were asked to stop

    def finish(cell: Cell, result: Dict[str, Any]) -> None:
        cell.status = result["status"]
        cell.message = result.get("error", "")
        write_sweep_json(sweep)
        on_result(cell, result)

    def check_stop() -> None:
        if stop.requested() and running and not interrupting:
            interrupting.append(True)
            executor.interrupt()

    def idle() -> None:
        on_start(None)
        check_stop()

    try:
        lock = lock or lock_sweep_folder(sweep.out)  # before sweep.json is written
        write_sweep_json(sweep)
        with stop:
            while pending or running:
                for cell in list(pending):
                    if stop.requested():
                        break
                    dependency = sweep.cell(cell.depends_on) if cell.depends_on else None
                    if dependency is not None and dependency.status in ("failed", "blocked"):
                        pending.remove(cell)
                        finish(cell, {"status": "blocked", "error": f"the HAS-FL cell it takes its budget from, "
                                                                    f"{dependency.name}, did not finish"})
                        continue
                    if dependency is not None and dependency.status not in FINISHED:
                        continue
                    pending.remove(cell)
                    try:
                        state = cell_state(cell.to_dict(), force)
                    except Exception as error:
                        finish(cell, failed_result(cell.name, error, cell.dir))
                        continue
                    if state == "finished":
                        finish(cell, execute_cell(cell.to_dict(), force))
                        continue
                    reused = reuse_finished_run(cell.to_dict(), sweep.out) if state == "new" else None
                    if reused is not None:
                        finish(cell, reused)
                        continue
                    cell.status = "running"
                    executor.submit(cell)
                    running.add(cell.name)
                    on_start(cell)
                check_stop()
                if running:
                    name, result = executor.wait(on_idle=idle)
                    running.discard(name)
                    if result["status"] == "interrupted" and not stop.requested():  # a cell saw the signal first
                        stop.signal_number = result.get("signal") or signal.SIGINT
                    finish(sweep.cell(name), result)
                elif pending and not stop.requested():  # every pending cell waits for one that can no longer run
                    raise RuntimeError("sweep dependencies form a cycle")  # not reachable from plan_sweep
                elif pending:
                    break  # stopped: the cells not started stay pending
    finally:
        try:
            executor.shutdown()
        finally:
            if lock is not None:
                for cell in sweep.cells:
                    if cell.status == "running":  # stopped at once (a second signal) or an error of the sweep's own
                        started = os.path.exists(os.path.join(cell.dir, "config.yaml"))
                        cell.status = "interrupted" if started else "pending"
                write_sweep_json(sweep)
                lock.release()
    return {c.name: c.status for c in sweep.cells}


# ------------------------------------------------------------------------------------------------- status text

def describe_result(cell: Cell, result: Mapping[str, Any]) -> str:
    """One status line for a cell that ended."""
    status = result["status"]
    if status == "failed":
        return f"{cell.name}: failed: {result['error']}"
    if status == "blocked":
        return f"{cell.name}: blocked: {result['error']}"
    if status == "pending":
        return f"{cell.name}: not started (the next run of the sweep starts it)"
    if status == "interrupted":
        rounds = result.get("rounds_done")
        after = f" after {progress_phrase(rounds, cell.values.get('mode') or 'sync')}" if rounds is not None else ""
        return f"{cell.name}: interrupted{after} (the next run of the sweep resumes it from its checkpoint)"
    summary = result.get("summary") or {}
    numbers = (f"best {summary.get('best_accuracy', float('nan')):.4f}, final "
               f"{summary.get('final_accuracy', float('nan')):.4f}, avg p {summary.get('avg_p', float('nan')):.3f}")
    if status == "skipped":
        return f"{cell.name}: skipped (finished earlier: {numbers})"
    if status == "reused":
        return f"{cell.name}: reused the finished run {result.get('source', '')} (same config: {numbers})"
    unit = "server update" if cell.values.get("mode") == "async" else "round"  # an async history counts updates
    resumed = f" (resumed after {unit} {result['from_round']})" if status == "resumed" else ""
    return f"{cell.name}: {status} in {result.get('wall_s', 0.0):.1f} s{resumed}: {numbers}"


def sweep_summary_line(statuses: Mapping[str, str]) -> str:
    """``3 done, 1 skipped``: how many cells ended with each status."""
    counts: Dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
