"""Build docs/reproduction/'s tables, CSVs and figures from the sweeps docs/reproduction/run.sh ran.

    python docs/reproduction/make_report.py runs/reproduction docs/reproduction

Writes, per group of runs, the report `hasfl-ray report` writes (table.{md,csv,tex}, confound.*, PNG figures), and
beside them paper-vs-ours.{md,csv}: the paper's Table 3/4/6 numbers (PAPER.md) next to ours, per method, and
avg-p.{md,csv}: the Avg-p column under the text's tier mix and the paper's realised one. A group whose runs are not
there yet is left out (and said so); rerun the script when the sweeps have gone further.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import sys
from typing import Dict, List

from hasfl_ray.analysis import read_run, summarise_runs
from hasfl_ray.analysis.report import display_name, run_option
from hasfl_ray.analysis.write import write_report
from hasfl_ray.engine.coverage import coverage_warning

#: The paper's EMNIST and CIFAR-10 rows (PAPER.md, "Results to reproduce"): best, final (mean, std), Avg p.
PAPER = {
    ("emnist", "hasfl"): (82.0, 1.8, 77.7, 4.6, 0.52), ("emnist", "fjord"): (84.0, 0.5, 79.6, 3.3, 0.40),
    ("emnist", "uniform"): (82.2, 1.4, 9.4, 3.8, 0.44), ("emnist", "hasfl (coverage off)"): (82.4, 2.3, 70.6, 9.4, 0.47),
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


def runs_under(*folders: str, algorithms=None) -> List[dict]:
    runs = []
    for folder in folders:
        for summary in sorted(glob.glob(os.path.join(folder, "*", "summary.json"))):
            run = read_run(os.path.dirname(summary))
            # the coverage monitor's verdict from the metrics, by today's rule (runs of 2026-11-26 before 16:00 UTC
            # wrote the block for a fraction above 0 in the last round alone)
            with open(os.path.join(run["path"], "metrics.jsonl"), encoding="utf-8") as handle:
                history = [json.loads(line) for line in handle if line.strip()]
            warning = coverage_warning(history, run["config"]["warmup"])
            run["summary"].pop("coverage_warning", None)
            if warning:
                run["summary"]["coverage_warning"] = warning
            label = run["config"]["algorithm"] + ("" if run_option(run["config"], "coverage", True) or
                                                  run["config"]["algorithm"] != "hasfl" else " (coverage off)")
            if algorithms is None or label in algorithms:
                runs.append(run)
    return runs


def dedupe(runs: List[dict]) -> List[dict]:
    """One run per (dataset, label, seed): a reused cell is a copy of a run already counted."""
    seen, kept = set(), []
    for run in runs:
        c = run["config"]
        key = (c["dataset"], c["algorithm"], run_option(c, "coverage", True), c["seed"], c.get("tier_counts") and
               tuple(c["tier_counts"]), c.get("estimator", "masked"))
        if key not in seen:
            seen.add(key)
            kept.append(run)
    return kept


def write_csv(path: str, rows: List[Dict]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(buffer.getvalue())


def side_by_side(rows: List[Dict], compare_to: str, out: str, name: str) -> None:
    """paper-vs-ours: the paper's row for ``compare_to`` beside each of our rows."""
    table = []
    for row in rows:
        paper = PAPER.get((compare_to, row["algorithm"]))
        if paper is None:
            continue
        table.append({"ours": f"{display_name(row['dataset'])} ({len(row['seeds'])} seeds, T={row.get('rounds', '')})",
                      "paper": display_name(compare_to), "algorithm": display_name(row["algorithm"]),
                      "paper_best": paper[0], "paper_final": f"{paper[2]} ± {paper[3]}", "paper_avg_p": paper[4],
                      "our_best": round(row["best_mean"], 1),
                      "our_final": f"{row['final_mean']:.1f} ± {row['final_std']:.1f}",
                      "our_avg_p": round(row["avg_p"], 3),
                      "coverage_warning": f"{row['frozen_fraction']:.2f} frozen" if row.get("coverage_warnings")
                      else ""})
    if not table:
        return
    write_csv(os.path.join(out, f"{name}.csv"), table)
    lines = ["| ours | algorithm | paper best | paper final | paper avg p | our best | our final | our avg p | "
             "coverage warning |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['ours']} | {r['algorithm']} | {r['paper_best']} | {r['paper_final']} | {r['paper_avg_p']} | "
              f"{r['our_best']} | {r['our_final']} | {r['our_avg_p']} | {r['coverage_warning']} |" for r in table]
    with open(os.path.join(out, f"{name}.md"), "w", encoding="utf-8") as handle:
        handle.write(f"# The paper ({display_name(compare_to)}) beside ours\n\n" + "\n".join(lines) + "\n")


