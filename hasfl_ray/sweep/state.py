"""What a sweep's folder holds: each cell's state (new, finished, interrupted, or written with another config),
a finished run of another sweep a new cell can reuse, the progress of a running cell, and ``OUT/sweep.json``."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from hasfl_ray.analysis.runs import _brief, check_summary
from hasfl_ray.engine.checkpoint import CHECKPOINT_DIR, config_differences, stored_config
from hasfl_ray.config import RunConfig
from hasfl_ray.data.fingerprint import config_fingerprint
from hasfl_ray.engine.rundir import RUN_FILES, RUN_FOLDERS, TEMP_PREFIX, check_clearable
from hasfl_ray.errors import ConfigError, DataError, OutputError, RunError
from hasfl_ray.files import atomic_write, read_json, read_regular
from hasfl_ray.registry import lookup
from hasfl_ray.sweep.plan import Cell, Sweep

logger = logging.getLogger(__name__)


def _stored(run_dir: str) -> Optional[Dict[str, Any]]:
    return stored_config(run_dir, None)


def _differences(stored: Mapping[str, Any], config: RunConfig) -> List[str]:
    """:func:`config_differences` but ``budget_from`` (compared through the budget it resolved to, so the spelling
    of the folder does not matter). The stored config is read as data: nothing it names is looked up or imported."""
    return [d for d in config_differences(stored, config) if not d.startswith("budget_from ")]


def _cell_config(cell: Mapping[str, Any]) -> RunConfig:
    return RunConfig.from_dict(cell["values"], f"sweep cell {cell['name']}", foreign="drop").resolved()


def cell_differences(cell: Mapping[str, Any]) -> List[str]:
    """Result-affecting fields where the cell's run directory was written with another config, or on other data
    (its data_fingerprint, where the stored run has one and the cell's data can be loaded to compare)."""
    stored = _stored(cell["dir"])
    if stored is None:
        return []
    config = _cell_config(cell)
    return _differences(stored, config) or _differences(stored, _with_data(stored, config))


#: The fingerprint of each data configuration a sweep loaded to compare (the cells of one dataset share it);
#: emptied as a sweep starts (check_conflicts), so files replaced since an earlier sweep of this process are read.
_FINGERPRINTS: Dict[str, Any] = {}


def _with_data(stored: Mapping[str, Any], config: RunConfig) -> RunConfig:
    """``config`` with its data's fingerprint (hasfl_ray/data/fingerprint.py) where the stored run has one to compare
    with, loaded once per data configuration; ``config`` itself where there is none to compare, or its data cannot
    be loaded (the cell's own run says why)."""
    if stored.get("data_fingerprint") is None or config.data_fingerprint is not None:
        return config
    values = {k: v for k, v in config.to_dict().items() if k not in ("algorithm", "algorithm_options")}
    key = json.dumps([os.getcwd(), values], sort_keys=True, default=repr)  # a relative data_dir is the cwd's
    if key not in _FINGERPRINTS:
        try:
            _FINGERPRINTS[key] = config_fingerprint(config)
        except (ConfigError, RunError):
            _FINGERPRINTS[key] = None
    found = _FINGERPRINTS[key]
    return config if found is None else dataclasses.replace(config, data_fingerprint=found)


def conflict_error(cell: Mapping[str, Any], differences: List[str]) -> ConfigError:
    return ConfigError(f"sweep cell {cell['name']!r} already holds a run with another config ("
                       f"{'; '.join(differences[:3])}); expected the same overrides as before, another --out, or "
                       "--force to run it again")


def cell_state(cell: Mapping[str, Any], force: bool = False) -> str:
    """``finished`` (a readable summary.json with the same config), ``interrupted`` (a run directory without a
    summary, or whose summary.json cannot be read: the cell runs again from its checkpoint, with one warning),
    ``new``, or ``redo`` (another config, with ``force``); ConfigError for another config without ``force``, and
    for a cell folder that is a link (a cell is written under the sweep's folder, never through a link)."""
    run_dir = cell["dir"]
    if os.path.islink(run_dir):
        raise ConfigError(f"sweep cell folder {run_dir!r} is a link to {os.readlink(run_dir)!r}; expected a folder "
                          "of its own under the sweep's folder, never followed (remove the link, or choose another "
                          "--out)")
    if not os.path.lexists(os.path.join(run_dir, "config.yaml")):
        return "new"
    differences = cell_differences(cell)
    if differences:
        if not force:
            raise conflict_error(cell, differences)
        return "redo"
    if not os.path.lexists(os.path.join(run_dir, "summary.json")):
        return "interrupted"
    try:
        read_summary(run_dir, "summary.json of the finished cell")
    except ConfigError as error:
        _warn_once(f"{error}; the cell runs again (from its checkpoint, if it has one) to write it anew",
                   os.path.join(run_dir, "summary.json"))
        return "interrupted"
    return "finished"


def read_summary(run_dir: str, what: str) -> Dict[str, Any]:
    """A finished run's summary.json as a mapping; one sentence (DataError) naming ``what`` and the file when it is
    a link, not a regular file, not JSON, nested too deeply, not a JSON object, or not a finished run's: the report's
    own check (:func:`hasfl_ray.analysis.runs.check_summary`: its accuracies and average width numbers in [0, 1],
    so ``{}`` or a text where a number goes is no finished cell) and the final model's ``params_sha256`` (a summary
    without it is no finished run: the cell runs again, or is not reused)."""
    path = os.path.join(run_dir, "summary.json")
    if os.path.islink(path):
        raise DataError(f"{what} {path!r} is a link to {os.readlink(path)!r}; expected the run's own file")
    summary = read_json(path, what, "the summary.json a run writes")
    if not isinstance(summary, dict):
        raise DataError(f"{what} {path!r} holds a JSON {type(summary).__name__}; expected the summary.json a run "
                        "writes (a JSON object)")
    check_summary(summary, f"{what} {path!r}")
    digest = summary.get("params_sha256")  # the final model's hash: every finished run writes it (engine/records.py)
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        raise DataError(f"{what} {path!r} has params_sha256 {_brief(digest)}; expected the 64 hexadecimal digits a "
                        "finished run writes" if "params_sha256" in summary else
                        f"{what} {path!r} has no params_sha256; expected the summary of a finished hasfl-ray run")
    return summary


_WARNED: set = set()


def _warn_once(message: str, path: str) -> None:
    """Log ``message`` about the file ``path`` as a warning the first time this process sees it in this state (a
    cell's state is asked for more than once: before the sweep runs, then when the cell's turn comes)."""
    try:
        info = os.lstat(path)
        key = (message, info.st_ino, info.st_size, info.st_mtime_ns)
    except OSError:
        key = (message,)
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning("%s", message)


def check_conflicts(sweep: Sweep, force: bool = False) -> None:
    """Refuse (one sentence) a sweep whose cell folders hold runs of another config, or (with ``force``) a cell
    folder to run again that holds anything a run does not write, before anything runs (cells whose budget comes
    from a HAS-FL cell not finished yet, or whose summary.json cannot be read, are checked when they start)."""
    _FINGERPRINTS.clear()
    for cell in sweep.cells:
        if cell.depends_on:
            try:
                read_summary(sweep.cell(cell.depends_on).dir, "summary.json of the finished cell")
            except ConfigError:
                continue
        if cell_state(cell.to_dict(), force) == "redo":
            check_clearable(cell.dir)


def _regular(path: str) -> bool:
    """Whether ``path`` is a regular file itself (not a link, a folder, a FIFO or a device)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _folders(path: str) -> List[str]:
    """The real folders in ``path`` (links never followed), sorted by name; none when it cannot be listed."""
    try:
        with os.scandir(path) as entries:
            return sorted(e.path for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _finished_runs(root: str, own: str) -> Iterator[str]:
    """The finished run directories of the other sweeps under ``root`` (``root/<sweep>/<cell>``): real folders
    whose config.yaml and summary.json are regular files, and whose other run files are too. Nothing is followed
    through a link."""
    for sweep_dir in _folders(root):
        if sweep_dir == own:
            continue
        for run_dir in _folders(sweep_dir):
            if os.path.basename(run_dir).startswith(TEMP_PREFIX):
                continue  # a copy in progress (or left by a killed sweep)
            names = [n for n in RUN_FILES if os.path.lexists(os.path.join(run_dir, n))]
            if {"config.yaml", "summary.json"} <= set(names) and all(_regular(os.path.join(run_dir, n))
                                                                      for n in names):
                yield run_dir


def _copy_regular(source: str, target: str) -> None:
    """Copy the regular file ``source`` (opened without following a link, non-blocking: a FIFO or device put in
    its place after it was looked at is refused, never read) to the new file ``target``."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{source!r} is not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as src, open(target, "xb") as dst:
            shutil.copyfileobj(src, dst)
    finally:
        os.close(fd)


def _copy_run(source: str, target: str) -> None:
    """Copy what a run writes (:data:`RUN_FILES`, and the files of :data:`RUN_FOLDERS` by their names, but the
    checkpoints) from ``source`` into the empty folder ``target``: nothing else, and nothing through a link."""
    for name in sorted(RUN_FILES):
        if os.path.lexists(os.path.join(source, name)):
            _copy_regular(os.path.join(source, name), os.path.join(target, name))
    for folder, patterns in RUN_FOLDERS.items():
        inside = os.path.join(source, folder)
        if folder == CHECKPOINT_DIR or os.path.islink(inside) or not os.path.isdir(inside):
            continue
        os.mkdir(os.path.join(target, folder))
        with os.scandir(inside) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False) and any(fnmatch.fnmatchcase(entry.name, p) for p in patterns):
                    _copy_regular(entry.path, os.path.join(target, folder, entry.name))


