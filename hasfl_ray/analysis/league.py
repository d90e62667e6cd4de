"""The sub-model league's table (issue 44 item 4): per method and cell (dataset, partition, width ladder) the global
accuracy (and FedLASE's: its mean over the last 20 rounds), the accuracy at every width and the local accuracy's mean
and worst client, at equal rounds (the run's end), at equal simulated time and at equal bytes (the device clock's
time and bytes to 50 % and 70 % accuracy, and the accuracy held at a time budget and at a bytes budget), mean ± std
over seeds.

A report has this table when some run has a device clock (docs/clock.md); a run without one has no simulated time,
and its time and bytes cells say so (never a number). Only summary.json and metrics.jsonl are read: the tables the
report had before are unchanged."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hasfl_ray.analysis.clocked import (BYTE_UNITS, TIME_UNITS, _figure, _unit, first_reached, is_clocked,
                                        tested_every, trajectory)
from hasfl_ray.analysis.rows import check_row, row_keys, sweep_name
from hasfl_ray.analysis.runfiles import _metrics
from hasfl_ray.analysis.runs import number, width_of
from hasfl_ray.analysis.statistics import mean_std
from hasfl_ray.clock.records import width_label
from hasfl_ray.errors import ConfigError

#: The accuracy targets of the league's time and bytes to accuracy.
LEAGUE_TARGETS = (0.5, 0.7)
#: A time or bytes cell of a run without a device clock.
NO_CLOCK = "no clock"
#: The line under a table holding such cells.
NO_CLOCK_LINE = ("no clock: {rows} ran without --devices: no simulated time or bytes were recorded, so these cells "
                 "say \"no clock\" (nothing is estimated)")
#: A budget cell of a run whose whole run took less than the budget.
ENDED = "ended before"
#: A local worst at a budget of a run made before metrics.jsonl recorded it per round.
NOT_PER_ROUND = "not per round"
#: A local accuracy no client had a test sample for.
NO_CLIENT = "no client scored"
#: A local mean at a budget when the rounds finished by then had not evaluated local accuracy.
NOT_LOCAL = "local not evaluated by then"
#: A cell at a budget when the rounds finished by then had not evaluated it.
NOT_EVALUATED = "not evaluated by then"
#: A cell at a budget when no round had finished by then.
NO_ROUND = "no round by then"
#: A target no seed reached.
NOT_REACHED = "not reached"
#: FedLASE's global accuracy (OpenReview 2uS2RBE0hv, section 5): the test accuracy averaged over the last 20 rounds.
LAST_ROUNDS = 20
#: A run none of whose last rounds recorded a test accuracy.
NOT_TESTED = "no test accuracy in the last rounds"
#: What each of these texts means, for the lines under a table.
REASONS = {ENDED: "the run's whole simulated time or data is less than the budget (it was not scored there)",
           NOT_PER_ROUND: "the run's metrics.jsonl has local_accuracy_mean but not local_accuracy_worst (a run made "
                          "before the worst client was recorded per round: summary.json's is its end's)",
           NO_CLIENT: "no client had a test sample of its labels",
           NOT_LOCAL: "no round finished by the budget evaluated local accuracy (--local-eval-every K: every K "
                      "rounds and after the last; 0: after the last only)",
           NOT_EVALUATED: "no round finished by the budget evaluated it (--eval-every)",
           NO_ROUND: "the run's first round ended after the budget",
           NOT_REACHED: "no round's test accuracy reached the target",
           NOT_TESTED: f"none of the run's last {LAST_ROUNDS} rounds recorded a test accuracy (--test-every)"}
#: The two budget axes: (name, index of the trajectory, flag, words).
AXES = (("time", 0, "--budget-seconds", "simulated time"), ("bytes", 1, "--budget-bytes", "bytes moved"))


def partition_label(config: Mapping[str, Any]) -> str:
    """A run's partition in a few symbols: ``IID``, ``Dir(0.1)``, ``balanced Dir(0.3)``, else the scheme."""
    partition = str(config.get("partition") or "dirichlet")
    alpha = config.get("alpha")
    if partition == "iid":
        return "IID"
    if partition in ("dirichlet", "balanced-dirichlet") and number(alpha):
        return ("balanced " if partition == "balanced-dirichlet" else "") + f"Dir({alpha:g})"
    return partition


