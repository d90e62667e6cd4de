"""Turn the run folders behind async-digits.md, clocked-digits.md and packs.md into compact CSVs under results/, so
that make_report.py rebuilds those pages' tables, CSVs and figures without the run folders.

    python docs/reproduction/export_runs.py runs/reproduction docs/reproduction/results [--commit REV]

From the folders docs/reproduction/run.sh writes (``async``, ``clocked``, ``packs``, ``ablation``) it writes, each
row naming the machine (:func:`hasfl_ray.training.determinism.machine_type`) and the commit the runs were made on:

- ``clock-runs.csv``: a row per clocked run (the asynchronous comparison on both device populations and Table 3 on
  the clock): group, sweep variant, seed, best and final accuracy, avg p, late updates, wall seconds,
  params_sha256, machine, commit and the run's config (JSON, as its config.yaml holds it; the reports' protocol and
  device lines are read from it);
- ``clock-lines.csv``: a row per metrics.jsonl line of those runs: round, simulated seconds (full precision), bytes
  moved on that line (down + up), test accuracy (full precision; empty where the line has no evaluation), mean
  staleness, late updates;
- ``packs-sample.csv``: a row per cell of the packs' one-round sample (global accuracy, accuracy at the other
  widths, local accuracy masked and unmasked, avg p, wall seconds, params_sha256);
- ``packs-ablation.csv``: a row per cell of the masked-loss ablation (rounds, masked loss on or off, seed, final
  global and local accuracies, params_sha256).

A group whose folder is missing, or whose sweep has not finished every cell, keeps its rows as they are, so a
partial rerun refreshes only what it finished.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
from collections import defaultdict
from typing import Dict, List

from hasfl_ray.analysis import read_run
from hasfl_ray.analysis.plots import read_metrics
from export_cells import machine  # this folder is on sys.path when the script runs
from make_report import read_csv, write_csv

#: Group -> its sweep folder under RUNS (run.sh's ``async`` and ``clocked``).
CLOCK_GROUPS = {"async-lognormal": "digits-async", "async-trace": "digits-async-trace",
                "clocked": "clocked-digits"}
#: Pack -> its sweep folder under RUNS (run.sh's ``packs``), in packs.md's order.
PACKS = {"HeteroFL": "packs/heterofl-cifar10", "FjORD": "packs/fjord-cifar10", "FedRolex": "packs/fedrolex-cifar10",
         "FIARSE-style": "packs/fiarse-protocol"}
RUN_COLUMNS = ("group", "variant", "seed", "best_accuracy", "final_accuracy", "avg_p", "late_updates", "wall_s",
               "params_sha256", "machine", "commit", "config")
LINE_COLUMNS = ("group", "variant", "seed", "round", "sim_time_s", "bytes", "test_accuracy", "staleness_mean",
                "late_updates")
PACK_COLUMNS = ("pack", "variant", "seed", "global_accuracy", "accuracy_at_width", "local_accuracy",
                "local_accuracy_unmasked", "avg_p", "wall_s", "params_sha256", "machine", "commit")
ABLATION_COLUMNS = ("rounds", "masked_loss", "variant", "seed", "final_accuracy", "local_accuracy",
                    "local_accuracy_unmasked", "params_sha256", "machine", "commit")


def full(value) -> str:
    """A number at full precision (Python's shortest round-tripping form), '' for none."""
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)


def planned(folder: str) -> Dict:
    """The folder's sweep.json ({} when there is none)."""
    if not os.path.exists(os.path.join(folder, "sweep.json")):
        return {}
    with open(os.path.join(folder, "sweep.json"), encoding="utf-8") as handle:
        return json.load(handle)


def finished_runs(folder: str) -> List[Dict]:
    """The finished runs of one sweep folder, in the sweep's cell order (sweep.json), else by name; [] while some
    cell of the sweep has not finished (a table over part of its seeds would read as the whole)."""
    runs = [read_run(os.path.dirname(p)) for p in glob.glob(os.path.join(folder, "*", "summary.json"))]
    sweep = planned(folder)
    if len(runs) < len(sweep.get("cells") or []):
        print(f"{folder}: {len(runs)} of {len(sweep['cells'])} cells finished; left out until the sweep ends")
        return []
    order = sweep.get("algorithms") or []
    rank = {name: i for i, name in enumerate(order)}
    return sorted(runs, key=lambda run: (rank.get(variant(run), len(rank)), variant(run), run["config"]["seed"]))


def variant(run: Dict) -> str:
    """The sweep's name for the run's cell (``<dataset>-<variant>-seed<seed>``)."""
    base = os.path.basename(os.path.normpath(run["path"]))
    return base[len(run["config"]["dataset"]) + 1:base.rindex("-seed")]


