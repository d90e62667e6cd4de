"""Sweep cells per hour when K cells share one GPU (issue 39 item 7): K runs at once, as `sweep --cells-per-gpu K`
places them (each cell its own process on the card), for K = 1, 2, 4, 8.

Each K starts K ``hasfl-ray simulate`` processes together (seeds 42, 43, ...; the same config otherwise), waits for
all, and reports the wall time, cells per hour (K x 3600 / wall), each cell's steady round (the median of its
rounds after the first, from metrics.jsonl) and the slowdown: the steady round at K over the steady round alone.
The slowdown is what ``bench_protocol.py --share-slowdown`` takes for the Table 3 projection at that K.

    python benchmarks/bench_cells_per_gpu.py --k 1,2,4,8 --out /tmp/cells -- \
        --dataset emnist --data-dir DATA --rounds 6 --device cuda

Everything after ``--`` goes to ``simulate`` as it is (``--backend local --quiet --force --out --seed`` are added).
What it does not include: Ray's placement of the cells (the sweep's driver, a few seconds per sweep, not per cell).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_k(k: int, simulate_args: list, out: str) -> dict:
    procs, logs = [], []
    start = time.perf_counter()
    for i in range(k):
        cell = os.path.join(out, f"k{k}", f"cell{i}")
        os.makedirs(cell, exist_ok=True)
        log = open(os.path.join(out, f"k{k}-cell{i}.log"), "w")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, os.path.join(ROOT, "cli"), "simulate", "--backend", "local",
                                       "--quiet", "--force", "--seed", str(42 + i), "--out", cell, *simulate_args],
                                      stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - start
    for log in logs:
        log.close()
    steady = []
    for i in range(k):
        path = os.path.join(out, f"k{k}", f"cell{i}", "metrics.jsonl")
        if os.path.exists(path):
            rounds = [json.loads(line)["wall_s"] for line in open(path)]
            if len(rounds) > 1:
                steady.append(statistics.median(rounds[1:]))
    return {"k": k, "exit_codes": codes, "wall_s": wall, "cells_per_hour": k * 3600 / wall,
            "steady_round_s": statistics.mean(steady) if steady else None, "cells_timed": len(steady)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", default="1,2,4,8", help="cells sharing the GPU, comma-separated (default 1,2,4,8)")
    parser.add_argument("--out", required=True, help="a scratch folder for the cells' run directories")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("simulate_args", nargs=argparse.REMAINDER, help="-- then simulate's options")
    args = parser.parse_args()
    extra = args.simulate_args[1:] if args.simulate_args[:1] == ["--"] else args.simulate_args
    try:
        ks = [int(k) for k in args.k.split(",")]
    except ValueError:
        raise SystemExit(f"--k is {args.k!r}; expected comma-separated positive integers such as 1,2,4,8")
    if not ks or min(ks) < 1:
        raise SystemExit(f"--k is {args.k!r}; expected comma-separated positive integers such as 1,2,4,8")
    rows = []
    for k in ks:
        row = run_k(k, extra, args.out)
        rows.append(row)
        base = rows[0]["steady_round_s"]
        row["slowdown"] = row["steady_round_s"] / base if row["steady_round_s"] and base else None
        print(f"K={k}: exit {row['exit_codes']}, wall {row['wall_s']:.1f} s, {row['cells_per_hour']:.0f} cells/h, "
              f"steady round {row['steady_round_s'] or float('nan'):.3f} s, slowdown "
              f"{row['slowdown'] or float('nan'):.2f}x", flush=True)
    best = max(rows, key=lambda r: r["cells_per_hour"])
    print(f"best K: {best['k']} ({best['cells_per_hour']:.0f} cells/h)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
