"""Build docs/reproduction/'s tables, CSVs and figures from the compact results CSVs alone (no run folders).

    python docs/reproduction/make_report.py [--results docs/reproduction/results] [OUT]   # OUT: docs/reproduction

The results folder (export_cells.py writes it from run folders) holds ``cells.csv`` (per cell: best and final
accuracy, avg p, frozen fraction, params_sha256, machine, source), ``clients.csv`` (per client: p^max, final p, TV,
H̃), ``curves.csv`` (per round), and, for cells whose runs are lost, ``confound-carried.csv`` (Table 5's correlations
as first reported) and ``aggregates-carried.csv`` (a table's means over seeds as first reported). Per report folder it
writes table.{md,csv,tex}, confound.{md,csv,tex} (every correlation with its 95 % interval and the verdict rule of the
README), paper-vs-ours.{md,csv} and the figures of the cells that have curves; beside them avg-p.{md,csv} (the Avg-p
column under both tier mixes), cost.{md,csv} (Table 2 against `hasfl-ray cost`), comparisons.{md,csv} (every accuracy
comparison of the README with its test) and dynamics.{md,csv} (Figures 4, 5 and 8's numbers). From
``clock-runs.csv``/``clock-lines.csv`` and ``packs-sample.csv``/``packs-ablation.csv`` (export_runs.py) it writes
the files of async-digits.md, clocked-digits.md and packs.md (report_clock.py, report_packs.py) and those pages'
generated tables (pages.py).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Sequence

import numpy as np

from hasfl_ray.analysis.plots import plot_runs
from hasfl_ray.analysis.statistics import paired_comparison
from hasfl_ray.analysis.report import (CONFOUND_COLUMNS, CONFOUND_KEYS, analyze_runs, confound_latex,
                                       confound_markdown, display_name, summarise_runs, table_csv, table_latex,
                                       table_markdown)
from hasfl_ray.engine.coverage import coverage_warning
from hasfl_ray.models import cost_table

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # report_clock, report_packs and pages beside this script
import pages  # noqa: E402
import report_clock  # noqa: E402
import report_packs  # noqa: E402
ORDER = ["hasfl", "fjord", "uniform", "hasfl (coverage off)", "heterofl", "random-budget", "fedavg", "scaffold",
         "fedprox"]
#: Report folder -> (results group, algorithms kept (None: all), title, the paper's dataset to set beside it).
REPORTS = {
    "digits": ("digits", None, "Embedded digits, full protocol (T=200, N=20, 10 a round)", "emnist"),
    "digits-confound-masked": ("digits", {"hasfl"}, "Table 5 on the digits, masked estimator", ""),
    "digits-confound-common-core": ("digits-confound-common-core", None,
                                    "Table 5 on the digits, common-core estimator", ""),
    "digits-paper-tier-mix": ("digits-paper-tier-mix", None, "Digits under the paper's realised tier mix 4/10/3/3", ""),
    "emnist-sample": ("emnist-sample", None, "Real EMNIST sample (16,129 train / 3,420 test images), seed 42, T=30",
                      "emnist"),
    "emnist-sample-confound-common-core": ("emnist-sample-confound-common-core", None,
                                           "Table 5 on the real EMNIST sample, common-core estimator", ""),
    "cifar10-sample": ("cifar10-sample", None, "Real CIFAR-10 sample (500 train / 200 test images), seed 42, T=30",
                       "cifar10"),
    "cifar10-sample-confound-common-core": ("cifar10-sample-confound-common-core", None,
                                            "Table 5 on the real CIFAR-10 sample, common-core estimator", ""),
}
#: The paper's EMNIST and CIFAR-10 rows (PAPER.md, "Results to reproduce"): best, final (mean, std), Avg p.
PAPER = {
    ("emnist", "hasfl"): (82.0, 1.8, 77.7, 4.6, 0.52), ("emnist", "fjord"): (84.0, 0.5, 79.6, 3.3, 0.40),
    ("emnist", "uniform"): (82.2, 1.4, 9.4, 3.8, 0.44),
    ("emnist", "hasfl (coverage off)"): (82.4, 2.3, 70.6, 9.4, 0.47),
    ("emnist", "random-budget"): (82.4, 2.1, 77.4, 5.7, 0.49), ("emnist", "fedavg"): (87.4, 0.3, 85.5, 1.7, 1.00),
    ("emnist", "scaffold"): (87.5, 0.2, 87.2, 0.3, 1.00), ("emnist", "fedprox"): (85.0, 0.0, 83.9, 1.3, 1.00),
    ("cifar10", "hasfl"): (76.7, 4.9, 74.5, 5.6, 0.52), ("cifar10", "fjord"): (78.6, 3.9, 75.5, 3.8, 0.41),
    ("cifar10", "uniform"): (63.6, 1.6, 54.5, 2.3, 0.44),
    ("cifar10", "hasfl (coverage off)"): (57.2, 2.4, 40.4, 10.2, 0.48),
    ("cifar10", "heterofl"): (76.3, 4.9, 75.0, 5.0, 0.56), ("cifar10", "random-budget"): (75.9, 4.9, 74.6, 5.1, 0.49),
    ("cifar10", "fedavg"): (88.5, 0.5, 88.2, 0.6, 1.00), ("cifar10", "scaffold"): (86.7, 0.9, 86.3, 1.2, 1.00),
    ("cifar10", "fedprox"): (66.4, 1.0, 65.5, 2.0, 1.00),
}
#: The Avg-p column of the paper (HeteroFL's EMNIST row is not in the paper; its CIFAR-10 Avg p is).
PAPER_AVG_P = {"hasfl": 0.52, "fjord": "0.40-0.41", "uniform": 0.44, "hasfl (coverage off)": "0.47-0.48",
               "heterofl": 0.56, "random-budget": 0.49}
#: Table 2 of the paper: params (M), MACs/sample (M), upload (MB) at p = 0.25, 0.5, 0.75, 1.
PAPER_COST = {"cifar10": [(0.21, 10.0, 0.82), (0.82, 39.2, 3.26), (1.83, 87.4, 7.32), (3.25, 154.9, 13.00)],
              "emnist": [(0.21, 7.5, 0.85), (0.83, 29.7, 3.31), (1.85, 66.6, 7.40), (3.28, 118.2, 13.10)],
              "shakespeare": [(0.06, 4.1, 0.24), (0.22, 16.1, 0.86), (0.47, 35.9, 1.88), (0.82, 63.6, 3.30)]}
#: Accuracy comparisons (first minus second, final accuracy), and the equivalence margin of the TOST (points).
COMPARISONS = [("hasfl", "fjord"), ("hasfl", "heterofl"), ("random-budget", "hasfl"), ("hasfl", "uniform"),
               ("hasfl", "hasfl (coverage off)"), ("fedavg", "hasfl"), ("scaffold", "fedavg"), ("fedprox", "fedavg")]
MARGIN = 1.0
WARMUP = 10


# ------------------------------------------------------------------------------------------------ reading the CSVs

def read_csv(path: str) -> List[Dict[str, str]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def write_csv(path: str, rows: Sequence[Dict], columns: Optional[Sequence[str]] = None) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns or rows[0]), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, buffer.getvalue())


def write_text(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _float(value: str) -> Optional[float]:
    return None if value in ("", None) else float(value)


def load_runs(results: str) -> Dict[str, List[dict]]:
    """The cells of cells.csv as the run dicts hasfl_ray.analysis reads (config, summary, clients, metrics), by
    group; a cell whose curves are not recorded has ``metrics`` [] and ``curves`` False."""
    clients, curves = defaultdict(list), defaultdict(list)
    for row in read_csv(os.path.join(results, "clients.csv")):
        clients[row["group"], row["algorithm"], row["seed"]].append(row)
    for row in read_csv(os.path.join(results, "curves.csv")):
        line = {"round": int(row["round"]), **{k: _float(row[k]) for k in
                                                 ("test_accuracy", "test_loss", "mean_h", "avg_p", "frozen_fraction")}}
        curves[row["group"], row["algorithm"], row["seed"]].append(line)
    groups: Dict[str, List[dict]] = defaultdict(list)
    for cell in read_csv(os.path.join(results, "cells.csv")):
        key = (cell["group"], cell["algorithm"], cell["seed"])
        off = cell["algorithm"] == "hasfl (coverage off)"
        config = {"dataset": cell["dataset"], "algorithm": "hasfl" if off else cell["algorithm"],
                  "algorithm_options": {"coverage": not off}, "seed": int(cell["seed"]),
                  "rounds": int(cell["rounds"]), "clients": int(cell["clients"]),
                  "clients_per_round": int(cell["clients_per_round"]), "local_epochs": int(cell["local_epochs"]),
                  "alpha": 0.3, "warmup": WARMUP}
        summary = {k: float(cell[k]) for k in ("best_accuracy", "final_accuracy", "avg_p")}
        summary["rounds"] = int(cell["rounds"])
        history = sorted(curves.get(key, []), key=lambda line: line["round"])
        warning = coverage_warning(history, WARMUP) if history else (
            {"frozen_fraction": float(cell["frozen_fraction"])} if cell["frozen_fraction"] else None)
        if warning:  # the last fraction at full precision (curves.csv keeps six digits)
            summary["coverage_warning"] = {**warning, "frozen_fraction": float(cell["frozen_fraction"] or
                                                                               warning["frozen_fraction"])}
        groups[cell["group"]].append({
            "path": f"{cell['group']}/{cell['dataset']}-{cell['algorithm']}-seed{cell['seed']}", "config": config,
            "summary": summary, "clients": clients.get(key, []), "metrics": history, "cell": cell,
            "curves": bool(history)})
    return groups


# --------------------------------------------------------------------------------------------------- statistics

def fisher_interval(r: Optional[float], n: int, controls: int = 0) -> Optional[tuple]:
    """95 % interval of a (partial) correlation by Fisher's z: atanh(r) ± 1.96 / sqrt(n − 3 − controls)."""
    if r is None or n - 3 - controls <= 0:
        return None
    z, half = np.arctanh(np.clip(r, -0.999999, 0.999999)), 1.959964 / np.sqrt(n - 3 - controls)
    return float(np.tanh(z - half)), float(np.tanh(z + half))