def ladder_label(config: Mapping[str, Any]) -> str:
    """A run's width ladder: ``widths 1, 0.5, 0.25, 0.125`` (with the mix where it is not equal shares), or the
    dataset's tiers when the run names none."""
    widths = config.get("widths")
    if not isinstance(widths, list) or not widths:
        return "the dataset's tiers"
    text = "widths " + ", ".join(f"{w:g}" if number(w) else str(w) for w in widths)
    mix = config.get("width_mix")
    if isinstance(mix, list) and len(set(map(str, mix))) > 1:
        text += " (mix " + ":".join(f"{m:g}" if number(m) else str(m) for m in mix) + ")"
    return text


def league_groups(runs: Sequence[Dict[str, Any]], order: Sequence[str] = ()
                  ) -> List[Tuple[Tuple[str, str, str, str], List[Dict[str, Any]]]]:
    """The runs by (dataset, partition, ladder, method): a method's label is the report's row label within its cell
    (:func:`~hasfl_ray.analysis.rows.row_keys` over that cell's runs, so a sweep's per-cell variant
    ``heterofl-dir0.1-l4-10.20.30.40`` is ``heterofl``), each group checked as a row (one protocol, one run per
    seed). Order: datasets and cells as ``order`` first names them (a sweep's variants), methods likewise, then
    alphabetically."""
    cells: Dict[Tuple[str, str, str], List[Dict[str, Any]]] = {}
    for run in runs:
        config = run["config"]
        cells.setdefault((config["dataset"], partition_label(config), ladder_label(config)), []).append(run)
    rank = {name: i for i, name in enumerate(order)}
    groups: Dict[Tuple[str, str, str, str], List[Dict[str, Any]]] = {}
    for (dataset, partition, ladder), members in cells.items():
        for run, (_, label) in zip(members, row_keys(members)):
            groups.setdefault((dataset, partition, ladder, label), []).append(run)
    for (dataset, partition, ladder, label), members in groups.items():
        check_row(dataset, f"{label} ({partition}, {ladder})", members)

    def position(members):
        return min((rank[n] for r in members for n in (sweep_name(r), r["config"]["algorithm"]) if n in rank),
                   default=len(rank))

    first_cell = {}
    for key, members in groups.items():
        cell = key[:3]
        first_cell[cell] = min(first_cell.get(cell, len(rank)), position(members))
    return sorted(groups.items(), key=lambda item: (item[0][0], first_cell[item[0][:3]], item[0][1], item[0][2],
                                                    position(item[1]), item[0][3]))


def _over(values: Sequence[Any], scale: float = 1.0) -> Any:
    """A cell over seeds: {mean, std (sample), n} of the seeds with a number (times ``scale``), else the first
    seed's reason (a text)."""
    numbers = [scale * v for v in values if number(v)]
    if numbers:
        mean, std = mean_std(numbers)
        return {"mean": mean, "std": std, "n": len(numbers)}
    return next((v for v in values if isinstance(v, str)), "not recorded")


def default_budgets(runs: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, float]]:
    """Per dataset, the smallest whole-run simulated time and bytes over its clocked runs (so every run compared is
    scored at a point it reached)."""
    budgets: Dict[str, Dict[str, float]] = {}
    for run in runs:
        if not is_clocked(run):
            continue
        times, moved, _ = trajectory(run)
        ends = {"time": float(times[-1]), "bytes": float(moved[-1])}
        own = budgets.setdefault(run["config"]["dataset"], dict(ends))
        for kind, end in ends.items():
            own[kind] = min(own[kind], end)
    return budgets


def check_budget(value: Optional[float], flag: str) -> None:
    """One sentence unless a budget flag is absent or a finite number > 0."""
    if value is not None and not (number(value) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag} is {value!r}; expected a finite number > 0 "
                          + ("(simulated seconds)" if "seconds" in flag else "(bytes down and up)"))


def held_at(run: Dict[str, Any], axis: int, budget: float) -> Dict[str, Any]:
    """What the server held at ``budget`` simulated seconds (``axis`` 0) or bytes moved (1): the latest recorded
    value of each quantity among the rounds finished by then (``global``, ``p=<w>``, ``local_mean``,
    ``local_worst``), or a reason
    (``reason``): the run ended before the budget, or no round had finished by then."""
    path = trajectory(run)
    lines = _metrics(run)
    if path[axis][-1] < budget:
        return {"reason": ENDED}
    done = [line for line, x in zip(lines, path[axis]) if x <= budget]
    if not done:
        return {"reason": NO_ROUND}
    held: Dict[str, Any] = {}
    for line in done:
        if line.get("test_accuracy") is not None:
            held["global"] = line["test_accuracy"]
        for w, value in (line.get("accuracy_at_width") or {}).items():
            if value is not None and width_of(w) is not None:
                held[f"p={width_label(width_of(w))}"] = value
        if "local_accuracy_mean" in line:  # a local-evaluation round (null: no client had a test sample)
            held["local_mean"] = _or(line["local_accuracy_mean"], NO_CLIENT)
            held["local_worst"] = _or(line.get("local_accuracy_worst", NOT_PER_ROUND), NO_CLIENT)
    return held


