"""write_report: a sweep's tables, confound analysis and figures as files (above both the report and the plots)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Sequence

from hasfl_ray.analysis.plots import load_metrics, plot_runs
from hasfl_ray.analysis.report import (CONFOUND_COLUMNS, analyze_runs, confound_latex, confound_markdown, display_name,
                                       summarise_runs, table_csv, table_latex, table_markdown)
from hasfl_ray.files import atomic_write


def write_report(runs: Sequence[Dict[str, Any]], out_dir: str, order: Sequence[str] = (),
                 title: str = "") -> List[str]:
    """table.{md,csv,tex} (the paper's table layout), confound.{md,csv,tex} and analysis.json (Table 5, when some
    run has H̃ estimates) and the figures (PNG) under ``out_dir``; returns the paths written."""
    load_metrics(runs)
    os.makedirs(out_dir, exist_ok=True)
    rows = summarise_runs(runs, order)
    datasets = ", ".join(display_name(d) for d in dict.fromkeys(r["dataset"] for r in rows))
    caption = f"{title}, {datasets}" if title else datasets
    files = {"table.md": (f"# {title}\n\n" if title else "") + table_markdown(rows), "table.csv": table_csv(rows),
             "table.tex": table_latex(rows, caption)}
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
    return written + plot_runs(runs, out_dir, order)
