"""The paper's figures from run directories: convergence (accuracy and loss per round, a band over seeds), mean H̃
and mean p per round, final p against p^max per client, the accuracy-capacity frontier, accuracy against width and
the distribution of client local accuracies."""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from hasfl_ray.analysis.clocked import plot_clock
from hasfl_ray.analysis.report import display_name, mean_std, protocol_line, summarise_runs, width_of
from hasfl_ray.analysis.rows import run_groups
from hasfl_ray.analysis.statistics import nan_mean_std
from hasfl_ray.analysis.runfiles import _metrics, _save, load_metrics, read_metrics  # noqa: F401 (re-exported)


def _curves(runs: Sequence[Dict[str, Any]], key: str, scale: float = 1.0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rounds, mean over seeds, std over seeds) of a metric over the rounds where at least one seed has a value
    (a round ``--test-every`` or ``--eval-every`` skipped, or one before the first H̃, is left out, so the
    evaluated rounds are joined rather than broken into isolated points no line connects)."""
    curves = [[line.get(key) if line.get(key) is not None else np.nan for line in _metrics(r)] for r in runs]
    length = min(len(c) for c in curves)
    values = scale * np.array([c[:length] for c in curves], dtype=np.float64)
    mean, std = nan_mean_std(values) if length else (np.zeros(0), np.zeros(0))  # the tables' sample std
    kept = ~np.isnan(mean)
    return np.arange(1, length + 1)[kept], mean[kept], std[kept]


def _band(ax, runs, key, label, scale=1.0, **style):
    x, mean, std = _curves(runs, key, scale)
    if len(x) == 0:
        return False
    if len(x) == 1:  # one evaluated round (e.g. --test-every past --rounds: the last only): a point, not a line
        style = {"marker": "o", **style}
    line, = ax.plot(x, mean, label=f"{label} ({len(runs)} seed{'s' if len(runs) > 1 else ''})", **style)
    if len(runs) > 1:
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    return True


def figure_heading(dataset: str, runs: Sequence[Dict[str, Any]]) -> str:
    """A figure's heading: the dataset, the protocol of its first synchronous run (a sweep holding both modes draws
    its asynchronous runs against it), and the seeds."""
    configs = [r["config"] for r in runs]
    first = next((c for c in configs if c.get("mode") != "async"), configs[0])
    seeds = sorted({c["seed"] for c in configs})
    return f"{display_name(dataset)} ({protocol_line(first)}, seeds {', '.join(map(str, seeds))})"


def plot_runs(runs: Sequence[Dict[str, Any]], out_dir: str, order: Sequence[str] = (), fmt: str = "png") -> List[str]:
    """Write <dataset>-convergence.png, -heterogeneity.png, -allocations.png and -frontier.png per dataset, and
    -widths.png, -local.png and -clock.png where its runs record accuracy at each width, client local accuracies and
    a device clock; return the paths. A line (box, point) per row of the report's table (the same runs: a sweep
    variant is a line of its own); curves are the mean over seeds with a ± std band; titles name the dataset and the
    protocol. ``fmt``: png, pdf or svg (each name's .png becomes .<fmt>)."""
    load_metrics(runs)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    written = []
    table = summarise_runs(runs, order)  # the table's rows, in its order: a line or box per row
    by_dataset: Dict[str, Dict[str, List[Dict[str, Any]]]] = defaultdict(dict)
    for (dataset, label), members in run_groups(runs, order):
        by_dataset[dataset][label] = members
    for dataset, groups in sorted(by_dataset.items()):
        rows = [row for row in table if row["dataset"] == dataset]
        labels = [row["algorithm"] for row in rows]  # the table's order
        heading = figure_heading(dataset, [r for members in groups.values() for r in members])

        fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
        for label in labels:
            _band(acc_ax, groups[label], "test_accuracy", display_name(label), scale=100)
            _band(loss_ax, groups[label], "test_loss", display_name(label))
        acc_ax.set(xlabel="communication round", ylabel="test accuracy of the full-width model (%)",
                   title="accuracy per round (mean ± std over seeds)")
        loss_ax.set(xlabel="communication round", ylabel="test loss", title="test loss per round")
        acc_ax.legend(fontsize=8)
        loss_ax.legend(fontsize=8)
        fig.suptitle(f"Convergence: {heading}")
        written.append(_save(fig, out_dir, f"{dataset}-convergence.png", fmt))

        fig, (h_ax, p_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
        any_h = False
        for label in labels:
            any_h |= _band(h_ax, groups[label], "mean_h", display_name(label))
            _band(p_ax, groups[label], "avg_p", display_name(label))
        mean_cap = float(np.mean([float(c["p_max"]) for c in next(iter(groups.values()))[0]["clients"]]))
        p_ax.axhline(mean_cap, color="grey", linestyle=":", label=f"mean cap p̄max = {mean_cap:.3f}")
        if not any_h:
            h_ax.text(0.5, 0.5, "no run with H̃ estimates", ha="center", va="center", transform=h_ax.transAxes)
        h_ax.set(xlabel="communication round", ylabel="mean H̃ over clients", title="heterogeneity estimate")
        p_ax.set(xlabel="communication round", ylabel="mean allocated width p (participants)",
                 title="allocated width")
        if any_h:
            h_ax.legend(fontsize=8)
        p_ax.legend(fontsize=8)
        fig.suptitle(f"Estimates and allocations: {heading}")
        written.append(_save(fig, out_dir, f"{dataset}-heterogeneity.png", fmt))

        fig, ax = plt.subplots(figsize=(6.5, 5))
        rng = np.random.default_rng(0)
        for label in labels:
            p_max = np.array([float(c["p_max"]) for r in groups[label] for c in r["clients"]])
            p_final = np.array([float(c["p_final"]) for r in groups[label] for c in r["clients"]])
            ax.scatter(p_max + rng.uniform(-0.02, 0.02, len(p_max)), p_final, s=14, alpha=0.6,
                       label=display_name(label))
        ax.plot([0, 1], [0, 1], color="grey", linewidth=0.7, label="p = p max")
        ax.set(xlabel="capacity p max of the client (jittered)", ylabel="final allocated width p",
               title=f"Final per-client allocation\n{heading}", xlim=(0, 1.05), ylim=(0, 1.05))
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8)
        written.append(_save(fig, out_dir, f"{dataset}-allocations.png", fmt))

        fig, ax = plt.subplots(figsize=(6.5, 5))
        for row in rows:
            ax.errorbar(row["avg_p"], row["final_mean"], yerr=row["final_std"], fmt="o", capsize=3,
                        label=display_name(row["algorithm"]))
        ax.set(xlabel="average allocated width p per round", ylabel="final accuracy (%, mean ± std over seeds)",
               title=f"Accuracy-capacity frontier\n{heading}")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=8)
        written.append(_save(fig, out_dir, f"{dataset}-frontier.png", fmt))
        written += _plot_widths(plt, out_dir, dataset, heading, labels, groups, fmt)
        written += _plot_local(plt, out_dir, dataset, heading, labels, groups, fmt)
        written += plot_clock(plt, out_dir, dataset, heading, labels, groups, fmt)
    return written


