"""Turn the run folders of docs/reproduction/run.sh into the compact CSVs make_report.py builds everything from.

    python docs/reproduction/export_cells.py runs/reproduction docs/reproduction/results

Writes three files under the results folder, one row per cell (and per client, per round):

- ``cells.csv``: per (group, algorithm, seed): the protocol (rounds, clients, local epochs, estimator, tier mix, test
  images), best and final accuracy of the full-width model, the round of the best, average width p (over the run and
  after warm-up), the frozen fraction at the end (coordinates bit-identical to w^(0), the coverage monitor's), the
  params_sha256, the machine that computed it and where the row comes from (``source``);
- ``clients.csv``: per client of each cell: p^max, final p, TV distance of its labels, final H̃ of the HAS-FL cells
  (Table 5's input, at full precision);
- ``curves.csv``: per round of each cell: test accuracy and loss, mean H̃, mean p, frozen fraction (the figures; six
  significant digits).

A cell (group, i.e. report folder of make_report.py, algorithm and seed) whose run is found replaces that cell's rows;
the rows of a cell whose run is not there are kept as they are (with their ``source``), so a partial rerun refreshes
only what it reran.
``machine`` is the machine this script runs on (the runs are assumed made here; ``--machine`` says otherwise): the
params_sha256 of a CPU run reproduce on the same processor model, instruction set and torch build only
(docs/RELIABILITY.md).
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
from typing import Dict, Iterable

from hasfl_ray.analysis import read_run
from hasfl_ray.analysis.plots import read_metrics
from hasfl_ray.analysis.report import run_option
from hasfl_ray.training.determinism import machine_type
from make_report import read_csv, write_csv  # this folder is on sys.path when the script runs

#: Report folder -> the run.sh sweep folders (under RUNS) whose cells it holds. The masked Table 5 on the digits is
#: the HAS-FL cells of ``digits`` (run.sh's table5-confound sweep reuses them), so it has no group of its own.
GROUPS = {
    "digits": ["digits-figure6-frontier", "digits-table3-allocation", "digits-table4-coverage-ablation",
               "digits-table6-full-model", "digits-table5-confound"],
    "digits-confound-common-core": ["digits-table5-confound-common-core"],
    "digits-paper-tier-mix": ["digits-avg-p-paper-tier-mix"],
    "emnist-sample": ["emnist-sample-table3", "emnist-sample-table4", "emnist-sample-table6"],
    "emnist-sample-confound-common-core": ["emnist-sample-table5-common-core"],
    "cifar10-sample": ["cifar10-sample-table3", "cifar10-sample-table4", "cifar10-sample-table6"],
    "cifar10-sample-confound-common-core": ["cifar10-sample-table5-common-core"],
}
CELL_COLUMNS = ("group", "dataset", "algorithm", "estimator", "tier_counts", "seed", "rounds", "clients",
                "clients_per_round", "local_epochs", "lr", "test_samples", "best_accuracy", "best_round",
                "final_accuracy", "avg_p", "avg_p_post_warmup", "frozen_fraction", "params_sha256", "machine",
                "source")
CLIENT_COLUMNS = ("group", "dataset", "algorithm", "seed", "client", "p_max", "p_final", "tv_distance", "h_tilde")
CURVE_COLUMNS = ("group", "dataset", "algorithm", "seed", "round", "test_accuracy", "test_loss", "mean_h", "avg_p",
                 "frozen_fraction")
#: Test images of each dataset as run here (the embedded digits: a fifth of scikit-learn's 1,797; the samples in
#: CPU sample subsets of docs/datasets.md): what one image is worth in accuracy.
TEST_SAMPLES = {"digits": 359, "emnist": 3420, "cifar10": 200}


def machine() -> str:
    """What decides the last bits of a CPU run (:func:`hasfl_ray.training.determinism.machine_type`), on one line."""
    found = machine_type()
    return f"{found['cpu_model']}; {found['cpu_capability']}; torch {found['torch']}"


def label(config: Dict) -> str:
    """The algorithm label of the tables (``hasfl (coverage off)`` for HAS-FL without the guarantee)."""
    off = config["algorithm"] == "hasfl" and not run_option(config, "coverage", True)
    return config["algorithm"] + (" (coverage off)" if off else "")


def number(value) -> str:
    """A float in 6 significant digits ('' for none): the figures need no more, and the CSVs stay small."""
    return "" if value is None or value == "" else format(float(value), ".6g")


def cells_of(group: str, folders: Iterable[str], machine_name: str, source: str):
    """The (cell, clients, curves) rows of one group's runs; a cell run by several sweeps (reused) counts once."""
    cells, clients, curves, seen = [], [], [], set()
    for folder in folders:
        for summary in sorted(glob.glob(os.path.join(folder, "*", "summary.json"))):
            run = read_run(os.path.dirname(summary))
            config, result = run["config"], run["summary"]
            name, seed = label(config), config["seed"]
            if (name, seed) in seen:
                continue
            seen.add((name, seed))
            metrics = read_metrics(run["path"])
            accuracy = [line.get("test_accuracy") for line in metrics]
            best_round = max(range(len(accuracy)), key=lambda i: (accuracy[i] is not None, accuracy[i] or 0.0))
            key = {"group": group, "dataset": config["dataset"], "algorithm": name, "seed": seed}
            cells.append({**key, "estimator": run_option(config, "estimator", config.get("estimator", "masked")),
                          "tier_counts": " ".join(map(str, config.get("tier_counts") or [])),
                          "rounds": result.get("rounds", len(metrics)), "clients": config.get("clients"),
                          "clients_per_round": config.get("clients_per_round"),
                          "local_epochs": config.get("local_epochs"), "lr": config.get("lr"),
                          "test_samples": TEST_SAMPLES.get(config["dataset"], ""),
                          "best_accuracy": result["best_accuracy"], "best_round": metrics[best_round].get("round"),
                          "final_accuracy": result["final_accuracy"], "avg_p": result["avg_p"],
                          "avg_p_post_warmup": result.get("avg_p_post_warmup", ""),
                          "frozen_fraction": metrics[-1].get("frozen_fraction", "") if metrics else "",
                          "params_sha256": result.get("params_sha256", ""), "machine": machine_name,
                          "source": source})
            for row in run["clients"]:  # every cell's: the allocation figure draws each method's final p
                clients.append({**key, "client": row["client"], **{c: row[c] for c in CLIENT_COLUMNS[5:]}})
            for line in metrics:
                curves.append({**key, "round": line.get("round"),
                               **{c: number(line.get(c)) for c in CURVE_COLUMNS[5:]}})
    return cells, clients, curves


