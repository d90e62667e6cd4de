"""The league table (:func:`hasfl_ray.analysis.league.league_table`) as markdown, CSV and LaTeX: per dataset and width
ladder, three views (equal rounds, equal simulated time, equal bytes), a row per partition and method."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from hasfl_ray.analysis.league import (AXES, LAST_ROUNDS, NO_CLOCK_LINE, REASONS, cell_text, league_columns,
                                       section_widths, sections, units)
from hasfl_ray.analysis.tables.layout import _markdown_grid, _tex, display_name
from hasfl_ray.analysis.tables.summary import table_csv

#: The three views: (kind, heading).
VIEWS = (("rounds", "At equal rounds (each run's last round)"), ("time", "At equal simulated time"),
         ("bytes", "At equal bytes (down and up)"))
CAPTION = ("Per method and cell (dataset, partition, width ladder): global test accuracy (%) of the full model "
           "(at equal rounds also its mean over the run's last 20 rounds, FedLASE's metric), "
           "accuracy (%) of the global model cut to each width, and the masked local accuracy's mean and worst client "
           "(docs/metrics.md); at equal rounds (each run's end), at equal simulated time and at equal bytes (the device "
           "clock, docs/clock.md): the time and bytes moved until the end of the first round whose test accuracy "
           "reached 50 % and 70 %, and each accuracy the server held at the budget (that of the last round finished "
           "by then that evaluated it). Mean ± std over seeds (no ± for one seed; (n/k seeds) where only n of k seeds "
           "have a value)")


def budget_line(table: Mapping[str, Any], dataset: str, kind: str) -> str:
    """The budget of ``kind`` (time or bytes) of ``dataset`` in words, with where it came from."""
    budget = table["budgets"].get(dataset)
    flag = next(flag for name, _, flag, _ in AXES if name == kind)
    if budget is None:
        return "no run of this dataset has a clock"
    scale, unit = units(table)[kind]
    value = cell_text({"mean": budget[kind], "std": 0.0, "n": 1}, 1, scale, None)
    origin = f"given by {flag}" if budget[f"{kind}_given"] else f"the smallest whole run's total here ({flag} sets it)"
    return f"budget {value} {unit}, {origin}"


def _body(rows: Sequence[Mapping[str, Any]], columns) -> List[List[str]]:
    return [[row["partition"], display_name(row["algorithm"]), ", ".join(str(s) for s in row["seeds"])]
            + [cell_text(row["cells"].get(key, "-"), len(row["seeds"]), scale, decimals)
               for key, _, scale, decimals in columns] for row in rows]


def _notes(rows: Sequence[Mapping[str, Any]], kind: str, columns) -> List[str]:
    """The lines under a view: which rows have no clock (once), and what each other text in its cells means."""
    texts = {cell for row in rows for key, _, _, _ in columns for cell in [row["cells"].get(key)]
             if isinstance(cell, str)}
    notes = [f"{text}: {REASONS[text]}" for text in REASONS if text in texts]
    short = [row for row in rows if row.get("rounds", LAST_ROUNDS) < LAST_ROUNDS]
    if short and kind == "rounds":  # the header says 20: the cells of shorter runs are means over fewer
        fewest = min(row["rounds"] for row in short)
        notes.append(f"Global, last {LAST_ROUNDS} rounds: {len(short)} of the {len(rows)} rows' runs recorded fewer "
                     f"than {LAST_ROUNDS} rounds (the fewest: {fewest}), so their cells are means over all of them")
    unclocked = [f"{display_name(row['algorithm'])} ({row['partition']})" for row in rows if not row["clocked"]]
    if unclocked and kind != "rounds":
        notes.append(NO_CLOCK_LINE.format(rows=", ".join(unclocked)))
    return notes


def league_heading(table: Mapping[str, Any], title: str = "") -> str:
    """The league's heading: ``title: The sub-model league``, or the title alone where it already begins with the
    table's name (the league configs' ``reproduces``: "The sub-model league on CIFAR-10 (...)")."""
    if not title:
        return table["title"]
    return title if title.startswith(table["title"]) else f"{title}: {table['title']}"


def league_markdown(table: Mapping[str, Any], title: str = "") -> str:
    """The league in markdown: a section per dataset and ladder, each with its three views."""
    unit = units(table)
    lines = [f"# {league_heading(table, title)}", "", CAPTION + table.get("tested_every", "") + "."]
    for (dataset, ladder), rows in sections(table):
        lines += ["", f"## {display_name(dataset)}, {ladder}"]
        widths = section_widths(rows)
        for kind, heading in VIEWS:
            columns = league_columns(kind, widths, unit)
            extra = "" if kind == "rounds" else f" ({budget_line(table, dataset, kind)})"
            lines += ["", f"### {heading}{extra}", ""]
            lines += _markdown_grid(["Partition", "Method", "Seeds"] + [header for _, header, _, _ in columns],
                                    _body(rows, columns))
            notes = _notes(rows, kind, columns)
            if notes:
                lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def league_csv(table: Mapping[str, Any]) -> str:
    """The league as CSV, one row per (dataset, partition, ladder, method): per cell ``<key>_mean``, ``_std`` and
    ``_seeds`` in raw units (accuracy %, seconds, bytes; a cell without a number has its reason in ``_mean``), and
    the dataset's ``budget_seconds`` and ``budget_bytes``."""
    keys = list(dict.fromkeys(key for row in table["rows"] for key in row["cells"]))
    columns = ["dataset", "partition", "ladder", "algorithm", "seeds", "clocked", "budget_seconds", "budget_bytes"] + [
        f"{key}_{part}" for key in keys for part in ("mean", "std", "seeds")]
    rows: List[Dict[str, Any]] = []
    for row in table["rows"]:
        budget = table["budgets"].get(row["dataset"]) or {}
        flat: Dict[str, Any] = {name: row[name] for name in ("dataset", "partition", "ladder", "algorithm", "seeds")}
        flat.update(clocked=row["clocked"], budget_seconds=budget.get("time"), budget_bytes=budget.get("bytes"))
        for key, cell in row["cells"].items():
            for part, name in (("mean", "mean"), ("std", "std"), ("seeds", "n")):
                flat[f"{key}_{part}"] = cell.get(name) if isinstance(cell, dict) else (cell if part == "mean" else None)
        rows.append(flat)
    return table_csv(rows, columns)


