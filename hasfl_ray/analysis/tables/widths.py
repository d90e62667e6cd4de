"""Issue 25's tables: accuracy at each width, global vs local accuracy, fairness over clients; markdown, CSV, LaTeX."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from hasfl_ray.analysis.rows import run_groups
from hasfl_ray.analysis.runs import LOCAL_KEYS, LOCAL_STATISTICS, NOT_RECORDED, number, width_of
from hasfl_ray.analysis.statistics import mean_std
from hasfl_ray.analysis.tables.layout import (_latex_grid, _markdown_grid, _tex, display_name, over_seeds,
                                              spread)
from hasfl_ray.analysis.tables.summary import table_csv


def _stat(values: Sequence[Any]) -> Any:
    """A cell over seeds: {mean, std, n} (×100, sample std) of the seeds whose value is a number; else the text of
    a seed saying why it is not defined for its dataset; else :data:`NOT_RECORDED` (runs written before)."""
    numbers = [100 * value for value in values if number(value)]
    if numbers:
        mean, std = mean_std(numbers)
        return {"mean": mean, "std": std, "n": len(numbers)}
    return next((value for value in values if isinstance(value, str)), NOT_RECORDED)


def _widths(run: Dict[str, Any], key: str, block: Any = None) -> Dict[float, Any]:
    """summary.json's ``key`` (or ``block``'s, for per_tier) as {width: value}; {} where it is not recorded."""
    value = (run["summary"] if block is None else block).get(key)
    return {width_of(w): v for w, v in value.items()} if isinstance(value, dict) else {}


def _local(run: Dict[str, Any], key: str = "local_accuracy") -> Any:
    """A run's local accuracy block: a dict, the text of a dataset where it is not defined, or None."""
    return run["summary"].get(key)


#: summary.json's local_accuracy width, in words.
LOCAL_WIDTHS = {"final": "its final p", "p_max": "its capacity p^max"}
#: A local accuracy statistic that is null: no client of the run had a test sample of its labels.
NO_CLIENT_SCORED = "no client scored"


def _statistic(block: Any, key: str) -> Any:
    """Statistic ``key`` of a local accuracy block (:data:`NO_CLIENT_SCORED` where null), or the block's text, or
    None (not recorded)."""
    if not isinstance(block, dict):
        return block
    return NO_CLIENT_SCORED if block.get(key) is None else block[key]


def _width_label(width: float) -> str:
    return format(width, "g")