def cell_key(row: Dict) -> tuple:
    """A cell: its group, algorithm label and seed (the same in all three files)."""
    return row["group"], row["algorithm"], str(row["seed"])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", help="the RUNS folder of docs/reproduction/run.sh (default runs/reproduction)")
    parser.add_argument("results", help="where cells.csv, clients.csv and curves.csv go")
    parser.add_argument("--machine", help="the machine the runs were made on (default: this one)")
    parser.add_argument("--source", default=f"rerun {datetime.date.today().isoformat()}",
                        help="the source column of the rows written (default: 'rerun <today>')")
    args = parser.parse_args(argv)
    os.makedirs(args.results, exist_ok=True)
    files = {name: os.path.join(args.results, f"{name}.csv") for name in ("cells", "clients", "curves")}
    old = {name: read_csv(path) for name, path in files.items()}
    new = {"cells": [], "clients": [], "curves": []}
    found = set()
    for group, sweeps in GROUPS.items():
        cells, clients, curves = cells_of(group, [os.path.join(args.runs, s) for s in sweeps],
                                          args.machine or machine(), args.source)
        found |= {cell_key(cell) for cell in cells}
        new["cells"] += cells
        new["clients"] += clients
        new["curves"] += curves
        if cells:
            print(f"{group}: {len(cells)} cells from {args.runs}")
    for (name, path), columns in zip(files.items(), (CELL_COLUMNS, CLIENT_COLUMNS, CURVE_COLUMNS)):
        kept = [row for row in old[name] if cell_key(row) not in found]
        order = list(GROUPS)
        rows = sorted(kept + new[name], key=lambda r: order.index(r["group"]) if r["group"] in order else len(order))
        write_csv(path, rows, columns)


if __name__ == "__main__":
    main()