def sign_verdict(r: Optional[float], interval: Optional[tuple]) -> str:
    """The rule of the README: positive or negative when the 95 % interval excludes 0, else inconclusive."""
    if r is None or interval is None:
        return "no estimate"
    if interval[0] > 0:
        return "positive (95 % CI excludes 0)"
    if interval[1] < 0:
        return "negative (95 % CI excludes 0)"
    return f"inconclusive (95 % CI includes 0; estimate {'+' if r > 0 else '-'})"


def compare(a: Sequence[float], b: Sequence[float], margin: float = MARGIN) -> Dict[str, object]:
    """:func:`hasfl_ray.analysis.statistics.paired_comparison` at this report's TOST margin."""
    return paired_comparison(a, b, margin)


# ----------------------------------------------------------------------------------------------------- the tables

def table_files(out: str, rows: List[Dict], title: str, caption: str) -> None:
    write_text(os.path.join(out, "table.md"), f"# {title}\n\n" + table_markdown(rows))
    write_text(os.path.join(out, "table.csv"), table_csv(rows))
    write_text(os.path.join(out, "table.tex"), table_latex(rows, caption))


def carried_analysis(rows: List[Dict[str, str]]) -> Dict[str, list]:
    """Table 5 rows as first reported (confound-carried.csv) in analyze_runs's layout."""
    def numbers(row):
        return {k: (_float(v) if k not in ("dataset", "algorithm", "seed", "group", "source") else v)
                for k, v in row.items()}
    runs = [{**numbers(r), "seed": int(r["seed"]), "n_clients": int(r["n_clients"])} for r in rows
            if not r["seed"].startswith("pooled")]
    pooled = [{**numbers(r), "seeds": [int(s) for s in r["seed"].split()[1:]], "n_clients": int(r["n_clients"])}
              for r in rows if r["seed"].startswith("pooled")]
    singles = defaultdict(list)
    for r in runs:
        singles[r["dataset"], r["algorithm"]].append(r)
    for (dataset, algorithm), members in singles.items():  # one seed: pooled is that run
        if len(members) == 1 and not any(p["algorithm"] == algorithm for p in pooled):
            pooled.append({**members[0], "seeds": [members[0]["seed"]]})
    return {"runs": runs, "pooled": pooled}