def width_tables(runs: Sequence[Dict[str, Any]], order: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The tables of issue 25, each ``{"name", "title", "caption", "columns": [(key, markdown, TeX)], "rows"}`` (rows
    as :func:`summarise_runs`'s, with ``cells`` {key: a :func:`_stat` cell}), or ``{"name", "omitted": why}`` when no
    run holds its fields: ``widths`` (final accuracy of the global model cut to each width, FjORD's curve and
    HeteroFL's level table), ``local`` (global against local accuracy, masked and unmasked) and ``fairness`` (the
    masked local accuracy's mean, worst client, 10th percentile, median and per-tier mean)."""
    groups = run_groups(runs, order)
    widths = sorted({w for run in runs for w in _widths(run, "accuracy_at_width_final")})
    tiers = sorted({w for run in runs if isinstance(_local(run), dict) for w in _widths(run, "per_tier", _local(run))})
    tables = []

    def table(name, title, caption, columns, cells, omitted):
        if omitted:
            tables.append({"name": name, "omitted": omitted})
            return
        rows = [{"dataset": dataset, "algorithm": algorithm, "seeds": sorted(r["config"]["seed"] for r in members),
                 "cells": cells(members)} for (dataset, algorithm), members in groups]
        tables.append({"name": name, "title": title, "caption": caption, "columns": columns, "rows": rows})

    table("widths", "Accuracy at each width",
          "Final test accuracy (%) of the global model cut to width p, the sub-model the algorithm hands a client of "
          "that width (docs/metrics.md)",
          [(f"p={_width_label(w)}", f"p = {_width_label(w)}", f"$p={_width_label(w)}$") for w in widths],
          lambda members: {f"p={_width_label(w)}{suffix}": _stat([_widths(r, key).get(w) for r in members])
                           for w in widths for suffix, key in (("", "accuracy_at_width_final"),
                                                               ("_best", "accuracy_at_width_best"))},
          "" if widths else "no run records accuracy_at_width_final in summary.json (runs written before per-width "
                            "evaluation)")
    recorded = any(key in run["summary"] for run in runs for key in LOCAL_KEYS)
    table("local", "Global and local accuracy",
          "Global: final test accuracy (%) of the full-width model; local: mean over clients of the accuracy (%) on "
          "the test samples of the labels each client holds, at its own width, logits masked to those labels or not "
          "(HeteroFL's global and local; docs/metrics.md); a client's width: " + (", ".join(sorted(
              {LOCAL_WIDTHS.get(b.get("width"), str(b.get("width"))) for run in runs for b in [_local(run)]
               if isinstance(b, dict)})) or "not recorded"),
          [("global", "Global acc. (%)", "Global"), ("local", "Local acc., masked (%)", "Local (masked)"),
           ("local_unmasked", "Local acc., unmasked (%)", "Local (unmasked)")],
          lambda members: {"global": _stat([r["summary"]["final_accuracy"] for r in members]),
                           **{name: _stat([_statistic(_local(r, key), "mean") for r in members])
                              for name, key in (("local", "local_accuracy"),
                                                ("local_unmasked", "local_accuracy_unmasked"))}},
          "" if recorded else "no run records local_accuracy in summary.json (runs written before local evaluation)")
    defined = any(isinstance(_local(run), dict) for run in runs)
    table("fairness", "Fairness over clients",
          "Masked local accuracy (%) over clients: mean, worst client, 10th percentile, median, and the mean of each "
          "capacity tier p^max (HASA's worst and tail; docs/metrics.md)",
          [(s, h, h) for s, h in (("mean", "Mean"), ("worst", "Worst"), ("p10", "P10"), ("median", "Median"))]
          + [(f"tier={_width_label(w)}", f"Tier p^max = {_width_label(w)}", rf"$p^{{\max}}={_width_label(w)}$")
             for w in tiers],
          lambda members: {**{s: _stat([_statistic(_local(r), s) for r in members]) for s in LOCAL_STATISTICS},
                           **{f"tier={_width_label(w)}": _stat([_widths(r, "per_tier", b).get(w) if isinstance(b, dict)
                                                                else b for r, b in zip(members, map(_local, members))])
                              for w in tiers}},
          "" if defined else "no run has per-client local accuracies in summary.json (" + (
              "not defined for its dataset" if recorded else "runs written before local evaluation") + ")")
    return tables


def _cell_text(cell: Any, seeds: int, tex: bool = False) -> str:
    """``mean ± std`` (with ``(n/seeds seeds)`` when some seeds did not record it), or the reason there is none."""
    if isinstance(cell, str):
        text = "not defined" if cell.startswith("not defined") else cell
        return _tex(text) if tex else text
    text = spread(cell["mean"], cell["std"], cell["n"], tex)
    return text + (f" ({cell['n']}/{seeds} seeds)" if cell["n"] < seeds else "")


def _undefined_notes(table: Mapping[str, Any]) -> List[str]:
    """Why the cells saying "not defined" say so (once per reason)."""
    reasons = {cell for row in table["rows"] for cell in row["cells"].values()
               if isinstance(cell, str) and cell.startswith("not defined")}
    return [f"not defined: {reason}" for reason in sorted(reasons)]


def grid_markdown(table: Mapping[str, Any]) -> str:
    """A :func:`width_tables` table in markdown: the caption below it, then why any cell says "not defined"."""
    body = [[display_name(row["dataset"]), display_name(row["algorithm"]), ", ".join(str(s) for s in row["seeds"])]
            + [_cell_text(row["cells"][key], len(row["seeds"])) for key, _, _ in table["columns"]]
            for row in table["rows"]]
    lines = _markdown_grid(["Dataset", "Algorithm", "Seeds"] + [header for _, header, _ in table["columns"]], body)
    lines += ["", table["caption"] + f"; {over_seeds([len(row['seeds']) for row in table['rows']])}."]
    lines += [f"- {note}" for note in _undefined_notes(table)]
    return "\n".join(lines) + "\n"


def grid_csv(table: Mapping[str, Any]) -> str:
    """A :func:`width_tables` table as CSV: per cell ``<key>_mean``, ``<key>_std`` and ``<key>_seeds`` (how many
    seeds recorded it); a cell without numbers has its reason in ``<key>_mean``."""
    keys = list(dict.fromkeys(key for row in table["rows"] for key in row["cells"]))
    columns = ["dataset", "algorithm", "seeds"] + [f"{key}_{part}" for key in keys for part in ("mean", "std", "seeds")]
    rows = [{"dataset": row["dataset"], "algorithm": row["algorithm"], "seeds": row["seeds"],
             **{f"{key}_{part}": cell.get(name) if isinstance(cell, dict) else (cell if part == "mean" else None)
                for key, cell in row["cells"].items() for part, name in (("mean", "mean"), ("std", "std"),
                                                                         ("seeds", "n"))}}
            for row in table["rows"]]
    return table_csv(rows, columns)


def grid_latex(table: Mapping[str, Any], caption: str) -> str:
    """A :func:`width_tables` table as a booktabs table in the layout of :func:`table_latex`."""
    body = [[_tex(display_name(row["algorithm"]))]
            + [_cell_text(row["cells"][key], len(row["seeds"]), tex=True) for key, _, _ in table["columns"]]
            for row in table["rows"]]
    header = " & ".join(["Dataset", "Algorithm"] + [tex for _, _, tex in table["columns"]])
    return _latex_grid(table["rows"], body, f"{table['title']}, {caption}" if caption else table["title"],
                       "ll" + "c" * len(table["columns"]), header)


def omitted_lines(tables: Sequence[Mapping[str, Any]]) -> List[str]:
    """One line per :func:`width_tables` table left out, saying why."""
    return [f"{table['name']} table omitted: {table['omitted']}" for table in tables if "omitted" in table]
