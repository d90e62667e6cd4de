"""make_report.py's part for the runs on the device clock: async-digits.md (synchronous rounds against FedBuff and
FedAsync, two device populations) and clocked-digits.md (Table 3 on the clock), from results/clock-runs.csv and
results/clock-lines.csv alone (export_runs.py writes them from the run folders).

Per population it writes what ``hasfl-ray report`` and async_at_equal_time.py wrote from the run folders, the same
functions on the same numbers: the time- and data-to-accuracy CSV (``clock_table``), the figure (``plot_clock``)
and the equal-time / equal-bytes CSV; beside them, per seed, each run's accuracy at T and B and time to each
target (``*-seeds.csv``), and the paired comparisons the page's prose quotes (``async-digits-tests.csv``); and the
two tables of async-digits.md between their markers.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
from collections import defaultdict
from typing import Dict, List

import numpy as np
from scipy import stats

import async_at_equal_time as equal  # this folder is on sys.path (make_report.py puts it there)
from hasfl_ray.analysis.clocked import clock_table, first_reached, plot_clock
from hasfl_ray.analysis.plots import figure_heading
from hasfl_ray.analysis.report import grid_csv, run_groups
from hasfl_ray.analysis.statistics import paired_comparison

HERE = os.path.dirname(os.path.abspath(__file__))

#: Group of clock-runs.csv -> (the files' stem, the comparison's or None).
GROUPS = {"async-lognormal": ("async-digits", True), "async-trace": ("async-digits-trace", True),
          "clocked": ("clocked-digits", False)}
METHODS = (("hasfl", "HAS-FL"), ("heterofl", "HeteroFL"), ("fedavg", "FedAvg"))
MODES = (("sync", "sync, deadline"), ("fedbuff", "FedBuff"), ("fedasync", "FedAsync"))
#: The comparisons of async-digits-tests.csv: every pair of modes of a method, every pair of methods in a mode.
PAIRS = [(f"{m}-{a}", f"{m}-{b}") for m, _ in METHODS for a, b in (("fedbuff", "sync"), ("fedasync", "sync"),
                                                                    ("fedbuff", "fedasync"))]
PAIRS += [(f"{a}-{mode}", f"{b}-{mode}") for mode, _ in MODES for a, b in (("hasfl", "heterofl"), ("fedavg", "hasfl"),
                                                                           ("fedavg", "heterofl"))]
#: Populations whose runs are not in results/ yet: their comparisons come from the committed means (the files
#: make_report.py does not rebuild until the runs are exported).
FROM_MEANS = {"trace": ("async-digits-trace.csv", "async-digits-trace-clock.csv")}


def _float(value: str):
    return None if value == "" else float(value)


def load(results: str, read_csv) -> Dict[str, List[dict]]:
    """The runs of each group as the run dicts hasfl_ray.analysis reads (path, config, summary, metrics)."""
    lines = defaultdict(list)
    for row in read_csv(os.path.join(results, "clock-lines.csv")):
        lines[row["group"], row["variant"], row["seed"]].append(
            {"round": int(row["round"]), "sim_time_s": float(row["sim_time_s"]), "bytes_down": int(row["bytes"]),
             "bytes_up": 0, "test_accuracy": _float(row["test_accuracy"]),
             "staleness_mean": _float(row["staleness_mean"]), "late_updates": _float(row["late_updates"])})
    groups = defaultdict(list)
    for row in read_csv(os.path.join(results, "clock-runs.csv")):
        config = json.loads(row["config"])
        summary = {k: float(row[k]) for k in ("best_accuracy", "final_accuracy", "avg_p")}
        groups[row["group"]].append({
            "path": f"{row['group']}/{config['dataset']}-{row['variant']}-seed{row['seed']}", "config": config,
            "summary": summary, "clients": [], "metrics": lines[row["group"], row["variant"], row["seed"]],
            "row": row})
    return groups


def figure(runs: List[dict], order: List[str], path: str) -> None:
    """``hasfl-ray report``'s clock figure of ``runs`` (one dataset), written to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_label = {label: members for (_, label), members in run_groups(runs, order)}  # the table's rows and order
    dataset = runs[0]["config"]["dataset"]
    with tempfile.TemporaryDirectory() as folder:
        written = plot_clock(plt, folder, dataset, figure_heading(dataset, runs), list(by_label), by_label)
        shutil.copyfile(written[0], path)


def equal_points(runs: List[dict]) -> Dict[str, list]:
    """async_at_equal_time's input: {variant: [points of each seed]}, variants in its order (by folder name)."""
    out = {}
    for run in sorted(runs, key=lambda r: os.path.basename(r["path"])):
        out.setdefault(run["row"]["variant"], []).append(equal.points(run["metrics"]))
    return out


