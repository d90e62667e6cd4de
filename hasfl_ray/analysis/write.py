"""write_report: a sweep's tables, confound analysis and figures as files (above both the report and the plots)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence

from hasfl_ray.analysis.clocked import clock_latex, clock_markdown, clock_table
from hasfl_ray.analysis.league import league_table
from hasfl_ray.analysis.league_figure import plot_league
from hasfl_ray.analysis.plots import load_metrics, plot_runs
from hasfl_ray.analysis.report import (CONFOUND_COLUMNS, analyze_runs, confound_latex, confound_markdown, display_name,
                                       grid_csv, grid_latex, grid_markdown, omitted_lines, summarise_runs, table_csv,
                                       table_latex, table_markdown, width_tables)
from hasfl_ray.analysis.tables.league import league_csv, league_latex, league_markdown
from hasfl_ray.files import atomic_write


def write_report(runs: Sequence[Dict[str, Any]], out_dir: str, order: Sequence[str] = (),
                 title: str = "", budget_seconds: Optional[float] = None,
                 budget_bytes: Optional[float] = None, note: str = "", fmt: str = "png") -> List[str]:
    """table.{md,csv,tex} (the paper's table layout), widths, local and fairness.{md,csv,tex} (accuracy at each
    width, global against local accuracy, fairness over clients: each when some run records its fields, else a line
    in table.md saying why it is left out), clock.{md,csv,tex} (time and data to accuracy, when some run has a device
    clock), league.{md,csv,tex} and <dataset>-league.<fmt> (the sub-model league at equal rounds, time and bytes, at
    ``budget_seconds`` and ``budget_bytes`` or the smallest run's totals; when some run has a device clock),
    confound.{md,csv,tex} and analysis.json (Table 5, when some run has H̃
    estimates) and the figures under ``out_dir``; returns the paths written. ``note``: a line table.md ends
    with (a sweep's unfinished cells); ``fmt``: the figures' format (png, pdf or svg)."""
    load_metrics(runs)
    os.makedirs(out_dir, exist_ok=True)
    rows = summarise_runs(runs, order)
    datasets = ", ".join(display_name(d) for d in dict.fromkeys(r["dataset"] for r in rows))
    caption = f"{title}, {datasets}" if title else datasets
    tables = width_tables(runs, order)
    omitted = "".join(f"\n{line}\n" for line in omitted_lines(tables) + ([note] if note else []))
    files = {"table.md": (f"# {title}\n\n" if title else "") + table_markdown(rows) + omitted,
             "table.csv": table_csv(rows), "table.tex": table_latex(rows, caption)}
    for table in tables:
        if "omitted" not in table:
            heading = f"# {title}: {table['title']}" if title else f"# {table['title']}"
            files.update({f"{table['name']}.md": f"{heading}\n\n{grid_markdown(table)}",
                          f"{table['name']}.csv": grid_csv(table),
                          f"{table['name']}.tex": grid_latex(table, caption)})
    clock = clock_table(runs, order)
    if clock is not None:  # runs with a device clock (issue 26): time and bytes to accuracy
        heading = f"# {title}: {clock['title']}" if title else f"# {clock['title']}"
        files.update({"clock.md": f"{heading}\n\n{clock_markdown(clock)}", "clock.csv": grid_csv(clock),
                      "clock.tex": clock_latex(clock, caption)})
    league = league_table(runs, order, budget_seconds, budget_bytes)
    if league is not None:  # the sub-model league (issue 44 item 4), beside the clock's table
        files.update({"league.md": league_markdown(league, title), "league.csv": league_csv(league),
                      "league.tex": league_latex(league, title)})
    analysis = analyze_runs(runs)
    if analysis["runs"]:
        files["confound.md"] = confound_markdown(analysis)
        files["confound.csv"] = table_csv(analysis["runs"] + [
            {**r, "seed": "pooled " + " ".join(str(s) for s in r["seeds"])} for r in analysis["pooled"]],
            CONFOUND_COLUMNS)
        files["confound.tex"] = confound_latex(analysis)
        files["analysis.json"] = json.dumps(analysis, indent=2) + "\n"
    written = []
    for name, text in files.items():
        path = os.path.join(out_dir, name)
        atomic_write(path, text.encode())
        written.append(path)
    figures = plot_runs(runs, out_dir, order, fmt)
    return written + figures + (plot_league(runs, out_dir, league, order, fmt) if league is not None else [])
