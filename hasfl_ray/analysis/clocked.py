"""Runs compared on the device clock (issue 26, docs/clock.md "How to read the report"): accuracy against simulated
time and against the bytes moved (a figure per dataset), and the simulated time and bytes each algorithm took to
first reach each accuracy target (a table), mean ± std over seeds.

Only runs with a device population (config.yaml's ``devices``; their metrics.jsonl lines have ``sim_time_s``) take
part, and only their metrics.jsonl is read here: a report of runs without a clock is exactly what it was."""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from hasfl_ray.analysis.runfiles import _metrics, _save
from hasfl_ray.analysis.report import _latex_grid, _markdown_grid, _tex, display_name, mean_std, number
from hasfl_ray.analysis.rows import row_members, run_groups
from hasfl_ray.analysis.statistics import nan_mean_std
from hasfl_ray.clock.records import ACCURACY_TARGETS, NOT_REACHED, width_label
from hasfl_ray.errors import DataError

#: metrics.jsonl keys a clocked run has on every line (numbers), docs/clock.md "Records".
CLOCK_KEYS = ("sim_time_s", "bytes_down", "bytes_up")
#: Display units: (seconds or bytes per unit, name), from the smallest; a table or axis takes the largest unit its
#: largest value reaches ten times (so at most three digits before the point, in the smallest unit 9,999).
TIME_UNITS = ((1.0, "s"), (60.0, "min"), (3600.0, "h"))
BYTE_UNITS = ((1e6, "MB"), (1e9, "GB"))
#: Points of the common grid the figure's curves are sampled at (per algorithm).
GRID_POINTS = 400


def is_clocked(run: Dict[str, Any]) -> bool:
    """Whether the run had a device clock (its config.yaml names a device population): only then is its
    metrics.jsonl read here."""
    return run["config"].get("devices") is not None


