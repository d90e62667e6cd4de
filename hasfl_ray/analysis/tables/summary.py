"""The paper's results table (Tables 4 and 6): accuracy over seeds per dataset and algorithm; markdown, CSV, LaTeX."""

from __future__ import annotations

import csv
import io
from typing import Any, Dict, List, Mapping, Sequence, Union

import numpy as np

from hasfl_ray.analysis.rows import run_groups
from hasfl_ray.analysis.statistics import mean_std
from hasfl_ray.analysis.tables.layout import (_latex_grid, _markdown_grid, _tex, display_name, over_seeds,
                                              spread)


#: Table 6's Type column: what each method trains (a plug-in is a sub-model method of its own).
ALGORITHM_TYPES = {"fedavg": "Full-model", "scaffold": "Full-model + CV", "fedprox": "Full-model + prox",
                   "hasfl": "Sub-model (adaptive)", "hasfl (coverage off)": "Sub-model (adaptive)",
                   "random-budget": "Sub-model (random)", "heterofl": "Sub-model (static)",
                   "fjord": "Sub-model (ordered dropout)", "uniform": "Sub-model (uniform)",
                   "fedrolex": "Sub-model (rolling)"}
TABLE_COLUMNS = ("dataset", "algorithm", "type", "seeds", "best_mean", "best_std", "final_mean", "final_std",
                 "peak_to_final", "avg_p", "coverage_warnings", "frozen_fraction")


def algorithm_type(method: Union[str, Mapping[str, Any]]) -> str:
    """What a method trains (Table 6's Type column): of a run's config (its ``algorithm``, whatever its row is named:
    a sweep variant, an asynchronous rule), or of an algorithm name."""
    name = method["algorithm"] if isinstance(method, Mapping) else method
    return ALGORITHM_TYPES.get(name, "Sub-model (plug-in)" if ":" in name else "Sub-model")


def _row_type(row: Mapping[str, Any]) -> str:
    """A table row's type: the one :func:`summarise_runs` found from its runs, else its label's."""
    return row.get("type") or algorithm_type(row["algorithm"])


def summarise_runs(runs: Sequence[Dict[str, Any]], order: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """Rows of (dataset, algorithm): the method's type (Table 6's column), seeds, best/final accuracy mean and sample
    std (×100), the peak-to-final change of the means (final − best, the paper's Table 4 column), mean avg_p. Rows
    follow ``order`` (see :func:`~hasfl_ray.analysis.rows.run_groups`)."""
    rows = []
    for (dataset, algorithm), members in run_groups(runs, order):
        best_mean, best_std = mean_std([100 * r["summary"]["best_accuracy"] for r in members])
        final_mean, final_std = mean_std([100 * r["summary"]["final_accuracy"] for r in members])
        rows.append({"dataset": dataset, "algorithm": algorithm, "type": algorithm_type(members[0]["config"]),
                     "seeds": sorted(r["config"]["seed"] for r in members),
                     "best_mean": best_mean, "best_std": best_std, "final_mean": final_mean, "final_std": final_std,
                     "peak_to_final": final_mean - best_mean,
                     "avg_p": float(np.mean([r["summary"]["avg_p"] for r in members])),
                     **_coverage_columns(members)})
    return rows


def _coverage_columns(members: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """How many of the seeds ended with part of the model never trained (summary.json's ``coverage_warning``, the
    coverage monitor), and their mean frozen fraction (None when none did)."""
    warned = [r["summary"]["coverage_warning"] for r in members if r["summary"].get("coverage_warning")]
    return {"coverage_warnings": len(warned),
            "frozen_fraction": float(np.mean([w["frozen_fraction"] for w in warned])) if warned else None}


def table_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    """The paper's table layout: Best, Final, Peak→final, Avg p (mean ± std over seeds, accuracies in %); a row
    whose runs kept part of the model untrained after warm-up (the coverage monitor) is marked ‡ and explained."""
    body = [[display_name(row["dataset"]), display_name(row["algorithm"]) + (" ‡" if row.get("coverage_warnings")
                                                                               else ""),
             _row_type(row), ", ".join(str(s) for s in row["seeds"]),
             spread(row["best_mean"], row["best_std"], len(row["seeds"])),
             spread(row["final_mean"], row["final_std"], len(row["seeds"])),
             f"{row['peak_to_final']:+.1f}", f"{row['avg_p']:.2f}"] for row in rows]
    lines = _markdown_grid(["Dataset", "Algorithm", "Type", "Seeds", "Best acc. (%)", "Final acc. (%)",
                            "Peak→final Δ", "Avg. p"], body)
    if rows and min(len(row["seeds"]) for row in rows) < 2:
        lines += ["", f"Accuracies: {over_seeds([len(row['seeds']) for row in rows])}."]
    if any(row.get("coverage_warnings") for row in rows):
        lines += ["", "‡ coverage warning: in these runs part of the global model stayed at its initial value after "
                      "warm-up (no participant covered those coordinates); the frozen fraction is in table.csv."]
    return "\n".join(lines) + "\n"


def table_csv(rows: Sequence[Dict[str, Any]], columns: Sequence[str] = TABLE_COLUMNS) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        row = {**row, "type": _row_type(row)} if "algorithm" in row else row
        writer.writerow({k: (" ".join(str(s) for s in v) if isinstance(v, list) else ("" if v is None else v))
                         for k, v in row.items()})
    return buffer.getvalue()


def table_latex(rows: Sequence[Dict[str, Any]], caption: str) -> str:
    """A booktabs table in the paper's layout (the dataset named on its first row, a rule between datasets)."""
    body = [[_tex(display_name(row["algorithm"])), _tex(_row_type(row)),
             spread(row["best_mean"], row["best_std"], len(row["seeds"]), tex=True) + r"\%",
             spread(row["final_mean"], row["final_std"], len(row["seeds"]), tex=True) + r"\%",
             f"${row['peak_to_final']:+.1f}$",
             f"{row['avg_p']:.2f}"] for row in rows]
    return _latex_grid(rows, body, caption, "lllcccc",
                       r"Dataset & Algorithm & Type & Best Acc. & Final Acc. & Peak$\to$final $\Delta$ & Avg.\ $p$")