def confound_rule_lines(analysis: Dict[str, list]) -> List[str]:
    lines = ["", "Verdicts (rule: the sign of r counts where its 95 % Fisher-z interval excludes 0, else "
                 "\"inconclusive\"; no p-value threshold):", ""]
    for row in analysis["pooled"]:
        n = row["n_clients"]
        parts = []
        for key, name, controls in (("r_h_pmax", "r(H̃, p^max)", 0), ("r_h_tv_given_pmax", "r(H̃, TV | p^max)", 1),
                                    ("r_p_tv_given_pmax", "r(p, TV | p^max)", 1)):
            interval = fisher_interval(row.get(key), n, controls)
            text = "n/a" if interval is None else f"{row[key]:+.2f} [{interval[0]:+.2f}, {interval[1]:+.2f}]"
            parts.append(f"{name} {text}: {sign_verdict(row.get(key), interval)}")
        lines.append(f"- {display_name(row['dataset'])}, {display_name(row['algorithm'])}, pooled over seeds "
                     f"{', '.join(map(str, row['seeds']))} (n = {n}): " + "; ".join(parts))
    return lines


def _stable(value):
    """A float to 12 significant digits (anything else as it is)."""
    return float(f"{value:.12g}") if isinstance(value, float) else value


def confound_files(out: str, analysis: Dict[str, list], note: str) -> List[Dict]:
    """confound.{md,csv,tex}: the correlations (p-values shown, no p-threshold verdict), the 95 % intervals and the
    sign rule's verdicts; returns the pooled rows with their intervals. Correlations and p-values are kept to 12
    significant digits where computed here (a partial correlation's last bits depend on the machine's BLAS kernel);
    rows carried over (with a ``source``) keep their digits as first reported."""
    analysis = {part: [row if "source" in row else {k: _stable(v) for k, v in row.items()} for row in rows]
                for part, rows in analysis.items()}
    plain = {"runs": analysis["runs"], "pooled": [{k: v for k, v in r.items() if k != "verdict"}
                                                  for r in analysis["pooled"]]}
    text = confound_markdown(plain).rstrip("\n") + "\n" + "\n".join(confound_rule_lines(analysis)) + "\n"
    write_text(os.path.join(out, "confound.md"), text + (f"\n{note}\n" if note else ""))
    rows = analysis["runs"] + [{**r, "seed": "pooled " + " ".join(map(str, r["seeds"]))} for r in analysis["pooled"]]
    for row in rows:
        row["verdict"] = "; ".join(
            f"{key}: {sign_verdict(row.get(key), fisher_interval(row.get(key), row['n_clients'], int('given' in key)))}"
            for key in CONFOUND_KEYS)
    write_text(os.path.join(out, "confound.csv"), table_csv(rows, CONFOUND_COLUMNS))
    write_text(os.path.join(out, "confound.tex"), confound_latex(plain))
    return [r for r in rows if str(r["seed"]).startswith("pooled")]