def _or(value: Any, text: str) -> Any:
    return text if value is None else value


def last_rounds_mean(run: Dict[str, Any], rounds: int = LAST_ROUNDS) -> Any:
    """FedLASE's global accuracy: the mean test accuracy over the run's last ``rounds`` rounds (the metrics.jsonl lines
    whose round is within ``rounds`` of the last one; all of a shorter run's), leaving out a round that recorded none
    (``--test-every``); or :data:`NOT_TESTED`."""
    lines = _metrics(run)
    last = max((line["round"] for line in lines if number(line.get("round"))), default=None)
    window = lines[-rounds:] if last is None else [line for line in lines if number(line.get("round"))
                                                                and line["round"] > last - rounds]
    values = [line["test_accuracy"] for line in window if number(line.get("test_accuracy"))]
    return sum(values) / len(values) if values else NOT_TESTED


def _widths(members: Sequence[Dict[str, Any]]) -> List[float]:
    return sorted({width_of(w) for r in members for w in (r["summary"].get("accuracy_at_width_final") or {})
                   if width_of(w) is not None}, reverse=True)


def _local(run: Dict[str, Any], statistic: str) -> Any:
    block = run["summary"].get("local_accuracy")
    if isinstance(block, dict):
        return block.get(statistic) if block.get(statistic) is not None else "no client scored"
    return block if isinstance(block, str) else "not recorded"


def league_table(runs: Sequence[Dict[str, Any]], order: Sequence[str] = (), budget_seconds: Optional[float] = None,
                 budget_bytes: Optional[float] = None) -> Optional[Dict[str, Any]]:
    """The league table (None unless some run has a device clock): ``rows`` per (dataset, partition, ladder,
    method) with ``cells`` (accuracies in %, times in s, bytes): at equal rounds ``global``, ``global_last20``
    (:func:`last_rounds_mean`), ``p=<w>``,
    ``local_mean``, ``local_worst``; at equal time ``time_to_<target>_s`` and the same four ``...@time``; at equal
    bytes ``bytes_to_<target>`` and the four ``...@bytes``. ``budgets``: per dataset the time and bytes budget and
    whether a flag gave it (default: :func:`default_budgets`). ``tested_every``: the caption's words for runs that
    tested only every K rounds (:func:`~hasfl_ray.analysis.clocked.tested_every`; "" where every run tested each
    round)."""
    check_budget(budget_seconds, "--budget-seconds")
    check_budget(budget_bytes, "--budget-bytes")
    if not any(is_clocked(run) for run in runs):
        given = next((flag for flag, value in (("--budget-seconds", budget_seconds), ("--budget-bytes", budget_bytes))
                      if value is not None), None)
        if given:
            raise ConfigError(f"{given} is given but no run reported has a device clock; expected runs made with "
                              "--devices (docs/clock.md), or no budget")
        return None
    defaults = default_budgets(runs)
    budgets = {dataset: {"time": budget_seconds if budget_seconds is not None else ends["time"],
                         "bytes": budget_bytes if budget_bytes is not None else ends["bytes"],
                         "time_given": budget_seconds is not None, "bytes_given": budget_bytes is not None}
               for dataset, ends in defaults.items()}
    rows = []
    for (dataset, partition, ladder, method), members in league_groups(runs, order):
        widths = _widths(members)
        clocked = [is_clocked(r) for r in members]
        cells: Dict[str, Any] = {"global": _over([r["summary"]["final_accuracy"] for r in members], 100),
                                 f"global_last{LAST_ROUNDS}": _over([last_rounds_mean(r) for r in members], 100)}
        for w in widths:
            cells[f"p={width_label(w)}"] = _over([(r["summary"].get("accuracy_at_width_final") or {})
                                                  .get(width_label(w), "not evaluated") for r in members], 100)
        cells["local_mean"] = _over([_local(r, "mean") for r in members], 100)
        cells["local_worst"] = _over([_local(r, "worst") for r in members], 100)
        for kind, axis, _, _ in AXES:
            for target in LEAGUE_TARGETS:
                key = f"time_to_{width_label(target)}_s" if kind == "time" else f"bytes_to_{width_label(target)}"
                hits = [first_reached(r, target) if c else NO_CLOCK for r, c in zip(members, clocked)]
                cells[key] = _over([h[axis] if isinstance(h, tuple) else (h or NOT_REACHED) for h in hits])
            held = [held_at(r, axis, budgets[dataset][kind]) if c else {"reason": NO_CLOCK}
                    for r, c in zip(members, clocked)]
            for name in ["global"] + [f"p={width_label(w)}" for w in widths] + ["local_mean", "local_worst"]:
                missing = NOT_LOCAL if name.startswith("local_") else NOT_EVALUATED
                cells[f"{name}@{kind}"] = _over([h.get(name, h.get("reason", missing)) for h in held], 100)
        rows.append({"dataset": dataset, "partition": partition, "ladder": ladder, "algorithm": method,
                     "cell": f"{partition}, {ladder}", "seeds": sorted(r["config"]["seed"] for r in members),
                     "rounds": min(len(_metrics(r)) for r in members),  # the shortest seed's recorded rounds
                     "clocked": all(clocked), "widths": [width_label(w) for w in widths], "cells": cells})
    return {"name": "league", "title": "The sub-model league", "rows": rows, "budgets": budgets,
            "targets": list(LEAGUE_TARGETS), "tested_every": tested_every(runs)}