def league_latex(table: Mapping[str, Any], title: str = "") -> str:
    """The league as booktabs tables, one per dataset, ladder and view."""
    unit = units(table)
    out = []
    for (dataset, ladder), rows in sections(table):
        widths = section_widths(rows)
        for kind, heading in VIEWS:
            columns = league_columns(kind, widths, unit)
            extra = "" if kind == "rounds" else f", {budget_line(table, dataset, kind)}{table.get('tested_every', '')}"
            caption = f"{league_heading(table, title)}: {display_name(dataset)}, {ladder}: {heading}{extra}"
            header = " & ".join(["Partition", "Method", "Seeds"] + [_tex(h) for _, h, _, _ in columns])
            lines = [r"\begin{table}[!htbp]", r"\centering", rf"\caption{{{_tex(caption)}}}", r"\footnotesize",
                     rf"\begin{{tabular}}{{lll{'c' * len(columns)}}}", r"\toprule", header + r" \\", r"\midrule"]
            lines += [" & ".join(_tex(c).replace("±", r"$\pm$") for c in cells) + r" \\"
                      for cells in _body(rows, columns)]
            lines += [r"\bottomrule", r"\end{tabular}"]
            lines += [rf"\par\footnotesize {_tex(note)}" for note in _notes(rows, kind, columns)]
            out.append("\n".join(lines + [r"\end{table}"]))
    return "\n\n".join(out) + "\n"