def side_by_side(rows: List[Dict], compare_to: str, out: str) -> None:
    """paper-vs-ours: the paper's row for ``compare_to`` beside each of our rows."""
    table = []
    for row in rows:
        paper = PAPER.get((compare_to, row["algorithm"]))
        if paper is None:
            continue
        table.append({"ours": f"{display_name(row['dataset'])} ({len(row['seeds'])} seeds, T={row['rounds']})",
                      "paper": display_name(compare_to), "algorithm": display_name(row["algorithm"]),
                      "paper_best": paper[0],
                      "paper_final": f"{paper[2]} ± {paper[3]}", "paper_avg_p": paper[4],
                      "our_best": round(row["best_mean"], 1),
                      "our_final": f"{row['final_mean']:.1f} ± {row['final_std']:.1f}",
                      "our_avg_p": round(row["avg_p"], 3),
                      "coverage_warning": f"{row['frozen_fraction']:.2f} frozen" if row.get("coverage_warnings")
                      else ""})
    if not table:
        return
    write_csv(os.path.join(out, "paper-vs-ours.csv"), table)
    header = "| ours | algorithm | paper best | paper final | paper avg p | our best | our final | our avg p | " \
             "coverage warning |\n|---|---|---|---|---|---|---|---|---|\n"
    write_text(os.path.join(out, "paper-vs-ours.md"), f"# The paper ({display_name(compare_to)}) beside ours\n\n"
               + header + "".join("| " + " | ".join(str(v) for k, v in r.items() if k != "paper") + " |\n"
                                  for r in table))


