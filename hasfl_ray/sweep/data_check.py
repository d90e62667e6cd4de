"""The data a sweep's cells ask for, checked before its folder is made or any cell starts.

What the data layer requires of a run (a sample for each of ``--clients``, at most as many label-sorted shards as
samples, ``classes:K`` with K at most the classes and enough samples of each, a Dirichlet draw that gives every client
its share) is known only once the data are read: a lone ``simulate`` loads them before its run directory exists,
but a sweep's cell loads them as it starts, after the sweep's folder and other cells. :func:`check_cell_data` loads
each distinct data configuration of the cells left to run once, with the loader a cell uses, and refuses the first
that fails in one sentence naming its cell."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from hasfl_ray.errors import ConfigError, DataError

#: The built-in datasets checked (a plug-in's or a hub dataset's loader is the user's code or a download: left to
#: the cell, as before).
CHECKED = ("digits", "emnist", "cifar10", "cifar100", "shakespeare", "synthetic")

#: What a built-in loader reads of the config (data/fingerprint.py's data_view: ``seed`` is the data seed), and the
#: --model keys of the dataset a cell trains on.
_DATA_KEYS = ("dataset", "data_dir", "download", "clients", "alpha", "seed", "partition", "synthetic_alpha",
              "synthetic_beta", "model", "model_norm", "global_width")


def check_cell_data(sweep: Any, force: bool = False) -> None:
    """Load, once per distinct data configuration, the data of every cell of ``sweep`` not finished yet; a
    ConfigError (one sentence naming the cell) for the first the data layer refuses. Files that are
    missing or unreadable here (a DataError) are left to the cell: a Ray cluster's nodes may hold them."""
    from hasfl_ray.config import RunConfig
    from hasfl_ray.data.fingerprint import data_view
    from hasfl_ray.engine.preparing import run_dataset
    from hasfl_ray.sweep.plan import naming
    from hasfl_ray.sweep.state import cell_state

    seen: Dict[Tuple, None] = {}
    for cell in sweep.cells:
        if cell.dataset not in CHECKED or _finished(cell, force, cell_state):
            continue
        # budget_from names a HAS-FL cell that may not have run yet (its summary is read as the cell starts): the
        # data never depend on it
        values = {k: v for k, v in cell.values.items() if k != "budget_from"}
        if isinstance(values.get("algorithm_options"), dict):
            values["algorithm_options"] = {k: v for k, v in values["algorithm_options"].items() if k != "budget_from"}
        try:
            with naming(f"sweep cell {cell.name}"):
                config = RunConfig.from_dict(values, f"sweep cell {cell.name}", foreign="drop").resolved()
        except ConfigError:
            continue  # a cell's own bad input is refused as that cell starts, the others still run (cli/sweep.py)
        view = data_view(config)
        key = tuple(repr(getattr(view, name, None)) for name in _DATA_KEYS)
        if key in seen:
            continue
        seen[key] = None
        try:
            with naming(f"sweep cell {cell.name}"):  # the sentence says which cell (its data, its clients)
                run_dataset(config)
        except DataError:
            continue


def _finished(cell: Any, force: bool, cell_state: Any) -> bool:
    """Whether ``cell`` is finished (skipped by the sweep); a state that cannot be told here (a random-budget cell
    whose HAS-FL cell's summary.json is unreadable: that cell runs again first) counts as not finished."""
    try:
        return cell_state(cell.to_dict(), force) == "finished"
    except ConfigError:
        return False