def trajectory(run: Dict[str, Any]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(simulated seconds at each round's end, bytes moved by then (down and up, cumulative), test accuracy (NaN on
    a round without one)) of a clocked run, float64; one sentence naming the file and line whose clock keys are not
    numbers."""
    lines = _metrics(run)
    if not lines:
        raise DataError(f"run file {os.path.join(run['path'], 'metrics.jsonl')!r} has no rounds; expected the "
                        "metrics of a finished clocked run (docs/clock.md)")
    for index, line in enumerate(lines):
        for key in CLOCK_KEYS:
            if not number(line.get(key)):
                file = os.path.join(run["path"], "metrics.jsonl")
                raise DataError(f"run file {file!r} line {index + 1} has {key} "
                                f"{line.get(key)!r}; expected a number on every line of a clocked run (docs/clock.md)")
    times = np.array([line["sim_time_s"] for line in lines], dtype=np.float64)
    moved = np.cumsum([float(line["bytes_down"]) + float(line["bytes_up"]) for line in lines], dtype=np.float64)
    accuracy = np.array([np.nan if line.get("test_accuracy") is None else line["test_accuracy"] for line in lines],
                        dtype=np.float64)
    return times, moved, accuracy


def first_reached(run: Dict[str, Any], target: float) -> Optional[Tuple[float, float]]:
    """(simulated seconds, bytes moved) at the end of the first round whose test accuracy reached ``target``, or None
    when no round did (summary.json's ``time_to_accuracy_s`` is the first of the two)."""
    times, moved, accuracy = trajectory(run)
    with np.errstate(invalid="ignore"):
        hits = np.flatnonzero(accuracy >= target)
    return (float(times[hits[0]]), float(moved[hits[0]])) if len(hits) else None


def _over_seeds(values: Sequence[Optional[float]]) -> Any:
    """A cell: {mean, std (sample), n} of the seeds that have a value, else :data:`NOT_REACHED`."""
    reached = [v for v in values if v is not None]
    if not reached:
        return NOT_REACHED
    mean, std = mean_std(reached)
    return {"mean": mean, "std": std, "n": len(reached)}


def _target_key(kind: str, target: float) -> str:
    """A cell's key: ``time_to_0.95_s`` (seconds) or ``bytes_to_0.95``."""
    return f"time_to_{width_label(target)}_s" if kind == "time" else f"bytes_to_{width_label(target)}"


def clock_table(runs: Sequence[Dict[str, Any]], order: Sequence[str] = (),
                targets: Sequence[float] = ACCURACY_TARGETS) -> Optional[Dict[str, Any]]:
    """The time- and bytes-to-accuracy table of the clocked runs (None when no run has a clock): a row per (dataset,
    algorithm) in the report's order, with ``cells``: ``time_to_<target>_s`` (simulated seconds) and
    ``bytes_to_<target>`` (bytes down and up) at the end of the first round whose test accuracy reached the target,
    mean ± sample std over the seeds that reached it (``n``; "not reached" when none did), and ``sim_time_s`` and
    ``bytes`` of the whole run. ``units`` holds the display unit of each kind."""
    clocked = [run for run in runs if is_clocked(run)]
    if not clocked:
        return None
    rows = []  # the report's rows (keys over every run), of their clocked runs
    for (dataset, algorithm), members in row_members(run_groups(runs, order), is_clocked):
        cells: Dict[str, Any] = {}
        for target in targets:
            hits = [first_reached(run, target) for run in members]
            cells[_target_key("time", target)] = _over_seeds([h and h[0] for h in hits])
            cells[_target_key("bytes", target)] = _over_seeds([h and h[1] for h in hits])
        ends = [trajectory(run) for run in members]
        cells["sim_time_s"] = _over_seeds([float(times[-1]) for times, _, _ in ends])
        cells["bytes"] = _over_seeds([float(moved[-1]) for _, moved, _ in ends])
        rows.append({"dataset": dataset, "algorithm": algorithm, "seeds": sorted(r["config"]["seed"] for r in members),
                     "cells": cells})
    largest = {}  # the largest time and data to a target reached (else of a whole run) set the units
    for kind, whole in (("time", "sim_time_s"), ("bytes", "bytes")):
        reached = [cell["mean"] for row in rows for key, cell in row["cells"].items()
                   if key.startswith(f"{kind}_to_") and isinstance(cell, dict)]
        largest[kind] = max(reached or [row["cells"][whole]["mean"] for row in rows])
    units = {"time": _unit(largest["time"], TIME_UNITS), "bytes": _unit(largest["bytes"], BYTE_UNITS)}
    columns = []
    for target in targets:
        percent = f"{100 * target:g}"
        columns += [(_target_key("time", target), f"Time to {percent} % ({units['time'][1]})",
                     f"Time to {percent}\\% ({units['time'][1]})", "time"),
                    (_target_key("bytes", target), f"Data to {percent} % ({units['bytes'][1]})",
                     f"Data to {percent}\\% ({units['bytes'][1]})", "bytes")]
    columns += [("sim_time_s", f"Run's time ({units['time'][1]})", f"Run's time ({units['time'][1]})", "time"),
                ("bytes", f"Run's data ({units['bytes'][1]})", f"Run's data ({units['bytes'][1]})", "bytes")]
    devices = sorted({clock_line(run["config"]) for run in clocked})
    caption = ("Simulated time and data moved (bytes down and up, every invited client's download and every kept "
               "update's upload) until the end of the first round whose test accuracy of the full-width model reached "
               "each target, on the device clock (docs/clock.md); mean ± std over the seeds that reached it (their "
               "count where not all did), \"not reached\" when none did; " + "; ".join(devices)
               + tested_every(clocked))
    return {"name": "clock", "title": "Time and data to accuracy", "caption": caption, "columns": columns,
            "rows": rows, "units": units, "targets": list(targets)}


def tested_every(runs: Sequence[Dict[str, Any]]) -> str:
    """The caption's words for runs that tested only every K rounds (``test_every`` K > 1): a target they reached
    is dated to the first round that tested after it, up to K - 1 rounds late ("" where every run tested every
    round), so their times and bytes are not compared with every-round runs' unknowingly."""
    every = sorted({int(k) for k in (run["config"].get("test_every") or 1 for run in runs)
                    if isinstance(k, int) and not isinstance(k, bool) and k > 1})
    if not every:
        return ""
    return (f"; test accuracy every {' or '.join(map(str, every))} rounds in some runs (--test-every): their targets "
            "are dated to the first round tested after reaching them")


def _unit(largest: float, units: Sequence[Tuple[float, str]]) -> Tuple[float, str]:
    """The largest of ``units`` that ``largest`` reaches ten times (the first below that)."""
    chosen = units[0]
    for unit in units:
        if largest >= 10 * unit[0]:
            chosen = unit
    return chosen


def clock_line(config: Mapping[str, Any]) -> str:
    """A run's device population, deadline, availability and dropout in a few words."""
    devices = config.get("devices")
    if isinstance(devices, Mapping) and "trace" in devices:
        what = f"trace {devices['trace']}"
    elif isinstance(devices, Mapping) and "fedscale" in devices:
        what = f"FedScale trace {devices['fedscale']}"
    elif isinstance(devices, Mapping) and "tiers" in devices:
        what = "per-tier devices"
    elif isinstance(devices, Mapping) and "distribution" in devices:
        what = f"{devices['distribution']} devices"
    else:
        what = f"devices {devices}"
    deadline = config.get("deadline")
    what += (f", deadline {deadline:g} s ({config.get('deadline_policy', 'drop')})" if number(deadline)
             else ", no deadline")
    if config.get("availability") not in (None, "always"):
        what += f", availability {config['availability']}"
    if number(config.get("dropout")) and config["dropout"] > 0:
        what += f", dropout {config['dropout']:g}"
    return what


def _figure(value: float, scale: float) -> str:
    """``value / scale`` with three significant figures (no exponent)."""
    value /= scale
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, 2 - int(math.floor(math.log10(abs(value)))))
    return f"{value:.{decimals}f}"