def report(name: str, runs: List[dict], carried_confound: List[Dict], carried_rows: List[Dict], out_root: str):
    """One report folder; returns (table rows, pooled confound rows)."""
    group, keep, title, compare_to = REPORTS[name]
    runs = [r for r in runs if keep is None or r["cell"]["algorithm"] in keep]
    carried_confound = [r for r in carried_confound if keep is None or r["algorithm"] in keep]
    out = os.path.join(out_root, name)
    if runs:
        rows = summarise_runs(runs, ORDER)
    else:  # means over seeds as first reported (aggregates-carried.csv)
        rows = [{**{k: _float(v) if k not in ("dataset", "algorithm", "seeds", "group", "source") else v
                    for k, v in r.items()}, "seeds": [int(s) for s in r["seeds"].split()],
                 "coverage_warnings": int(r["coverage_warnings"] or 0)} for r in carried_rows]
    if not rows:
        print(f"{name}: nothing in the results, left out")
        return [], []
    os.makedirs(out, exist_ok=True)
    for row in rows:
        row["rounds"] = next((r["summary"]["rounds"] for r in runs if r["config"]["dataset"] == row["dataset"]), 200)
    datasets = ", ".join(display_name(d) for d in dict.fromkeys(r["dataset"] for r in rows))
    table_files(out, rows, title, f"{title}, {datasets}")
    with_clients = [r for r in runs if any(c.get("h_tilde") for c in r["clients"])]
    analysis = analyze_runs(with_clients) if with_clients else {"runs": [], "pooled": []}
    if carried_confound:
        extra = carried_analysis(carried_confound)
        analysis = {"runs": analysis["runs"] + extra["runs"], "pooled": analysis["pooled"] + extra["pooled"]}
    pooled = []
    if analysis["runs"]:
        note = ("Rows of runs whose folders are lost are carried over from the first report "
                "(results/confound-carried.csv); the rest are computed from results/clients.csv."
                if carried_confound else "")
        pooled = [{**r, "report": name} for r in confound_files(out, analysis, note)]
    if compare_to:
        side_by_side(rows, compare_to, out)
    drawn = [r for r in runs if r["curves"]]
    if drawn:
        plot_runs(drawn, out, ORDER)
    print(f"{name}: {len(runs) or 'carried'} cells, {len(drawn)} with curves -> {out}")
    return rows, pooled


# ----------------------------------------------------------------------------------------- the write-up's numbers

def cost_files(out_root: str) -> None:
    """Table 2 of the paper beside `hasfl-ray cost` (hasfl_ray.models.cost_table), rounded as the paper rounds."""
    rows = []
    for model, paper in PAPER_COST.items():
        for ours, (params, macs, upload) in zip(cost_table(model), paper):
            mine = (round(ours["params"] / 1e6, 2), round(ours["macs"] / 1e6, 1), round(ours["upload_mb"], 2))
            rows.append({"model": model, "p": ours["p"], "paper_params_M": params, "paper_macs_M": macs,
                         "paper_upload_MB": upload, "params": ours["params"], "macs": ours["macs"],
                         "upload_MB": round(ours["upload_mb"], 4),
                         "match": "yes" if mine == (params, macs, upload) else f"no: ours rounds to {mine}"})
    write_csv(os.path.join(out_root, "cost.csv"), rows)
    write_text(os.path.join(out_root, "cost.md"),
               "| model | p | paper params (M) / MACs (M) / upload (MB) | hasfl-ray cost "
               "| same at the paper's rounding |\n|---|---|---|---|---|\n" + "".join(
                   f"| {r['model']} | {r['p']} | {r['paper_params_M']} / {r['paper_macs_M']} / {r['paper_upload_MB']} "
                   f"| {r['params']:,} / {r['macs']:,} / {r['upload_MB']} | {r['match']} |\n" for r in rows))


def per_seed(runs: List[dict], algorithm: str, key: str) -> Dict[int, float]:
    return {r["config"]["seed"]: 100 * r["summary"][key] for r in runs if r["cell"]["algorithm"] == algorithm}


