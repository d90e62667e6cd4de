"""Table 5: the estimates' correlations with label divergence and capacity, per run and pooled; markdown, LaTeX."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from hasfl_ray.analysis.rows import row_members, run_groups
from hasfl_ray.analysis.statistics import CONFOUND_KEYS, confound_statistics
from hasfl_ray.analysis.tables.layout import _tex, display_name


CONFOUND_COLUMNS = ("dataset", "algorithm", "seed", "n_clients") + tuple(
    k for key in CONFOUND_KEYS for k in (key, "pvalue_" + key[2:])) + ("verdict",)


def confound_correlations(run: Dict[str, Any]) -> Dict[str, Any]:
    """The paper's Table 5 for one run (see :func:`confound_statistics`); empty for runs without H̃ estimates."""
    return confound_statistics(run["clients"])


def analyze_runs(runs: Sequence[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """Table 5 per run (runs with H̃ estimates) and pooled over the seeds of each row of the report (the clients of
    every seed's run together; rows as every table's, :func:`~hasfl_ray.analysis.rows.run_groups` over all ``runs``:
    never runs of another variant or protocol). ``{"runs": [...], "pooled": [...]}``, each row naming its run(s)."""
    results = {id(run): confound_correlations(run) for run in runs}
    groups = row_members(run_groups(runs), lambda run: bool(results[id(run)]))
    labels = {id(run): label for (_, label), members in groups for run in members}
    per_run = [{"run": run["path"], "dataset": run["config"]["dataset"], "algorithm": labels[id(run)],
                "seed": run["config"]["seed"], **results[id(run)]} for run in runs if results[id(run)]]
    pooled = []
    for (dataset, algorithm), members in sorted(groups, key=lambda item: item[0]):
        clients = [c for r in members for c in r["clients"]]
        pooled.append({"dataset": dataset, "algorithm": algorithm,
                       "seeds": sorted(r["config"]["seed"] for r in members),
                       "runs": [r["path"] for r in members], **confound_statistics(clients)})
    return {"runs": per_run, "pooled": pooled}


def confound_markdown(analysis: Mapping[str, List[Dict[str, Any]]]) -> str:
    """Table 5 (per run, then pooled over seeds), each r with its p-value, and the verdict lines."""
    def cell(row, key):
        r, pvalue = row.get(key), row.get("pvalue_" + key[2:])
        return "n/a" if r is None else f"{r:+.2f} (p={pvalue:.3g})" if pvalue is not None else f"{r:+.2f}"

    lines = ["| Run | n | r(H̃, TV) | r(H̃, p^max) | r(H̃, TV \\| p^max) | r(p, TV \\| p^max) |",
             "|---|---|---|---|---|---|"]
    rows = [(f"{display_name(r['dataset'])}, {display_name(r['algorithm'])}, s{r['seed']}", r)
            for r in analysis["runs"]]
    rows += [(f"{display_name(r['dataset'])}, {display_name(r['algorithm'])}, pooled over seeds "
              f"{', '.join(str(s) for s in r['seeds'])}", r) for r in analysis["pooled"] if r.get("n_clients")]
    for name, row in rows:
        lines.append(f"| {name} | {row['n_clients']} | " + " | ".join(cell(row, k) for k in CONFOUND_KEYS) + " |")
    lines.append("")
    lines += [f"- {display_name(r['dataset'])}, {display_name(r['algorithm'])} (pooled): {r['verdict']}"
              for r in analysis["pooled"] if r.get("verdict")]
    return "\n".join(lines) + "\n"


def confound_latex(analysis: Mapping[str, List[Dict[str, Any]]]) -> str:
    lines = [r"\begin{table}[!htbp]", r"\centering",
             r"\caption{Correlations of the final estimates $\tilde{H}_i$ with ground-truth label divergence "
             r"($\mathrm{TV}$) and device capacity ($p^{\max}$).}", r"\scriptsize", r"\setlength{\tabcolsep}{3pt}",
             r"\begin{tabular}{lccccc}", r"\toprule",
             r"Run & $n$ & $r(\tilde{H},\mathrm{TV})$ & $r(\tilde{H},p^{\max})$ & "
             r"$r(\tilde{H},\mathrm{TV}{\mid}p^{\max})$ & $r(p,\mathrm{TV}{\mid}p^{\max})$ \\", r"\midrule"]
    rows = [(f"{display_name(r['dataset'])}, s{r['seed']}", r) for r in analysis["runs"]]
    rows += [(f"{display_name(r['dataset'])}, pooled", r) for r in analysis["pooled"] if r.get("n_clients")]
    for name, row in rows:
        values = " & ".join("--" if row.get(k) is None else f"${row[k]:.2f}$" for k in CONFOUND_KEYS)
        lines.append(f"{_tex(name)} & {row['n_clients']} & {values} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"