def _plot_widths(plt, out_dir: str, dataset: str, heading: str, labels: Sequence[str],
                 groups: Mapping[str, List[Dict[str, Any]]], fmt: str = "png") -> List[str]:
    """<dataset>-widths.png: final accuracy of the global model cut to each width, one line per algorithm (mean
    over the seeds that recorded it, ± std band); nothing when no run of the dataset records it."""
    fig, ax = plt.subplots(figsize=(6.5, 5))
    drawn = False
    for label in labels:
        maps = [{width_of(w): a for w, a in r["summary"]["accuracy_at_width_final"].items()}
                for r in groups[label] if isinstance(r["summary"].get("accuracy_at_width_final"), dict)]
        widths = sorted({w for m in maps for w in m})
        if not widths:
            continue
        stats = [mean_std([100 * m[w] for m in maps if w in m]) for w in widths]
        mean, std = np.array(stats).T
        line, = ax.plot(widths, mean, marker="o", label=f"{display_name(label)} ({len(maps)} seed"
                                                        f"{'s' if len(maps) > 1 else ''})")
        if len(maps) > 1:
            ax.fill_between(widths, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        drawn = True
    if not drawn:
        plt.close(fig)
        return []
    ax.set(xlabel="width p of the sub-model", ylabel="final test accuracy (%, mean ± std over seeds)",
           title=f"Accuracy at each width\n{heading}", xlim=(0, 1.05))
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    return [_save(fig, out_dir, f"{dataset}-widths.png", fmt)]


def _plot_local(plt, out_dir: str, dataset: str, heading: str, labels: Sequence[str],
                groups: Mapping[str, List[Dict[str, Any]]], fmt: str = "png") -> List[str]:
    """<dataset>-local.png: the distribution of the clients' local accuracies (clients.csv, every seed's clients
    together), a box per algorithm, masked and unmasked side by side; nothing when no client has one."""
    panels = []
    for column, title in (("local_accuracy", "masked to the client's labels"), ("local_accuracy_unmasked", "unmasked")):
        boxes = [(label, [100 * float(c[column]) for r in groups[label] for c in r["clients"]
                          if c.get(column) not in (None, "")]) for label in labels]
        boxes = [(label, values) for label, values in boxes if values]
        if boxes:
            panels.append((title, boxes))
    if not panels:
        return []
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5), squeeze=False)
    for ax, (title, boxes) in zip(axes[0], panels):
        ax.boxplot([values for _, values in boxes], showmeans=True)
        ax.set_xticks(range(1, len(boxes) + 1), [f"{display_name(label)}\n({len(values)} clients)"
                                                 for label, values in boxes], fontsize=8)
        ax.set(ylabel="local accuracy of a client (%)", title=f"local accuracy, {title}")
    fig.suptitle(f"Client local accuracies (box: quartiles and median, ▲ mean): {heading}", fontsize=10)
    return [_save(fig, out_dir, f"{dataset}-local.png", fmt)]