def comparison_files(groups: Dict[str, List[dict]], out_root: str) -> None:
    """Every accuracy comparison of the README: final accuracy a − b per seed, paired 95 % t interval, Welch's t and
    p, TOST against ±MARGIN; and the coverage ablation's peak→final decay (per seed) compared the same way."""
    rows = []
    for group in ("digits", "emnist-sample", "cifar10-sample"):
        runs = groups.get(group, [])
        if not runs:
            continue
        images = int(runs[0]["cell"]["test_samples"] or 0)
        measures = [("final", lambda alg: per_seed(runs, alg, "final_accuracy")),
                    ("best", lambda alg: per_seed(runs, alg, "best_accuracy"))]
        measures.append(("peak→final", lambda alg: {s: per_seed(runs, alg, "final_accuracy")[s] - v
                                                      for s, v in per_seed(runs, alg, "best_accuracy").items()}))
        for measure, values in measures:
            pairs = COMPARISONS if measure == "final" else [("hasfl", "hasfl (coverage off)")]  # Table 4's effects
            for a, b in pairs:
                va, vb = values(a), values(b)
                seeds = sorted(set(va) & set(vb))
                if not seeds:
                    continue
                result = compare([va[s] for s in seeds], [vb[s] for s in seeds])
                rows.append({"group": group, "measure": measure, "a": a, "b": b, "seeds": " ".join(map(str, seeds)),
                             "a_per_seed": " ".join(f"{va[s]:.2f}" for s in seeds),
                             "b_per_seed": " ".join(f"{vb[s]:.2f}" for s in seeds), "test_images": images,
                             "one_image_pp": round(100 / images, 3) if images else "", **result})
    columns = ["group", "measure", "a", "b", "seeds", "a_per_seed", "b_per_seed", "n_seeds", "mean_diff", "ci_low",
               "ci_high", "welch_t", "welch_p", "tost_p", "test_images", "one_image_pp"]
    write_csv(os.path.join(out_root, "comparisons.csv"), rows, columns)

    def fmt(value, spec):
        return "—" if value in (None, "") else format(value, spec)

    lines = [f"# Accuracy comparisons (a − b, percentage points; paired by seed; TOST margin ±{MARGIN} pp)", "",
             "| data | measure | a − b | per seed a / b | mean | 95 % CI (paired t, df = n−1) | Welch t (p) "
             "| TOST p | test images (1 image) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = "—" if "ci_low" not in r else f"[{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]"
        welch = "—" if "welch_t" not in r else f"{r['welch_t']:+.2f} ({r['welch_p']:.3g})"
        lines.append(f"| {r['group']} | {r['measure']} | {display_name(r['a'])} − {display_name(r['b'])} | "
                     f"{r['a_per_seed']} / {r['b_per_seed']} | {fmt(r['mean_diff'], '+.2f')} | {ci} | {welch} | "
                     f"{fmt(r.get('tost_p'), '.3g')} | {r['test_images']} ({r['one_image_pp']} pp) |")
    lines += ["", "One seed (the samples): no interval or test is possible; the difference is to be read against the "
                  "resolution of the test set (one image) and the paper's seed-to-seed spread (up to 6 points)."]
    write_text(os.path.join(out_root, "comparisons.md"), "\n".join(lines) + "\n")


def dynamics_files(groups: Dict[str, List[dict]], out_root: str) -> None:
    """Figure 3's oscillation (mean |change| of accuracy per round, second half), Figure 4's peaks of mean H̃ in
    each T_norm window, Figure 5's final p per tier, the largest final p without the guarantee (the paper:
    0.58-0.69), Figure 8's loss minimum and final loss; per cell with curves."""
    rows = []
    for group, runs in groups.items():
        for run in runs:
            cell, lines = run["cell"], run["metrics"]
            row = {"group": group, "algorithm": cell["algorithm"], "seed": cell["seed"]}
            h = [(line["round"], line["mean_h"]) for line in lines if line.get("mean_h") is not None]
            if h:
                windows = defaultdict(list)
                for rnd, value in h:
                    windows[rnd // 20].append(value)
                # the sawtooth's teeth: the largest mean H̃ of each T_norm = 20 window after the first (the first
                # holds the warm-up, where H̃ stays near its start)
                peaks = [max(v) for w, v in sorted(windows.items()) if w > 0] or [max(windows[0])]
                row.update(h_peak_min=min(peaks), h_peak_median=float(np.median(peaks)), h_peak_max=max(peaks))
            accuracy = [100 * line["test_accuracy"] for line in lines if line.get("test_accuracy") is not None]
            if len(accuracy) > 3:  # Figure 3's oscillation: mean |change| of accuracy per round, second half
                row["acc_step_second_half"] = float(np.mean(np.abs(np.diff(accuracy[len(accuracy) // 2:]))))
            loss = [(line["round"], line["test_loss"]) for line in lines if line.get("test_loss") is not None]
            if loss:
                best = min(loss, key=lambda item: item[1])
                row.update(loss_min=best[1], loss_min_round=best[0], loss_final=loss[-1][1])
            by_tier = defaultdict(list)
            for client in run["clients"]:
                by_tier[float(client["p_max"])].append(float(client["p_final"]))
            if by_tier:
                row["p_final_by_tier"] = " ".join(f"{t:g}:{np.mean(v):.3f}" for t, v in sorted(by_tier.items()))
                row["p_final_max"] = max(max(v) for v in by_tier.values())
            if len(row) > 3:
                rows.append(row)
    columns = ["group", "algorithm", "seed", "acc_step_second_half", "h_peak_min", "h_peak_median", "h_peak_max",
               "loss_min",
               "loss_min_round", "loss_final", "p_final_by_tier", "p_final_max"]
    write_csv(os.path.join(out_root, "dynamics.csv"), rows, columns)


def avg_p_files(text_rows: List[Dict], mix_rows: List[Dict], out_root: str) -> None:
    by_text = {r["algorithm"]: r for r in text_rows}
    rows = [{"algorithm": display_name(r["algorithm"]), "paper_avg_p": PAPER_AVG_P.get(r["algorithm"], ""),
             "text_mix_8_5_4_3": round(by_text[r["algorithm"]]["avg_p"], 3) if r["algorithm"] in by_text else "",
             "paper_mix_4_10_3_3": round(r["avg_p"], 3)} for r in mix_rows]
    write_csv(os.path.join(out_root, "avg-p.csv"), rows)
    write_text(os.path.join(out_root, "avg-p.md"),
               "| algorithm | paper Avg p | ours, text's mix 8/5/4/3 | ours, paper's mix 4/10/3/3 |\n"
               "|---|---|---|---|\n"
               + "".join(f"| {r['algorithm']} | {r['paper_avg_p']} | {r['text_mix_8_5_4_3']} | "
                         f"{r['paper_mix_4_10_3_3']} |\n" for r in rows))


def main(results: str, out_root: str) -> None:
    groups = load_runs(results)
    confound = defaultdict(list)
    for row in read_csv(os.path.join(results, "confound-carried.csv")):
        confound[row["group"]].append(row)
    aggregates = defaultdict(list)
    for row in read_csv(os.path.join(results, "aggregates-carried.csv")):
        aggregates[row["group"]].append(row)
    tables, pooled = {}, []
    for name, (group, _, _, _) in REPORTS.items():
        cells = {r["cell"]["algorithm"] for r in groups.get(group, [])}
        carried = [r for r in confound.get(group, []) if r["algorithm"] not in cells or
                   not any(c.get("h_tilde") for run in groups[group] if run["cell"]["algorithm"] == r["algorithm"]
                           for c in run["clients"])]
        tables[name], rows = report(name, groups.get(group, []), carried, aggregates.get(group, []), out_root)
        pooled += rows
    if pooled:
        write_csv(os.path.join(out_root, "confound-pooled.csv"), pooled,
                  ["report", "dataset", "algorithm", "seed", "n_clients"] + [k for key in CONFOUND_KEYS
                                                                               for k in (key, "pvalue_" + key[2:])]
                  + ["verdict"])
    if tables.get("digits") and tables.get("digits-paper-tier-mix"):
        avg_p_files(tables["digits"], tables["digits-paper-tier-mix"], out_root)
    cost_files(out_root)
    comparison_files(groups, out_root)
    dynamics_files(groups, out_root)
    # async-digits.md, clocked-digits.md and packs.md: their CSVs, figures and the tables between the pages' markers
    sections = report_clock.write(results, out_root, read_csv, write_csv, write_text)
    sections.update(report_packs.write(results, read_csv))
    pages.fill(sections, out_root)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=HERE, help="where the report folders go (default: this folder)")
    parser.add_argument("--results", default=os.path.join(HERE, "results"),
                        help="the compact CSVs (default: results/ beside this script)")
    args = parser.parse_args()
    main(args.results, args.out)
