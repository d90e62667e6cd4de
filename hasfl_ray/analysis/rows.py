"""The rows of the report: which runs are the seeds of one row. One key per run, (dataset, row label), computed here
once for every table (:mod:`hasfl_ray.analysis.tables`, the clock's), every figure (:mod:`hasfl_ray.analysis.plots`)
and Table 5's pooling: a figure's lines are the table's rows, by construction.

A row's label is the run's algorithm (``hasfl (coverage off)``, ``fedavg (fedbuff)`` for an asynchronous run), or,
where runs of one such label come from several sweep variants (pack-fjord's KD and no-KD, pack-heterofl's rows, a
FedAvg lr variant beside FedAvg), the sweep's name of each variant. The seeds of one row share every setting but the
seed and how they were executed (:func:`row_protocol`); anything else is refused in one sentence naming the field."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hasfl_ray.analysis.runs import LOCAL_KEYS, _brief, run_option
from hasfl_ray.config.runconfig import EXECUTION_FIELDS
from hasfl_ray.data.fingerprint import pooling_change
from hasfl_ray.errors import DataError

#: Keys of a run's config that may differ between the seeds of one row: the seed and how the run was executed
#: (backend, actors, devices of the host, threads, training and aggregation modes, evaluation beside the model).
#: ``local_eval_width`` is one of them for the model, not for the local accuracies it scores: those are compared
#: by :func:`local_width`.
ROW_FREE_KEYS = EXECUTION_FIELDS | {"seed", "config_version", "device", "trainer_threads", "client_batching",
                                    "cuda_graphs", "aggregation_backend", "deterministic"}

#: A row key: (dataset, row label).
RowKey = Tuple[str, str]


def run_label(config: Mapping[str, Any]) -> str:
    """The algorithm a run's row is named by when no sweep variant splits it: the algorithm, ``(coverage off)`` for
    HAS-FL without coverage, ``(<rule>)`` for an asynchronous run (its own row and line, docs/async.md)."""
    label = config["algorithm"]
    if config["algorithm"] == "hasfl" and not run_option(config, "coverage", True):
        label += " (coverage off)"
    if config.get("mode") == "async":
        label += f" ({config.get('async_rule') or 'fedbuff'})"
    return label


def sweep_name(run: Mapping[str, Any]) -> str:
    """The algorithm name a sweep gave the run's cell (``<dataset>-<name>-seed<seed>``), else its algorithm."""
    base = os.path.basename(os.path.normpath(run["path"]))
    prefix, suffix = f"{run['config']['dataset']}-", f"-seed{run['config']['seed']}"
    if base.startswith(prefix) and base.endswith(suffix) and len(base) > len(prefix) + len(suffix):
        return base[len(prefix):-len(suffix)]
    return run["config"]["algorithm"]


def row_keys(runs: Sequence[Mapping[str, Any]]) -> List[RowKey]:
    """The row key of each run of ``runs`` (in their order): (dataset, :func:`run_label`), or (dataset,
    :func:`sweep_name`) where the runs of that label come from more than one sweep variant. A key depends on the
    runs reported together, so every table and figure of one report takes them from one call over all its runs."""
    names: Dict[RowKey, set] = defaultdict(set)
    for run in runs:
        names[(run["config"]["dataset"], run_label(run["config"]))].add(sweep_name(run))
    keys = []
    for run in runs:
        key = (run["config"]["dataset"], run_label(run["config"]))
        keys.append(key if len(names[key]) == 1 else (key[0], sweep_name(run)))
    return keys


def run_groups(runs: Sequence[Dict[str, Any]], order: Sequence[str] = ()) -> List[Tuple[RowKey, List]]:
    """The runs by row key (:func:`row_keys`), in the tables' row order: ``order`` (algorithm labels or sweep names,
    e.g. a sweep's algorithm list) within each dataset, then the rest alphabetically. Each row is checked
    (:func:`check_row`): its runs share their protocol and no seed twice, else one sentence naming the field."""
    groups: Dict[RowKey, List[Dict[str, Any]]] = {}
    for run, key in zip(runs, row_keys(runs)):
        groups.setdefault(key, []).append(run)
    for (dataset, label), members in groups.items():
        check_row(dataset, label, members)
    rank = {name: i for i, name in enumerate(order)}

    def position(item):
        (dataset, label), members = item
        names = [label] + [sweep_name(r) for r in members]
        return dataset, min((rank[n] for n in names if n in rank), default=len(rank)), label

    return sorted(groups.items(), key=position)