def cell_text(cell: Any, seeds: int, scale: float = 1.0, decimals: Optional[int] = 1) -> str:
    """``mean ± std`` (``decimals`` after the point, or three significant figures), no ± from one seed, ``(n/seeds)``
    when some seeds have no value; or the reason there is none."""
    if isinstance(cell, str):
        return cell
    mean = f"{cell['mean'] / scale:.{decimals}f}" if decimals is not None else _figure(cell["mean"], scale)
    places = decimals if decimals is not None else (len(mean.split(".")[1]) if "." in mean else 0)
    text = mean if cell["n"] == 1 else f"{mean} ± {cell['std'] / scale:.{places}f}"
    return text + (f" ({cell['n']}/{seeds} seeds)" if cell["n"] < seeds else "")


def units(table: Mapping[str, Any]) -> Dict[str, Tuple[float, str]]:
    """The display unit of times and of bytes: the largest that the largest budget reaches ten times."""
    budgets = table["budgets"].values()
    return {"time": _unit(max([b["time"] for b in budgets] or [0.0]), TIME_UNITS),
            "bytes": _unit(max([b["bytes"] for b in budgets] or [0.0]), BYTE_UNITS)}


def sections(table: Mapping[str, Any]) -> List[Tuple[Tuple[str, str], List[Dict[str, Any]]]]:
    """The rows by (dataset, ladder), in the table's order: one width set per section."""
    found: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for row in table["rows"]:
        found.setdefault((row["dataset"], row["ladder"]), []).append(row)
    return list(found.items())


def section_widths(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    return sorted({w for row in rows for w in row["widths"]}, key=float, reverse=True)


def league_columns(kind: str, widths: Sequence[str], unit: Mapping[str, Tuple[float, str]]
                   ) -> List[Tuple[str, str, float, Optional[int]]]:
    """(key, header, scale, decimals) of one of the three views: ``rounds``, ``time`` or ``bytes``."""
    accuracy = [("global", "Global (%)")] + [(f"p={w}", f"p = {w} (%)") for w in widths] + [
        ("local_mean", "Local mean (%)"), ("local_worst", "Local worst (%)")]
    if kind == "rounds":  # FedLASE's mean over the last rounds beside the run's end
        accuracy.insert(1, (f"global_last{LAST_ROUNDS}", f"Global, last {LAST_ROUNDS} rounds (%)"))
        return [(key, header, 1.0, 1) for key, header in accuracy]
    scale, name = unit[kind]
    reach = [(f"time_to_{width_label(t)}_s" if kind == "time" else f"bytes_to_{width_label(t)}",
              f"{'Time' if kind == 'time' else 'Data'} to {100 * t:g} % ({name})", scale, None)
             for t in LEAGUE_TARGETS]
    return reach + [(f"{key}@{kind}", header, 1.0, 1) for key, header in accuracy]