def reuse_finished_run(cell: Mapping[str, Any], sweep_out: str) -> Optional[Dict[str, Any]]:
    """A new cell whose resolved config equals that of a finished run in another sweep beside this one (another
    folder under the same parent, e.g. runs/table3-allocation for runs/figure6-frontier) is copied from it instead of
    run again: what a run writes (not its checkpoints) lands in the cell's folder, and summary.json says where from.
    Returns the cell's result (status ``reused``) or None.

    The other runs' configs are compared as data (a plug-in they name is never imported: only the cell's own
    config is resolved); their folders and files are never followed through a link; a run whose summary.json
    cannot be read is passed over with one warning; the copy is made in a temporary folder and renamed into place
    whole, so a copy that fails (a full disk) leaves no half cell (one warning; the cell then runs)."""
    target = cell["dir"]
    try:
        if os.path.lexists(target) and (os.path.islink(target) or os.listdir(target)):
            return None  # a cell is copied only into a missing or empty folder; the run says what is wrong
        config = _cell_config(cell)
    except (ConfigError, OSError):
        return None  # the run itself will say what is wrong
    own = os.path.abspath(sweep_out)
    for source in _finished_runs(os.path.dirname(own), own):
        try:
            stored = _stored(source)
            if stored is None or _differences(stored, config):
                continue
            # the same config on other data (another --data-dir) is no copy: the cell's data, by their content
            config = _with_data(stored, config)
            if stored.get("data_fingerprint") is not None and config.data_fingerprint is None:
                return None  # its data cannot be loaded: the run itself will say why
            if _differences(stored, config):
                _warn_once(f"sweep cell {cell['name']!r} does not reuse the finished run {source!r}: "
                           f"{'; '.join(_differences(stored, config))}", source)
                continue
        except (ConfigError, TypeError, ValueError, RecursionError):
            continue  # a run of another version, or a config that is not one: not comparable
        try:
            summary = read_summary(source, "summary.json of the finished run")
        except ConfigError as error:
            _warn_once(f"{error}; it is not reused", os.path.join(source, "summary.json"))
            continue
        start = time.perf_counter()
        summary["reused_from"] = os.path.relpath(source, target)
        scratch = None
        try:  # a folder made in a temporary one beside the cell (the mode a run's folder gets), then renamed
            scratch = tempfile.mkdtemp(prefix=TEMP_PREFIX + "reuse-", dir=os.path.dirname(os.path.abspath(target)))
            copy = os.path.join(scratch, "cell")
            os.mkdir(copy)
            _copy_run(source, copy)
            atomic_write(os.path.join(copy, "summary.json"), (json.dumps(summary, indent=2) + "\n").encode())
            os.rename(copy, target)  # onto a missing or empty folder: the cell appears whole or not at all
        except OSError as error:
            _warn_once(f"sweep cell {cell['name']!r} could not be copied from the finished run {source!r} "
                       f"({error.strerror or error}); it runs instead", source)
            return None
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        return {"name": cell["name"], "status": "reused", "summary": summary, "from_round": None,
                "wall_s": time.perf_counter() - start, "source": source}
    return None