def per_seed(runs: List[dict], points: Dict[str, list]) -> List[Dict]:
    """Each run at T and B (accuracy, updates, MB) and its time, bytes and round to each accuracy target."""
    end_time, end_bytes = equal.ends(points)
    rows = []
    for run in runs:
        at_t, at_b, updates, moved = equal.per_run(equal.points(run["metrics"]), end_time, end_bytes)
        row = {"variant": run["row"]["variant"], "seed": run["row"]["seed"], "acc_at_T": f"{100 * at_t:.2f}",
               "acc_at_B": f"{100 * at_b:.2f}", "updates_by_T": updates, "MB_by_T": f"{moved / 1e6:.1f}"}
        for target in (0.5, 0.8, 0.9, 0.95):
            hit = first_reached(run, target)
            row[f"time_to_{target:g}_s"] = "" if hit is None else f"{hit[0]:.2f}"
            row[f"MB_to_{target:g}"] = "" if hit is None else f"{hit[1] / 1e6:.1f}"
        row["end_s"] = f"{run['metrics'][-1]['sim_time_s']:.2f}"
        row["late_updates"] = run["row"]["late_updates"]
        row["wall_s"] = f"{float(run['row']['wall_s']):.1f}"
        row["params_sha256"], row["machine"], row["commit"] = (run["row"][k] for k in ("params_sha256", "machine",
                                                                                         "commit"))
        rows.append(row)
    return rows


def comparisons(population: str, seeds: List[Dict]) -> List[Dict]:
    """a − b paired by seed (one seed: the same devices and data) at T, at B (points) and in time to 90 % (s), for
    every pair of modes of a method and every pair of methods within a mode: mean, paired 95 % interval and p,
    Welch's p."""
    value = {(r["variant"], r["seed"]): r for r in seeds}
    rows = []
    for measure in ("acc_at_T", "acc_at_B", "time_to_0.9_s"):
        for a, b in PAIRS:
            keys = sorted({s for v, s in value if v == a} & {s for v, s in value if v == b})
            va = [value[a, s][measure] for s in keys]
            vb = [value[b, s][measure] for s in keys]
            if "" in va or "" in vb or len(keys) < 2:
                continue
            va, vb = [float(v) for v in va], [float(v) for v in vb]
            result = paired_comparison(va, vb)
            spread = np.ptp(np.subtract(va, vb)) > 1e-9  # the same difference on every seed: no paired test
            paired = f"{stats.ttest_rel(va, vb).pvalue:.3f}" if spread else ""
            rows.append({"population": population, "measure": measure, "a": a, "b": b, "basis": "per seed",
                         "seeds": " ".join(keys),
                         "a_per_seed": " ".join(f"{v:.2f}" for v in va), "b_per_seed": " ".join(f"{v:.2f}" for v in vb),
                         "mean_diff": f"{result['mean_diff']:+.2f}", "ci_low": f"{result['ci_low']:+.2f}",
                         "ci_high": f"{result['ci_high']:+.2f}", "paired_p": paired,
                         "welch_p": f"{result['welch_p']:.3f}" if "welch_p" in result else ""})
    return rows


def welch_from_means(population: str, equal_text: str, clock_rows: List[Dict[str, str]]) -> List[Dict]:
    """The comparisons of :func:`comparisons` for a population whose per-seed runs are not in results/: Welch's t
    from the committed means and sample sds (n seeds each); no paired interval."""
    equal_rows = {r["variant"]: r for r in csv.DictReader(io.StringIO(equal_text))}
    label = {f"{m}-{mode}": (f"{m} ({mode})" if mode != "sync" else m) for m, _ in METHODS for mode, _ in MODES}
    clock = {r["algorithm"]: r for r in clock_rows}
    rows = []
    for measure in ("acc_at_T", "acc_at_B", "time_to_0.9_s"):
        for a, b in PAIRS:
            if measure == "time_to_0.9_s":
                ca, cb = clock[label[a]], clock[label[b]]
                stats_a = (float(ca["time_to_0.9_s_mean"]), float(ca["time_to_0.9_s_std"]), int(ca["time_to_0.9_s_seeds"]))
                stats_b = (float(cb["time_to_0.9_s_mean"]), float(cb["time_to_0.9_s_std"]), int(cb["time_to_0.9_s_seeds"]))
            else:
                ra, rb = equal_rows[a], equal_rows[b]
                stats_a = (100 * float(ra[f"{measure}_mean"]), 100 * float(ra[f"{measure}_std"]), int(ra["seeds"]))
                stats_b = (100 * float(rb[f"{measure}_mean"]), 100 * float(rb[f"{measure}_std"]), int(rb["seeds"]))
            welch = stats.ttest_ind_from_stats(*stats_a, *stats_b, equal_var=False)
            rows.append({"population": population, "measure": measure, "a": a, "b": b, "basis": "means and sds",
                         "mean_diff": f"{stats_a[0] - stats_b[0]:+.2f}", "welch_p": f"{welch.pvalue:.3f}"})
    return rows


