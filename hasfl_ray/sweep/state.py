"""What a sweep's folder holds: each cell's state (new, finished, interrupted, or written with another config),
a finished run of another sweep a new cell can reuse, the progress of a running cell, and ``OUT/sweep.json``."""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hasfl_ray.engine.checkpoint import CHECKPOINT_DIR, config_differences, stored_config
from hasfl_ray.engine.config import RunConfig
from hasfl_ray.engine.rundir import check_clearable
from hasfl_ray.errors import ConfigError
from hasfl_ray.files import atomic_write
from hasfl_ray.registry import lookup
from hasfl_ray.sweep.plan import Cell, Sweep


def _stored(run_dir: str) -> Optional[Dict[str, Any]]:
    return stored_config(run_dir, None)


def cell_differences(cell: Mapping[str, Any]) -> List[str]:
    """Result-affecting fields where the cell's run directory was written with another config (``budget_from`` is
    compared through the budget it resolves to, so the spelling of the folder does not matter)."""
    stored = _stored(cell["dir"])
    if stored is None:
        return []
    config = RunConfig.from_dict(cell["values"], f"sweep cell {cell['name']}", foreign="drop").resolved()
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


def result_key(values: Mapping[str, Any]) -> str:
    """What a finished run's result depends on, as one string: its resolved config without the execution fields and
    without ``budget_from`` (the folder a budget came from; the budget itself is compared)."""
    result = RunConfig.from_dict(values, "run config", foreign="drop").resolved().result_dict()
    result["algorithm_options"].pop("budget_from", None)
    return json.dumps(result, sort_keys=True, default=str)


def reuse_finished_run(cell: Mapping[str, Any], sweep_out: str) -> Optional[Dict[str, Any]]:
    """A new cell whose resolved config equals that of a finished run in another sweep beside this one (another
    folder under the same parent, e.g. runs/table3-allocation for runs/figure6-frontier) is copied from it instead of
    run again: its files (not its checkpoints) land in the cell's folder, and summary.json says where from.
    Returns the cell's result (status ``reused``) or None."""
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


def rounds_done(cell: Cell) -> Tuple[int, Optional[int]]:
    """(metric lines written so far, the cell's rounds) of a running cell, for the progress view."""
    try:
        with open(os.path.join(cell.dir, "metrics.jsonl"), "rb") as handle:
            done = sum(1 for line in handle if line.strip())
    except OSError:
        done = 0
    try:
        defaults = lookup("dataset", cell.dataset).defaults
    except ConfigError:
        defaults = {}
    return done, cell.values.get("rounds") or defaults.get("rounds")


def write_sweep_json(sweep: Sweep) -> str:
    """OUT/sweep.json: this sweep's description and cell statuses (cells of earlier sweeps into the same folder
    that this one does not name are kept)."""
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