def clock_rows(group: str, folder: str, stamp: Dict[str, str]):
    runs, lines = [], []
    for run in finished_runs(folder):
        config, summary, name, seed = run["config"], run["summary"], variant(run), run["config"]["seed"]
        runs.append({"group": group, "variant": name, "seed": seed,
                     **{k: full(summary.get(k)) for k in ("best_accuracy", "final_accuracy", "avg_p",
                                                          "late_updates", "wall_s", "params_sha256")},
                     **stamp, "config": json.dumps(config, sort_keys=True)})
        for line in read_metrics(run["path"]):
            lines.append({"group": group, "variant": name, "seed": seed, "round": line["round"],
                          "sim_time_s": full(line["sim_time_s"]), "bytes": line["bytes_down"] + line["bytes_up"],
                          "test_accuracy": full(line.get("test_accuracy")),
                          "staleness_mean": full(line.get("staleness_mean")),
                          "late_updates": full(line.get("late_updates"))})
    return runs, lines


def local(summary: Dict, key: str) -> str:
    value = summary.get(key)
    return full(value.get("mean")) if isinstance(value, dict) else ""


def pack_rows(pack: str, folder: str, stamp: Dict[str, str]):
    rows = []
    for run in finished_runs(folder):
        summary = run["summary"]
        widths = summary.get("accuracy_at_width_final") or {}
        rows.append({"pack": pack, "variant": variant(run), "seed": run["config"]["seed"],
                     "global_accuracy": full(summary["final_accuracy"]),
                     "accuracy_at_width": json.dumps({w: a for w, a in widths.items()}, sort_keys=True),
                     "local_accuracy": local(summary, "local_accuracy"),
                     "local_accuracy_unmasked": local(summary, "local_accuracy_unmasked"),
                     "avg_p": full(summary["avg_p"]), "wall_s": full(summary.get("wall_s")),
                     "params_sha256": summary.get("params_sha256", ""), **stamp})
    return rows


def ablation_rows(folder: str, stamp: Dict[str, str]):
    rows = []
    for sweep in sorted(glob.glob(os.path.join(folder, "*-o*"))):
        for run in finished_runs(sweep):
            summary = run["summary"]
            rows.append({"rounds": run["config"]["rounds"], "masked_loss": "on" if run["config"]["masked_loss"]
                         else "off", "variant": variant(run), "seed": run["config"]["seed"],
                         "final_accuracy": full(summary["final_accuracy"]),
                         "local_accuracy": local(summary, "local_accuracy"),
                         "local_accuracy_unmasked": local(summary, "local_accuracy_unmasked"),
                         "params_sha256": summary.get("params_sha256", ""), **stamp})
    seeds = defaultdict(set)
    for row in rows:
        seeds[row["rounds"], row["masked_loss"]].add(row["seed"])
    # a length counts when both arms have finished the same seeds (a comparison paired by seed)
    rows = [r for r in rows if seeds[r["rounds"], "on"] == seeds[r["rounds"], "off"] and len(seeds[r["rounds"], "on"]) > 1]
    return sorted(rows, key=lambda r: (int(r["rounds"]), r["masked_loss"] != "on", int(r["seed"])))


def replace(path: str, new: List[Dict], columns, found: set, key: str) -> None:
    """Rows of the groups found replace theirs; the other groups' rows stay."""
    kept = [row for row in read_csv(path) if row[key] not in found]
    if new or kept:
        write_csv(path, kept + new, columns)


def head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", help="the RUNS folder of docs/reproduction/run.sh (default runs/reproduction)")
    parser.add_argument("results", help="where the CSVs go")
    parser.add_argument("--machine", help="the machine the runs were made on (default: this one)")
    parser.add_argument("--commit", help="the commit the runs were made on (default: this checkout's HEAD)")
    args = parser.parse_args(argv)
    stamp = {"machine": args.machine or machine(), "commit": args.commit or head_commit()}
    results = {name: os.path.join(args.results, f"{name}.csv")
               for name in ("clock-runs", "clock-lines", "packs-sample", "packs-ablation")}
    runs, lines, found = [], [], set()
    for group, sweep in CLOCK_GROUPS.items():
        if os.path.isdir(os.path.join(args.runs, sweep)):
            new_runs, new_lines = clock_rows(group, os.path.join(args.runs, sweep), stamp)
            if new_runs:
                runs, lines, found = runs + new_runs, lines + new_lines, found | {group}
                print(f"{group}: {len(new_runs)} runs, {len(new_lines)} lines")
    replace(results["clock-runs"], runs, RUN_COLUMNS, found, "group")
    replace(results["clock-lines"], lines, LINE_COLUMNS, found, "group")
    packs, found = [], set()
    for pack, sweep in PACKS.items():
        rows = pack_rows(pack, os.path.join(args.runs, sweep), stamp) if os.path.isdir(os.path.join(args.runs,
                                                                                                    sweep)) else []
        if rows:
            packs, found = packs + rows, found | {pack}
    replace(results["packs-sample"], packs, PACK_COLUMNS, found, "pack")
    ablation = ablation_rows(os.path.join(args.runs, "ablation"), stamp) if os.path.isdir(
        os.path.join(args.runs, "ablation")) else []
    if ablation:
        write_csv(results["packs-ablation"], ablation, ABLATION_COLUMNS)


if __name__ == "__main__":
    main()