def clocked_table(runs: List[dict], order: List[str]) -> str:
    """clocked-digits.md's table: time and data to 90 and 95 % (mean ± sample std over seeds), the round each seed
    first reached 95 %, the run's time and data, and each seed's late updates."""
    def cell(values, digits):
        values = [v for v in values if v is not None]
        return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}" if len(values) > 1 else "-"

    names = {"hasfl": "HAS-FL", "fjord": "FjORD", "uniform": "Uniform"}
    lines = ["| Algorithm | Time to 90 % (s) | Data to 90 % (MB) | Time to 95 % (s) | Data to 95 % (MB) | Rounds to 95 % "
             "(per seed) | Run's time (s) | Run's data (MB) | Late updates (per seed) |", "|---|" + "---|" * 8]
    for (_, label), members in run_groups(runs, order):
        hits = {t: [first_reached(r, t) for r in members] for t in (0.9, 0.95)}
        rounds = [next((line["round"] + 1 for line in r["metrics"] if (line["test_accuracy"] or 0) >= 0.95), None)
                  for r in members]
        ends = [r["metrics"][-1]["sim_time_s"] for r in members]
        moved = [sum(line["bytes_down"] for line in r["metrics"]) / 1e6 for r in members]
        lines.append(f"| {names.get(label, label)} | {cell([h and h[0] for h in hits[0.9]], 2)} | "
                     f"{cell([h and h[1] / 1e6 for h in hits[0.9]], 1)} | {cell([h and h[0] for h in hits[0.95]], 2)} | "
                     f"{cell([h and h[1] / 1e6 for h in hits[0.95]], 1)} | {', '.join(map(str, rounds))} | "
                     f"{cell(ends, 1)} | {cell(moved, 0)} | {', '.join(r['row']['late_updates'] for r in members)} |")
    return "\n".join(lines) + "\n"


def markdown_table(text: str, heading_time: str, heading_bytes: str) -> str:
    """async-digits.md's table from the equal-time CSV: a row per (method, mode), mean ± sample std in %."""
    rows = {r["variant"]: r for r in csv.DictReader(io.StringIO(text))}
    lines = [f"| method | mode | accuracy at T = {heading_time} s | accuracy at B = {heading_bytes} MB | "
             "server updates by T | MB moved by T | mean staleness |", "|---|---|---|---|---|---|---|"]
    for method, name in METHODS:
        for mode, label in MODES:
            r = rows.get(f"{method}-{mode}")
            if r is None:  # a partial rerun: the rows it holds
                continue
            lines.append(f"| {name} | {label} | {100 * float(r['acc_at_T_mean']):.1f} ± "
                         f"{100 * float(r['acc_at_T_std']):.1f} % | {100 * float(r['acc_at_B_mean']):.1f} ± "
                         f"{100 * float(r['acc_at_B_std']):.1f} % | {int(r['updates_by_T']):,} | {r['MB_by_T']} | "
                         f"{r['staleness_mean'] or '-'} |")
    return "\n".join(lines) + "\n"


def write(results: str, out_root: str, read_csv, write_csv, write_text) -> Dict[str, str]:
    """Every clock file under ``out_root``; returns the generated page sections ({marker name: text})."""
    sections, tests = {}, []
    groups = load(results, read_csv)
    for group, runs in groups.items():
        stem, compared = GROUPS[group]
        order = list(dict.fromkeys(run["row"]["variant"] for run in runs))
        write_text(os.path.join(out_root, f"{stem}{'-clock' if compared else ''}.csv"),
                   grid_csv(clock_table(runs, order)))
        figure(runs, order, os.path.join(out_root, f"{stem}.png"))
        walls = [float(run["row"]["wall_s"]) for run in runs]
        sections[f"{stem}-runs"] = (
            f"{len(runs)} runs at commit {runs[0]['row']['commit'][:7]} on {runs[0]['row']['machine']}: "
            f"{sum(walls) / 60:.1f} minutes of run time in all ({min(walls):.1f}-{max(walls):.1f} s a run; "
            f"results/clock-runs.csv, `wall_s`).\n")
        if not compared:
            sections[stem] = clocked_table(runs, order)
            continue
        points = equal_points(runs)
        buffer = io.StringIO(newline="")
        equal.table(points, buffer)
        write_text(os.path.join(out_root, f"{stem}.csv"), buffer.getvalue())
        seeds = per_seed(runs, points)
        write_csv(os.path.join(out_root, f"{stem}-seeds.csv"), seeds)
        tests += comparisons(group.split("-", 1)[1], seeds)
        end_time, end_bytes = equal.ends(points)
        sections[stem] = markdown_table(buffer.getvalue(), f"{end_time:.1f}", f"{end_bytes / 1e6:.1f}")
    for population, (equal_file, clock_file) in FROM_MEANS.items():
        if f"async-{population}" not in groups and os.path.exists(os.path.join(HERE, equal_file)):
            with open(os.path.join(HERE, equal_file), encoding="utf-8", newline="") as handle:
                text = handle.read()
            tests += welch_from_means(population, text, read_csv(os.path.join(HERE, clock_file)))
    if tests:
        columns = ["population", "measure", "a", "b", "basis", "seeds", "a_per_seed", "b_per_seed", "mean_diff",
                   "ci_low", "ci_high", "paired_p", "welch_p"]
        write_csv(os.path.join(out_root, "async-digits-tests.csv"), tests, columns)
    return sections