def row_members(groups: Sequence[Tuple[RowKey, List]], keep) -> List[Tuple[RowKey, List]]:
    """``groups`` (of :func:`run_groups`) narrowed to the runs ``keep(run)`` accepts, rows left empty dropped: a table
    of some runs (the clocked ones, those with H̃ estimates) keeps the rows and names of the whole report."""
    narrowed = [(key, [run for run in members if keep(run)]) for key, members in groups]
    return [(key, members) for key, members in narrowed if members]


def _seed_free(folder: str, seed: Any) -> Optional[str]:
    """``budget_from``'s folder with the run's own seed taken out (``digits-hasfl-seed<seed>``) where it names the
    run of the same seed, as a sweep derives it for each cell (sweep/plan.py); None where it does not."""
    base = os.path.basename(os.path.normpath(folder))
    suffix = f"-seed{seed}"
    return base[:-len(suffix)] + "-seed<seed>" if base.endswith(suffix) and len(base) > len(suffix) else None


def row_protocol(config: Mapping[str, Any]) -> Dict[str, Any]:
    """What the seeds of one row must share: the config but :data:`ROW_FREE_KEYS`, each algorithm option as
    ``algorithm_options.<name>``. Options derived per seed are the same setting for every seed: random-budget's
    ``budget_from`` naming the HAS-FL run of its own seed (the matched-budget control a sweep makes) is compared
    without the seed and the folder, and the ``budget`` a ``budget_from`` run realised is not compared (the run it
    names is the setting: each seed's realised its own)."""
    protocol = {k: v for k, v in config.items() if k not in ROW_FREE_KEYS and k not in ("algorithm_options",
                                                                                       "data_fingerprint")}
    if protocol.get("data_seed") in (None, config.get("seed")):  # the data follow each seed: a seed's setting
        protocol.pop("data_seed", None)
    options = config.get("algorithm_options")
    if not isinstance(options, Mapping):
        if "algorithm_options" in config:
            protocol["algorithm_options"] = options
        return protocol
    options = dict(options)
    source = options.get("budget_from")
    if isinstance(source, str) and source:
        options.pop("budget", None)  # what budget_from's run realised: that run is the setting
        options["budget_from"] = _seed_free(source, config.get("seed")) or source
    protocol.update({f"algorithm_options.{name}": value for name, value in options.items()})
    return protocol


def local_width(run: Mapping[str, Any]) -> Optional[str]:
    """The width a run scored its clients' local accuracy at (summary.json's local accuracy block, else the config's
    ``local_eval_width``), None when it scored none."""
    for key in LOCAL_KEYS:
        block = run["summary"].get(key)
        if isinstance(block, dict):
            return block.get("width") or run["config"].get("local_eval_width") or "final"
    return None


def check_row(dataset: str, label: str, members: Sequence[Mapping[str, Any]]) -> None:
    """Refuse, in one sentence naming the field, a row whose runs differ in anything but their seed (and how they
    were executed, :func:`row_protocol`), whose local accuracies were scored at different widths, or that holds one
    seed twice: never averaged as seeds."""
    first = members[0]
    protocol = row_protocol(first["config"])
    seen: Dict[Any, str] = {}
    row = f"of row {dataset} / {label}"
    for run in members:
        other = row_protocol(run["config"])
        for key in sorted(set(protocol) | set(other)):
            if protocol.get(key) != other.get(key):
                raise DataError(f"runs {first['path']} and {run['path']} {row} differ in {key} "
                                f"({_brief(protocol.get(key))} against {_brief(other.get(key))}); expected the seeds "
                                "of one row to share every setting but the seed (report them separately)")
        change = pooling_change(first["config"], run["config"])
        if change is not None:
            raise DataError(f"runs {first['path']} and {run['path']} {row} were trained on other data of dataset "
                            f"{dataset!r} ({change}); expected the seeds of one row to share their data (report "
                            "them separately)")
        # after the settings: two runs of one seed that differ in a setting are named by it, not as a repeat
        seed = run["config"].get("seed")
        if seed in seen:
            raise DataError(f"runs {seen[seed]} and {run['path']} {row} are both seed {seed}; expected one run per "
                            "seed in a row (report them separately)")
        seen[seed] = run["path"]
    scored = [(run, local_width(run)) for run in members if local_width(run) is not None]
    for run, width in scored[1:]:
        if width != scored[0][1]:
            raise DataError(f"runs {scored[0][0]['path']} and {run['path']} {row} differ in local_eval_width "
                            f"({scored[0][1]!r} against {width!r}): their local accuracies were scored at different "
                            "widths; expected the seeds of one row to share every setting but the seed (report them "
                            "separately)")
