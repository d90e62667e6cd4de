"""The paper's figures from run directories: convergence, mean H̃ and p per round, per-client p, the frontier."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any, Dict, List, Sequence

import numpy as np

from hasfl_ray.analysis.report import _label, summarise_runs


def _metrics(run: Dict[str, Any]) -> List[Dict[str, Any]]:
    with open(os.path.join(run["path"], "metrics.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _mean_curve(runs: Sequence[Dict[str, Any]], key: str) -> np.ndarray:
    curves = [[line[key] if line[key] is not None else np.nan for line in _metrics(r)] for r in runs]
    length = min(len(c) for c in curves)
    return np.nanmean(np.array([c[:length] for c in curves], dtype=np.float64), axis=0)


def plot_runs(runs: Sequence[Dict[str, Any]], out_dir: str) -> List[str]:
    """Write convergence.png, heterogeneity.png, allocations.png and frontier.png per dataset; return the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    written = []
    by_dataset: Dict[str, Dict[str, List[Dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        by_dataset[run["config"]["dataset"]][_label(run["config"])].append(run)
    for dataset, groups in sorted(by_dataset.items()):
        fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4))
        for label, members in sorted(groups.items()):
            acc_ax.plot(100 * _mean_curve(members, "test_accuracy"), label=label)
            loss_ax.plot(_mean_curve(members, "test_loss"), label=label)
        acc_ax.set(xlabel="round", ylabel="test accuracy (%)", title=f"{dataset}: accuracy")
        loss_ax.set(xlabel="round", ylabel="test loss", title=f"{dataset}: loss")
        acc_ax.legend(fontsize=7)
        written.append(_save(fig, out_dir, f"{dataset}-convergence.png"))

        fig, (h_ax, p_ax) = plt.subplots(1, 2, figsize=(11, 4))
        for label, members in sorted(groups.items()):
            h = _mean_curve(members, "mean_h")
            if not np.all(np.isnan(h)):
                h_ax.plot(h, label=label)
            p_ax.plot(_mean_curve(members, "avg_p"), label=label)
        h_ax.set(xlabel="round", ylabel="mean H̃", title=f"{dataset}: heterogeneity estimate")
        p_ax.set(xlabel="round", ylabel="mean p", title=f"{dataset}: allocated width")
        p_ax.legend(fontsize=7)
        written.append(_save(fig, out_dir, f"{dataset}-heterogeneity.png"))

        fig, ax = plt.subplots(figsize=(5, 4))
        for label, members in sorted(groups.items()):
            p_max = [float(c["p_max"]) for r in members for c in r["clients"]]
            p_final = [float(c["p_final"]) for r in members for c in r["clients"]]
            ax.scatter(p_max, p_final, s=12, alpha=0.6, label=label)
        ax.plot([0, 1], [0, 1], color="grey", linewidth=0.5)
        ax.set(xlabel="p max", ylabel="final p", title=f"{dataset}: per-client allocation")
        ax.legend(fontsize=7)
        written.append(_save(fig, out_dir, f"{dataset}-allocations.png"))

        fig, ax = plt.subplots(figsize=(5, 4))
        for row in summarise_runs([r for members in groups.values() for r in members]):
            ax.errorbar(row["avg_p"], row["final_mean"], yerr=row["final_std"], fmt="o", label=row["algorithm"])
        ax.set(xlabel="average p", ylabel="final accuracy (%)", title=f"{dataset}: accuracy-capacity frontier")
        ax.legend(fontsize=7)
        written.append(_save(fig, out_dir, f"{dataset}-frontier.png"))
    return written


def _save(fig, out_dir: str, name: str) -> str:
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