def group(name: str, runs: List[dict], out_root: str, order, title: str, compare_to: str = "") -> List[Dict]:
    runs = dedupe(runs)
    if not runs:
        print(f"{name}: no finished runs yet, left out")
        return []
    out = os.path.join(out_root, name)
    write_report(runs, out, order, title)
    rows = summarise_runs(runs, order)
    rounds = {r["config"]["dataset"]: r["summary"]["rounds"] for r in runs}
    for row in rows:
        row["rounds"] = rounds[row["dataset"]]
    if compare_to:
        side_by_side(rows, compare_to, out, "paper-vs-ours")
    print(f"{name}: {len(runs)} runs -> {out}")
    return rows


def main(runs_root: str, out_root: str) -> None:
    order = ["hasfl", "fjord", "uniform", "hasfl (coverage off)", "heterofl", "random-budget", "fedavg", "scaffold",
             "fedprox"]
    d = lambda name: os.path.join(runs_root, name)  # noqa: E731
    digits = runs_under(d("digits-figure6-frontier"), d("digits-table3-allocation"), d("digits-table4-coverage-ablation"),
                        d("digits-table6-full-model"))
    group("digits", digits, out_root, order, "Embedded digits, full protocol (T=200, N=20, 10 a round)", "emnist")
    group("digits-confound-masked", runs_under(d("digits-table5-confound")), out_root, order,
          "Table 5 on the digits, masked estimator")
    group("digits-confound-common-core", runs_under(d("digits-table5-confound-common-core")), out_root, order,
          "Table 5 on the digits, common-core estimator")
    mix = group("digits-paper-tier-mix", runs_under(d("digits-avg-p-paper-tier-mix")), out_root, order,
                "Digits under the paper's realised tier mix 4/10/3/3")
    text = summarise_runs(dedupe(digits), order) if digits else []
    if mix and text:
        by_text = {r["algorithm"]: r for r in text}
        rows = [{"algorithm": display_name(r["algorithm"]), "paper_avg_p": PAPER_AVG_P.get(r["algorithm"], ""),
                 "text_mix_8_5_4_3": round(by_text[r["algorithm"]]["avg_p"], 3) if r["algorithm"] in by_text else "",
                 "paper_mix_4_10_3_3": round(r["avg_p"], 3)} for r in mix]
        write_csv(os.path.join(out_root, "avg-p.csv"), rows)
        with open(os.path.join(out_root, "avg-p.md"), "w", encoding="utf-8") as handle:
            handle.write("| algorithm | paper Avg p | ours, text's mix 8/5/4/3 | ours, paper's mix 4/10/3/3 |\n"
                         "|---|---|---|---|\n" + "".join(
                             f"| {r['algorithm']} | {r['paper_avg_p']} | {r['text_mix_8_5_4_3']} | "
                             f"{r['paper_mix_4_10_3_3']} |\n" for r in rows))
    masked = [f for f in glob.glob(d("emnist-sample-*")) if not f.endswith("-common-core")]
    group("emnist-sample", runs_under(*masked), out_root, order,
          "Real EMNIST sample (16,129 train / 3,420 test images), seed 42, T=30", "emnist")
    group("emnist-sample-confound-common-core", runs_under(d("emnist-sample-table5-common-core")), out_root, order,
          "Table 5 on the real EMNIST sample, common-core estimator")
    group("cifar10-sample", runs_under(*glob.glob(d("cifar10-sample-*"))), out_root, order,
          "Real CIFAR-10 sample (500 train / 200 test images), seed 42, T=30", "cifar10")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/reproduction",
         sys.argv[2] if len(sys.argv) > 2 else "docs/reproduction")