def _clock_cell(cell: Any, seeds: int, scale: float, tex: bool = False) -> str:
    """``mean ± std`` in the column's unit (the std with the mean's decimals), ``(n/seeds reached)`` when some seeds
    did not reach the target, or "not reached"."""
    if isinstance(cell, str):
        return cell
    mean = _figure(cell["mean"], scale)
    decimals = len(mean.split(".")[1]) if "." in mean else 0
    plus_minus = r"$\pm$" if tex else "±"
    # one seed reached it: the value alone (its spread was not measured)
    text = mean if cell["n"] < 2 else f"{mean} {plus_minus} {cell['std'] / scale:.{decimals}f}"
    return text + (f" ({cell['n']}/{seeds} reached)" if cell["n"] < seeds else "")


def _scale(table: Mapping[str, Any], kind: str) -> float:
    return table["units"][kind][0]


def clock_markdown(table: Mapping[str, Any]) -> str:
    """The table in markdown, its caption below."""
    body = [[display_name(row["dataset"]), display_name(row["algorithm"]), ", ".join(str(s) for s in row["seeds"])]
            + [_clock_cell(row["cells"][key], len(row["seeds"]), _scale(table, kind))
               for key, _, _, kind in table["columns"]] for row in table["rows"]]
    lines = _markdown_grid(["Dataset", "Algorithm", "Seeds"] + [header for _, header, _, _ in table["columns"]], body)
    return "\n".join(lines + ["", table["caption"] + "."]) + "\n"


def clock_latex(table: Mapping[str, Any], caption: str) -> str:
    """The table as a booktabs table in the layout of the report's other tables."""
    body = [[_tex(display_name(row["algorithm"]))]
            + [_clock_cell(row["cells"][key], len(row["seeds"]), _scale(table, kind), tex=True)
               for key, _, _, kind in table["columns"]] for row in table["rows"]]
    header = " & ".join(["Dataset", "Algorithm"] + [tex for _, _, tex, _ in table["columns"]])
    title = f"{table['title']}, {caption}" if caption else table["title"]
    return _latex_grid(table["rows"], body, title, "ll" + "c" * len(table["columns"]), header)


def _step_curves(runs: Sequence[Dict[str, Any]], axis: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, mean, std over seeds) of the test accuracy (%) against simulated seconds (``axis`` 0) or bytes moved
    (1): at x, each seed's accuracy is that of its last round finished by x (the model the server holds then); the
    grid runs from the earliest first round's end to the end of the seed that finished first, so every seed counts
    at every point from its first round on."""
    paths = [trajectory(run) for run in runs]
    # lines without an evaluation (an asynchronous run's between its evaluations, docs/async.md) leave the curve
    # at the last evaluated accuracy
    paths = [tuple(part[~np.isnan(path[2])] for part in path) if not np.isnan(path[2]).all() else path
             for path in paths]
    xs = [path[axis] for path in paths]
    grid = np.linspace(min(x[0] for x in xs), min(x[-1] for x in xs), GRID_POINTS)
    values = np.full((len(paths), len(grid)), np.nan)
    for k, (x, path) in enumerate(zip(xs, paths)):
        index = np.searchsorted(x, grid, side="right") - 1
        values[k] = np.where(index >= 0, 100 * path[2][np.maximum(index, 0)], np.nan)
    return (grid, *nan_mean_std(values))  # the tables' sample std over seeds


def plot_clock(plt, out_dir: str, dataset: str, heading: str, labels: Sequence[str],
               groups: Mapping[str, List[Dict[str, Any]]], fmt: str = "png") -> List[str]:
    """<dataset>-clock.png: test accuracy against simulated time (left) and against data moved (right), one line per
    algorithm (the mean over its clocked seeds, ± std band, as the per-round convergence figure); nothing when no
    run of the dataset has a clock."""
    clocked = {label: [r for r in groups[label] if is_clocked(r)] for label in labels}
    clocked = {label: members for label, members in clocked.items() if members}
    if not clocked:
        return []
    largest = max(trajectory(r)[0][-1] for members in clocked.values() for r in members)
    moved = max(trajectory(r)[1][-1] for members in clocked.values() for r in members)
    units = (_unit(largest, TIME_UNITS), _unit(moved, BYTE_UNITS))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, members in clocked.items():
        for axis, ax in enumerate(axes):
            grid, mean, std = _step_curves(members, axis)
            line, = ax.plot(grid / units[axis][0], mean, label=f"{display_name(label)} ({len(members)} seed"
                                                               f"{'s' if len(members) > 1 else ''})")
            if len(members) > 1:
                ax.fill_between(grid / units[axis][0], mean - std, mean + std, color=line.get_color(), alpha=0.2,
                                linewidth=0)
    axes[0].set(xlabel=f"simulated time ({units[0][1]})", ylabel="test accuracy of the full-width model (%)",
                title="accuracy against simulated time (mean ± std over seeds)")
    axes[1].set(xlabel=f"data moved, down and up ({units[1][1]})", ylabel="test accuracy of the full-width model (%)",
                title="accuracy against data moved (mean ± std over seeds)")
    for ax in axes:
        ax.legend(fontsize=8)
    devices = "; ".join(sorted({clock_line(r["config"]) for members in clocked.values() for r in members}))
    fig.suptitle(f"On the device clock: {heading}\n{devices}", fontsize=10)
    return [_save(fig, out_dir, f"{dataset}-clock.png", fmt)]
