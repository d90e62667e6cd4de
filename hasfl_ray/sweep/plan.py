"""Sweeps: every (dataset, algorithm, seed) cell of an experiment config, run once.

A sweep config is a run config (RunConfig keys: the shared protocol) with a ``sweep:`` block naming the cells::

    sweep:
      reproduces: Table 3 of the paper          # free text, shown in sweep.json and reports
      datasets: [cifar10, emnist]               # or a top-level `dataset:` key for one dataset
      algorithms: [hasfl, fjord, uniform, hasfl-coverage-off]
      seeds: [42, 43, 44]
      per_dataset:                              # RunConfig keys for one dataset, over the shared ones
        cifar10: {local_epochs: 5}
      variants:                                 # extra algorithm names: the RunConfig keys each sets
        hasfl-coverage-off: {algorithm: hasfl, coverage: false}
      out: runs/table3                          # default --out (default: runs/<config file name>)
    rounds: 200                                 # shared protocol: plain RunConfig keys
    ...

A cell's config is: shared keys, then its dataset's ``per_dataset`` keys, then its variant's keys, then the
command-line overrides. Cells are written to ``OUT/<dataset>-<algorithm>-seed<seed>/`` (a normal run directory),
and ``OUT/sweep.json`` describes them. A cell whose summary.json exists is skipped; a cell with a run directory but
no summary (an interrupted run) resumes from its checkpoint. A random-budget cell waits for the HAS-FL cell of its
dataset and seed and takes that run's post-warm-up average width as its budget (``budget_from``).

This module never imports Ray: cells run one after another in this process, or through an executor such as
:class:`hasfl_ray.simulation.sweep.RayExecutor`, which runs each cell as a Ray task.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from hasfl_ray.engine.rundir import check_clearable, clear_run_directory
from hasfl_ray.errors import ConfigError
from hasfl_ray.files import atomic_write

SWEEP_KEY = "sweep"
SWEEP_FIELDS = ("reproduces", "datasets", "algorithms", "seeds", "per_dataset", "variants", "out")
#: Options of a single Ray run that a sweep cell (the local backend inside one Ray task) does not take.
RAY_RUN_ONLY = ("actors", "address", "fault_inject", "gpus_per_actor")
#: Statuses of a finished cell (its dependants may start).
FINISHED = ("done", "resumed", "skipped", "reused")


@dataclass
class Cell:
    """One run of a sweep.

    Attributes:
        name: ``<dataset>-<algorithm>-seed<seed>``, also the run directory's name under the sweep's folder.
        dataset, algorithm, seed: the cell's coordinates (``algorithm`` as the sweep names it: an algorithm or a
            variant).
        dir: the run directory.
        values: the RunConfig keys of the run (unresolved).
        depends_on: the name of the cell that must finish first (random-budget's HAS-FL cell), or None.
        status: pending, running, done, resumed, skipped, reused (copied from a finished run of another sweep
            with the same config), failed or blocked.
        message: why a failed or blocked cell did not finish.
    """

    name: str
    dataset: str
    algorithm: str
    seed: int
    dir: str
    values: Dict[str, Any]
    depends_on: Optional[str] = None
    status: str = "pending"
    message: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class Sweep:
    """A planned sweep: its cells in run order and what sweep.json records about it."""

    config_file: str
    out: str
    reproduces: str
    datasets: List[str]
    algorithms: List[str]
    seeds: List[int]
    shared: Dict[str, Any]
    overrides: Dict[str, Any]
    cells: List[Cell] = field(default_factory=list)

    def cell(self, name: str) -> Cell:
        return next(c for c in self.cells if c.name == name)

    def describe(self) -> Dict[str, Any]:
        return {"config": self.config_file, "reproduces": self.reproduces, "out": self.out,
                "datasets": self.datasets, "algorithms": self.algorithms, "seeds": self.seeds,
                "protocol": self.shared, "overrides": self.overrides,
                "cells": [{k: v for k, v in c.to_dict().items() if k != "values"} | {"config": c.values}
                          for c in self.cells]}


# ---------------------------------------------------------------------------------------------------------- config

def split_sweep_config(values: Mapping[str, Any], source: str) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
    """(the ``sweep:`` block or None, the shared RunConfig keys) of a config file's mapping; one sentence when the
    block is malformed."""
    shared = {k: v for k, v in values.items() if k != SWEEP_KEY}
    if SWEEP_KEY not in values:
        return None, shared
    block = values[SWEEP_KEY]
    if not isinstance(block, dict):
        raise ConfigError(f"{source} has a sweep block of type {type(block).__name__}; expected a mapping with keys "
                          + ", ".join(SWEEP_FIELDS))
    block = {str(k).replace("-", "_"): v for k, v in block.items()}
    unknown = sorted(set(block) - set(SWEEP_FIELDS))
    if unknown:
        raise ConfigError(f"{source} has unknown sweep key {unknown[0]!r}; expected one of {', '.join(SWEEP_FIELDS)}")
    for name in ("per_dataset", "variants"):
        mapping = block.get(name) or {}
        if not isinstance(mapping, dict) or not all(isinstance(v, dict) for v in mapping.values()):
            raise ConfigError(f"{source} has sweep.{name} {mapping!r}; expected a mapping of names to mappings of "
                              "config keys")
        block[name] = {str(k): {str(kk).replace("-", "_"): vv for kk, vv in v.items()} for k, v in mapping.items()}
    return block, shared


def single_run_values(values: Mapping[str, Any], flags: Dict[str, Any], source: str) -> Dict[str, Any]:
    """The RunConfig keys ``simulate --config`` takes from a config file: a plain one as it is; a sweep config's
    shared keys, then the ``per_dataset`` keys of the dataset run (``--dataset``, else the sweep's first), then the
    keys of the variant ``--algorithm`` names, with the sweep's first algorithm and seed as defaults. An
    ``--algorithm`` flag naming a variant is replaced in ``flags`` by the algorithm the variant runs."""
    block, shared = split_sweep_config(values, source)
    if block is None:
        return shared
    datasets = _as_list(block.get("datasets"), "datasets", source) or [shared.get("dataset", "digits")]
    algorithms = _as_list(block.get("algorithms"), "algorithms", source) or [shared.get("algorithm", "hasfl")]
    seeds = _as_list(block.get("seeds"), "seeds", source) or [shared.get("seed", 42)]
    dataset = flags.get("dataset") or datasets[0]
    algorithm = flags.get("algorithm") or algorithms[0]
    result = {**shared, "dataset": dataset, "seed": seeds[0],
              **block["per_dataset"].get(dataset, {})}
    variant = block["variants"].get(algorithm)
    result.update(variant if variant is not None else {"algorithm": algorithm})
    if variant is not None and flags.get("algorithm") == algorithm:
        flags["algorithm"] = result.get("algorithm", "hasfl")
    return result


def _as_list(value: Any, name: str, source: str) -> List[Any]:
    if value is None:
        return []
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{source} has sweep.{name} {value!r}; expected a non-empty list")
    return value


def parse_list(text: Optional[str], name: str, integer: bool = False) -> Optional[List[Any]]:
    """``42,43,44`` (commas or spaces) as a list; one sentence when empty or (with ``integer``) not integers."""
    if text is None:
        return None
    items = [item for item in text.replace(",", " ").split() if item]
    if not items:
        raise ConfigError(f"--{name} is {text!r}; expected a comma-separated list such as "
                          + ("42,43,44" if integer else "hasfl,random-budget"))
    if integer:
        try:
            values = [int(item) for item in items]
        except ValueError:
            raise ConfigError(f"--{name} is {text!r}; expected a comma-separated list of non-negative integers "
                              "such as 42,43,44") from None
        if any(v < 0 for v in values):
            raise ConfigError(f"--{name} is {text!r}; expected non-negative integers such as 42,43,44")
        return list(dict.fromkeys(values))
    return list(dict.fromkeys(items))


def plan_sweep(config_file: str, overrides: Mapping[str, Any], datasets: Optional[Sequence[str]] = None,
               algorithms: Optional[Sequence[str]] = None, seeds: Optional[Sequence[int]] = None,
               out: Optional[str] = None) -> Sweep:
    """The cells of ``config_file`` (a sweep config, or a plain config: one dataset, algorithm and seed), narrowed
    by ``datasets``/``algorithms``/``seeds`` and with ``overrides`` (RunConfig keys) applied to every cell.

    Raises ConfigError (one sentence) for a missing or malformed file, an unknown algorithm, dataset or key, or a
    cell whose config is invalid."""
    from hasfl_ray.engine.config import RunConfig, load_yaml_config
    from hasfl_ray.registry import is_spec, lookup, registered, spec_label

    DATASETS = registered("dataset")

    if not os.path.isfile(config_file):
        raise ConfigError(f"config file {config_file!r} does not exist; expected a sweep YAML such as "
                          "configs/table3-allocation.yaml")
    source = f"config file {config_file!r}"
    block, shared = split_sweep_config(load_yaml_config(config_file), source)
    block = block or {"per_dataset": {}, "variants": {}}
    RunConfig.from_dict(shared, source)  # unknown keys and bad values refused before anything runs
    for name in ("dataset", "algorithm", "seed"):
        if name in overrides:
            raise ValueError(f"override {name!r} belongs in datasets/algorithms/seeds")
    for key in ("actors", "fault_inject"):  # --address and --gpus-per-actor place the cells' tasks instead
        if overrides.get(key) is not None:
            raise ConfigError(f"--{key.replace('_', '-')} is {overrides[key]!r} but sweep cells run the local "
                              "backend, one Ray task per cell; expected no Ray actor options")
    variants = block["variants"]
    for name, keys in variants.items():
        RunConfig.from_dict({**shared, **keys}, f"{source} sweep variant {name!r}")
    for name, keys in block["per_dataset"].items():
        if name not in DATASETS:
            raise ConfigError(f"{source} has sweep.per_dataset entry {name!r}; expected a dataset, one of "
                              + ", ".join(DATASETS))
        RunConfig.from_dict({**shared, **keys, "dataset": name}, f"{source} sweep.per_dataset.{name}")

    datasets = list(datasets or _as_list(block.get("datasets"), "datasets", source) or
                    [shared.get("dataset", "digits")])
    algorithms = list(algorithms or _as_list(block.get("algorithms"), "algorithms", source) or
                      [shared.get("algorithm", "hasfl")])
    seeds = list(seeds or _as_list(block.get("seeds"), "seeds", source) or [shared.get("seed", 42)])
    for dataset in datasets:
        if is_spec(dataset):
            lookup("dataset", dataset)  # a plug-in: one sentence for a missing file or class
        elif dataset not in DATASETS:
            raise ConfigError(f"dataset {dataset!r} is not known; expected one of {', '.join(DATASETS)}, or a "
                              "plug-in FILE.py:Class / MODULE:Class")
    for algorithm in algorithms:
        if is_spec(algorithm) and algorithm not in variants:
            lookup("algorithm", algorithm)  # a plug-in: one sentence for a missing file or class
        elif algorithm not in registered("algorithm") and algorithm not in variants:
            raise ConfigError(f"algorithm {algorithm!r} is not known; expected one of "
                              + ", ".join(list(registered("algorithm")) + list(variants))
                              + ", or a plug-in FILE.py:Class / MODULE:Class")
    for seed in seeds:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"{source} has seed {seed!r}; expected non-negative integers such as 42, 43, 44")
    stem = os.path.splitext(os.path.basename(config_file))[0]
    out = out or block.get("out") or os.path.join("runs", stem)
    overrides = {k: v for k, v in overrides.items() if k not in ("address", "gpus_per_actor")}
    sweep = Sweep(config_file=config_file, out=out, reproduces=str(block.get("reproduces", "")).strip(),
                  datasets=datasets, algorithms=algorithms, seeds=seeds, shared=shared, overrides=dict(overrides))

    def make(dataset: str, algorithm: str, seed: int) -> Cell:
        values = {**shared, **block["per_dataset"].get(dataset, {}),
                  **variants.get(algorithm, {"algorithm": algorithm}), **overrides,
                  "dataset": dataset, "seed": seed, "backend": "local"}
        if "algorithm_options" in overrides and isinstance(shared.get("algorithm_options"), dict):
            values["algorithm_options"] = {**shared["algorithm_options"], **overrides["algorithm_options"]}
        for key in RAY_RUN_ONLY:
            values.pop(key, None)
        name = f"{spec_label(dataset)}-{spec_label(algorithm)}-seed{seed}"  # a plug-in: its class name
        RunConfig.from_dict(values, f"sweep cell {name}")
        return Cell(name=name, dataset=dataset, algorithm=algorithm, seed=seed, dir=os.path.join(out, name),
                    values=values)

    cells = [make(d, a, s) for d in datasets for a in algorithms for s in seeds]
    # random-budget waits for the HAS-FL cell of its dataset and seed (brought along when the sweep lacks it)
    for cell in list(cells):
        if cell.values["algorithm"] != "random-budget" or cell.values.get("budget") is not None \
                or cell.values.get("budget_from") is not None:
            continue
        coverage = cell.values.get("coverage", True)
        partners = [c for c in cells if c.dataset == cell.dataset and c.seed == cell.seed
                    and c.values["algorithm"] == "hasfl" and c.values.get("coverage", True) == coverage]
        partners.sort(key=lambda c: c.algorithm != "hasfl")
        if partners:
            partner = partners[0]
        else:
            partner = make(cell.dataset, "hasfl", cell.seed)
            partner.values["coverage"] = coverage
            cells.insert(cells.index(cell), partner)
        cell.depends_on = partner.name
        cell.values["budget_from"] = partner.dir
    sweep.cells = cells
    return sweep


# ------------------------------------------------------------------------------------------------- one cell's state

def _stored(run_dir: str) -> Optional[Dict[str, Any]]:
    from hasfl_ray.engine.checkpoint import stored_config

    return stored_config(run_dir, None)


def cell_differences(cell: Mapping[str, Any]) -> List[str]:
    """Result-affecting fields where the cell's run directory was written with another config (``budget_from`` is
    compared through the budget it resolves to, so the spelling of the folder does not matter)."""
    from hasfl_ray.engine.checkpoint import config_differences
    from hasfl_ray.engine.config import RunConfig

    stored = _stored(cell["dir"])
    if stored is None:
        return []
    config = RunConfig.from_dict(cell["values"], f"sweep cell {cell['name']}").resolved()
    return [d for d in config_differences(stored, config) if not d.startswith("budget_from ")]


def conflict_error(cell: Mapping[str, Any], differences: List[str]) -> ConfigError:
    return ConfigError(f"sweep cell {cell['name']!r} already holds a run with another config ("
                       f"{'; '.join(differences[:3])}); expected the same overrides as before, another --out, or "
                       "--force to run it again")


def cell_state(cell: Mapping[str, Any], force: bool = False) -> str:
    """``finished`` (summary.json with the same config), ``interrupted`` (a run directory without a summary),
    ``new``, or ``redo`` (another config, with ``force``); ConfigError for another config without ``force``."""
    run_dir = cell["dir"]
    if not os.path.exists(os.path.join(run_dir, "config.yaml")):
        return "new"
    differences = cell_differences(cell)
    if differences:
        if not force:
            raise conflict_error(cell, differences)
        return "redo"
    return "finished" if os.path.exists(os.path.join(run_dir, "summary.json")) else "interrupted"


def check_conflicts(sweep: Sweep, force: bool = False) -> None:
    """Refuse (one sentence) a sweep whose cell folders hold runs of another config, or (with ``force``) a cell
    folder to run again that holds anything a run does not write, before anything runs (cells whose budget comes
    from a HAS-FL cell not finished yet are checked when they start)."""
    for cell in sweep.cells:
        if cell.depends_on and not os.path.exists(os.path.join(sweep.cell(cell.depends_on).dir, "summary.json")):
            continue
        if cell_state(cell.to_dict(), force) == "redo":
            check_clearable(cell.dir)


def execute_cell(cell: Mapping[str, Any], force: bool = False, progress: bool = False) -> Dict[str, Any]:
    """Run one cell to its end (skip, resume from its checkpoint, or start it); returns
    ``{name, status, summary, from_round, wall_s}``. Raises what the run raises."""
    from hasfl_ray.engine import Engine
    from hasfl_ray.engine.config import RunConfig

    start = time.perf_counter()
    state = cell_state(cell, force)
    run_dir = cell["dir"]
    if state == "finished":
        with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
            return {"name": cell["name"], "status": "skipped", "summary": json.load(handle), "from_round": None,
                    "wall_s": 0.0}
    if state == "redo":
        clear_run_directory(run_dir)  # only what a run wrote; a folder with anything else is refused
    config = RunConfig.from_dict(cell["values"], f"sweep cell {cell['name']}").resolved()
    resume = state == "interrupted"
    engine = Engine(config, out_dir=run_dir, progress=progress, resume=resume)
    engine.prepare()
    from_round = len(engine.history)
    summary = engine.run()
    write_cell_analysis(run_dir)
    return {"name": cell["name"], "status": "resumed" if resume else "done", "summary": summary,
            "from_round": from_round, "wall_s": time.perf_counter() - start}


def result_key(values: Mapping[str, Any]) -> str:
    """What a finished run's result depends on, as one string: its resolved config without the execution fields and
    without ``budget_from`` (the folder a budget came from; the budget itself is compared)."""
    from hasfl_ray.engine.config import RunConfig

    result = RunConfig.from_dict(values, "run config").resolved().result_dict()
    result.pop("budget_from", None)
    return json.dumps(result, sort_keys=True, default=str)


def reuse_finished_run(cell: Mapping[str, Any], sweep_out: str) -> Optional[Dict[str, Any]]:
    """A new cell whose resolved config equals that of a finished run in another sweep beside this one (another
    folder under the same parent, e.g. runs/table3-allocation for runs/figure6-frontier) is copied from it instead of
    run again: its files (not its checkpoints) land in the cell's folder, and summary.json says where from.
    Returns the cell's result (status ``reused``) or None."""
    import glob

    from hasfl_ray.engine.checkpoint import CHECKPOINT_DIR

    try:
        wanted = result_key(cell["values"])
    except ConfigError:
        return None  # the run itself will say what is wrong
    root = os.path.dirname(os.path.abspath(sweep_out))
    own = os.path.abspath(sweep_out)
    for summary_path in sorted(glob.glob(os.path.join(root, "*", "*", "summary.json"))):
        source = os.path.dirname(summary_path)
        if os.path.dirname(source) == own:
            continue
        stored = _stored(source)
        try:
            if stored is None or result_key(stored) != wanted:
                continue
        except (ConfigError, TypeError):
            continue  # a run of another version or a plug-in not importable here: not comparable
        start = time.perf_counter()
        shutil.copytree(source, cell["dir"], ignore=shutil.ignore_patterns(CHECKPOINT_DIR, ".tmp-*"),
                        dirs_exist_ok=True)
        target = os.path.join(cell["dir"], "summary.json")
        with open(target, encoding="utf-8") as handle:
            summary = json.load(handle)
        summary["reused_from"] = os.path.relpath(source, cell["dir"])
        atomic_write(target, (json.dumps(summary, indent=2) + "\n").encode())
        return {"name": cell["name"], "status": "reused", "summary": summary, "from_round": None,
                "wall_s": time.perf_counter() - start, "source": source}
    return None


def write_cell_analysis(run_dir: str) -> None:
    """The Table 5 analysis block in the finished run's summary.json (runs with H̃ estimates only)."""
    from hasfl_ray.analysis.report import read_run, write_analysis

    write_analysis(read_run(run_dir))


def failure_message(error: BaseException) -> str:
    """One line for a failed cell: the sentence of a ConfigError, else the exception and where it was raised."""
    if isinstance(error, ConfigError):
        return str(error)
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


# ------------------------------------------------------------------------------------------------------ the runner

class LocalExecutor:
    """Runs cells one after another in this process (``--backend local``, or where Ray is not installed)."""

    def __init__(self, force: bool = False, progress: bool = False):
        self.force, self.progress, self.queue = force, progress, []

    def describe(self) -> str:
        """How cells run, for the sweep's first line."""
        return "one cell after another"

    def submit(self, cell: Cell) -> None:
        self.queue.append(cell)

    def wait(self, on_idle: Optional[Callable[[], None]] = None) -> Tuple[str, Dict[str, Any]]:
        cell = self.queue.pop(0)
        try:
            return cell.name, execute_cell(cell.to_dict(), self.force, self.progress)
        except Exception as error:  # one failed cell never stops the others
            return cell.name, {"name": cell.name, "status": "failed", "error": failure_message(error)}

    def shutdown(self) -> None:
        pass


def describe_result(cell: Cell, result: Mapping[str, Any]) -> str:
    """One status line for a cell that ended."""
    status = result["status"]
    if status == "failed":
        return f"{cell.name}: failed: {result['error']}"
    if status == "blocked":
        return f"{cell.name}: blocked: {result['error']}"
    summary = result.get("summary") or {}
    numbers = (f"best {summary.get('best_accuracy', float('nan')):.4f}, final "
               f"{summary.get('final_accuracy', float('nan')):.4f}, avg p {summary.get('avg_p', float('nan')):.3f}")
    if status == "skipped":
        return f"{cell.name}: skipped (finished earlier: {numbers})"
    if status == "reused":
        return f"{cell.name}: reused the finished run {result.get('source', '')} (same config: {numbers})"
    resumed = f" (resumed after round {result['from_round']})" if status == "resumed" else ""
    return f"{cell.name}: {status} in {result.get('wall_s', 0.0):.1f} s{resumed}: {numbers}"


def rounds_done(cell: Cell) -> Tuple[int, Optional[int]]:
    """(metric lines written so far, the cell's rounds) of a running cell, for the progress view."""
    try:
        with open(os.path.join(cell.dir, "metrics.jsonl"), "rb") as handle:
            done = sum(1 for line in handle if line.strip())
    except OSError:
        done = 0
    from hasfl_ray.registry import lookup

    try:
        defaults = lookup("dataset", cell.dataset).defaults
    except ConfigError:
        defaults = {}
    return done, cell.values.get("rounds") or defaults.get("rounds")


def write_sweep_json(sweep: Sweep) -> str:
    """OUT/sweep.json: this sweep's description and cell statuses (cells of earlier sweeps into the same folder
    that this one does not name are kept)."""
    from hasfl_ray.engine.rundir import atomic_write

    os.makedirs(sweep.out, exist_ok=True)
    path = os.path.join(sweep.out, "sweep.json")
    data = sweep.describe()
    try:
        with open(path, encoding="utf-8") as handle:
            previous = json.load(handle)
        names = {c["name"] for c in data["cells"]}
        data["cells"] = [c for c in previous.get("cells", []) if c.get("name") not in names] + data["cells"]
    except (OSError, ValueError, AttributeError):
        pass
    atomic_write(path, (json.dumps(data, indent=2, default=str) + "\n").encode())
    return path


def run_sweep(sweep: Sweep, executor, on_result: Callable[[Cell, Dict[str, Any]], None] = lambda c, r: None,
              force: bool = False, on_start: Callable[[Cell], None] = lambda c: None) -> Dict[str, str]:
    """Run every cell through ``executor`` (``submit(cell)``, ``wait() -> (name, result)``), dependants after the
    cell they wait for; finished cells are skipped here without reaching the executor. Returns name -> status."""
    pending = list(sweep.cells)
    running = set()
    write_sweep_json(sweep)

    def finish(cell: Cell, result: Dict[str, Any]) -> None:
        cell.status = result["status"]
        cell.message = result.get("error", "")
        write_sweep_json(sweep)
        on_result(cell, result)

    try:
        while pending or running:
            for cell in list(pending):
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
                    finish(cell, {"status": "failed", "error": failure_message(error)})
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
            if running:
                name, result = executor.wait(on_idle=lambda: on_start(None))
                running.discard(name)
                finish(sweep.cell(name), result)
            elif pending:  # every pending cell waits for one that can no longer run
                raise RuntimeError("sweep dependencies form a cycle")  # not reachable from plan_sweep
    finally:
        executor.shutdown()
        write_sweep_json(sweep)
    return {c.name: c.status for c in sweep.cells}


def sweep_summary_line(statuses: Mapping[str, str]) -> str:
    counts: Dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))