def rounds_done(cell: Cell) -> Tuple[int, Optional[int]]:
    """(metric lines written so far, the cell's rounds) of a running cell, for the progress view."""
    try:
        done = sum(1 for line in read_regular(os.path.join(cell.dir, "metrics.jsonl"), "metrics.jsonl").splitlines()
                   if line.strip())
    except ConfigError:  # not written yet (or not a file: never opened blocking)
        done = 0
    try:
        defaults = lookup("dataset", cell.dataset).defaults
    except ConfigError:
        defaults = {}
    return done, cell.values.get("rounds") or defaults.get("rounds")


def write_sweep_json(sweep: Sweep) -> str:
    """OUT/sweep.json: this sweep's description and cell statuses (cells of earlier sweeps into the same folder
    that this one does not name are kept). An earlier sweep.json that cannot be read (not JSON, nested too deeply,
    not a sweep's, a link) is replaced, with one warning naming it; a write that fails is one sentence
    (OutputError)."""
    path = os.path.join(sweep.out, "sweep.json")
    data = sweep.describe()
    previous: Any = None
    if os.path.lexists(path):
        try:
            if os.path.islink(path):
                raise ConfigError(f"sweep.json of the sweep folder {path!r} is a link to {os.readlink(path)!r}; "
                                  "expected the file a sweep writes")
            previous = read_json(path, "sweep.json of the sweep folder", "the sweep.json a sweep writes")
            if not isinstance(previous, dict) or not isinstance(previous.get("cells", []), list):
                raise ConfigError(f"sweep.json of the sweep folder {path!r} has no list of cells; expected the "
                                  "sweep.json a sweep writes")
            try:
                json.dumps(previous, indent=2, default=str)  # what is kept of it must be written back
            except (RecursionError, ValueError):
                raise ConfigError(f"sweep.json of the sweep folder {path!r} is nested too deeply to write back; "
                                  "expected the sweep.json a sweep writes") from None
        except ConfigError as error:
            _warn_once(f"{error}; it is written anew (the statuses of cells this sweep does not name are lost)",
                       path)
            previous = None
    if previous is not None:
        names = {c["name"] for c in data["cells"]}
        data["cells"] = [c for c in previous.get("cells", []) if isinstance(c, dict)
                         and isinstance(c.get("name"), str) and c["name"] not in names] + data["cells"]
    try:
        os.makedirs(sweep.out, exist_ok=True)
        atomic_write(path, (json.dumps(data, indent=2, default=str) + "\n").encode())
    except OSError as error:
        raise OutputError(f"sweep.json could not be written in the sweep folder {sweep.out!r} "
                          f"({error.strerror or error}); the cells' run directories hold their results, and "
                          "running the same command again rewrites it") from None
    return path
