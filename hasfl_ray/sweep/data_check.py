"""The data a sweep's cells ask for, checked before its folder is made or any cell starts.

What the data layer requires of a run (a sample for each of ``--clients``, at most as many label-sorted shards as
samples, ``classes:K`` with K at most the classes and enough samples of each, a Dirichlet draw that gives every client
its share) is known only once the data are read: a lone ``simulate`` loads them before its run directory exists,
but a sweep's cell loads them as it starts, after the sweep's folder and other cells. :func:`check_cell_data` loads
each distinct data configuration of the cells left to run once, with the loader a cell uses (a built-in's, a
plug-in's ``load``, an ``hf:`` dataset read offline: a ``save_to_disk`` folder or the local hub cache, never the
network), and refuses the first that fails in one sentence naming its cell.

What cannot be told here stays the cell's own error, said as it starts: a built-in's or a plug-in's files missing or
unreadable here (a DataError: a Ray cluster's nodes may hold them, and a built-in may be downloaded by its cell), a
plug-in's own code failing (a PluginError: it may need what only the cell's machine has), and an ``hf:`` dataset
this machine does not hold when the cells run on a Ray cluster (``--address``). Without a cluster an ``hf:`` cell
reads the same folder or cache, offline, as the check: what the check cannot read, the cell cannot either.

:func:`ladder_notes` says, before the folder is made, which cells' width ladders deal a level no client
(:func:`hasfl_ray.federation.empty_level_note`)."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Tuple

from hasfl_ray.errors import ConfigError, DataError, PluginError

#: What a built-in loader reads of the config (data/fingerprint.py's data_view: ``seed`` is the data seed), and the
#: --model keys of the dataset a cell trains on (a plug-in's loader is given the whole config; these are the keys
#: docs/plugins.md has it read).
_DATA_KEYS = ("dataset", "data_dir", "download", "clients", "alpha", "seed", "partition", "synthetic_alpha",
              "synthetic_beta", "model", "model_norm", "global_width")


def _cell_configs(sweep: Any, force: bool) -> Iterator[Tuple[Any, Any]]:
    """(cell, its resolved RunConfig) of every cell of ``sweep`` not finished yet whose config is valid (a cell's
    own bad config is left to that cell's refusal as it starts: the others still run, cli/sweep.py)."""
    from hasfl_ray.config import RunConfig
    from hasfl_ray.sweep.plan import naming
    from hasfl_ray.sweep.state import cell_state

    for cell in sweep.cells:
        if _finished(cell, force, cell_state):
            continue
        # budget_from names a HAS-FL cell that may not have run yet (its summary is read as the cell starts): the
        # data and the ladder never depend on it
        values = {k: v for k, v in cell.values.items() if k != "budget_from"}
        if isinstance(values.get("algorithm_options"), dict):
            values["algorithm_options"] = {k: v for k, v in values["algorithm_options"].items() if k != "budget_from"}
        try:
            with naming(f"sweep cell {cell.name}"):
                config = RunConfig.from_dict(values, f"sweep cell {cell.name}", foreign="drop").resolved()
        except ConfigError:
            continue
        yield cell, config


def check_cell_data(sweep: Any, force: bool = False, cluster: bool = False) -> None:
    """Load, once per distinct data configuration, the data of every cell of ``sweep`` not finished yet; a
    ConfigError (one sentence naming the cell) for the first the data layer refuses, or whose loader (a plug-in's)
    splits the data over another number of clients than ``clients``. ``cluster``: the cells run on a Ray
    cluster's nodes (``--address``), whose files and hub cache may hold what this machine lacks (module
    docstring)."""
    from hasfl_ray.data.fingerprint import data_view
    from hasfl_ray.data.hub import is_hub
    from hasfl_ray.engine.preparing import check_client_count, run_dataset
    from hasfl_ray.sweep.plan import naming

    seen: Dict[Tuple, None] = {}
    for cell, config in _cell_configs(sweep, force):
        view = data_view(config)
        key = tuple(repr(getattr(view, name, None)) for name in _DATA_KEYS)
        if key in seen:
            continue
        seen[key] = None
        try:
            with naming(f"sweep cell {cell.name}"):  # the sentence says which cell (its data, its clients)
                dataset = run_dataset(config)
                check_client_count(dataset, config)
        except DataError as error:  # its sentence names the cell (naming)
            if is_hub(config.dataset) and not cluster:  # read offline here as the cell would read it
                raise ConfigError(str(error)) from None
            continue
        except PluginError:
            continue  # a plug-in's own code failing: the cell's error, with its traceback in the cell's log.txt


def ladder_notes(sweep: Any, force: bool = False) -> List[str]:
    """One warning line per distinct width-ladder note of the cells left to run (a level with a positive share that
    rounding deals 0 clients: :func:`hasfl_ray.federation.empty_level_note`), naming the cells it concerns."""
    from hasfl_ray.federation import empty_level_note

    notes: Dict[str, List[str]] = {}
    for cell, config in _cell_configs(sweep, force):
        note = empty_level_note(config)
        if note is not None:
            notes.setdefault(note, []).append(cell.name)
    return [f"sweep cell{'s' if len(cells) > 1 else ''} {_some(cells)}: {note}" for note, cells in notes.items()]


def _some(names: List[str], shown: int = 3) -> str:
    """``a, b, c`` or, past ``shown``, ``a, b and 9 more`` (a league's 88 variants share a few ladders)."""
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown - 1])} and {len(names) - shown + 1} more"


def _finished(cell: Any, force: bool, cell_state: Any) -> bool:
    """Whether ``cell`` is finished (skipped by the sweep); a state that cannot be told here (a random-budget cell
    whose HAS-FL cell's summary.json is unreadable: that cell runs again first) counts as not finished."""
    try:
        return cell_state(cell.to_dict(), force) == "finished"
    except ConfigError:
        return False
