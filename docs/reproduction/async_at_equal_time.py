"""Accuracy at equal simulated time and at equal bytes for the runs of configs/digits-async.yaml (issue 38 item 5,
docs/reproduction/async-digits.md): for each variant, the mean ± std over its seeds of the test accuracy of the model
the server held at T seconds (the last evaluated line with sim_time_s <= T) and after B bytes moved (down and up,
cumulative), T and B the smallest end of any run (so every run counts at both); also updates and staleness.

    python docs/reproduction/async_at_equal_time.py runs/digits-async > docs/reproduction/async-digits.csv

make_report.py writes the same CSV from the committed results/clock-lines.csv (report_clock.py); this script reads
the run folders themselves.
"""

import csv
import json
import os
import statistics
import sys


def trajectory(run):
    with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as handle:
        return points([json.loads(line) for line in handle])


def points(lines):
    """(simulated seconds, bytes moved by then (down and up, cumulative), test accuracy, mean staleness) per
    metrics.jsonl line."""
    moved, out = 0, []
    for line in lines:
        moved += line["bytes_down"] + line["bytes_up"]
        out.append((line["sim_time_s"], moved, line["test_accuracy"], line.get("staleness_mean")))
    return out


def at(points, limit, axis):
    """The accuracy of the last evaluated point with its coordinate ``axis`` (0 time, 1 bytes) <= limit."""
    value = None
    for point in points:
        if point[axis] > limit:
            break
        if point[2] is not None:
            value = point[2]
    return value


def ends(runs):
    """(T, B): the earliest end of any run in simulated seconds and in bytes."""
    return (min(points[-1][0] for group in runs.values() for points in group),
            min(points[-1][1] for group in runs.values() for points in group))


def per_run(points, end_time, end_bytes):
    """One run at T and B: accuracy at T and at B, server updates and bytes moved by T."""
    return (at(points, end_time, 0), at(points, end_bytes, 1), sum(1 for p in points if p[0] <= end_time),
            max((p[1] for p in points if p[0] <= end_time), default=0))


def table(runs, out):
    """The CSV (csv.writer's dialect) of ``runs`` ({variant: [points of each seed]}, in row order) into ``out``."""
    end_time, end_bytes = ends(runs)
    writer = csv.writer(out)
    writer.writerow(["variant", "seeds", "T_s", "acc_at_T_mean", "acc_at_T_std", "B_MB", "acc_at_B_mean",
                     "acc_at_B_std", "updates_by_T", "MB_by_T", "staleness_mean"])
    for variant, group in runs.items():
        by_time = [at(points, end_time, 0) for points in group]
        by_bytes = [at(points, end_bytes, 1) for points in group]
        updates = statistics.mean(sum(1 for p in points if p[0] <= end_time) for points in group)
        moved = statistics.mean(max((p[1] for p in points if p[0] <= end_time), default=0) for points in group)
        stale = [p[3] for points in group for p in points if p[3] is not None and p[0] <= end_time]
        row = [variant, len(group), f"{end_time:.2f}", f"{statistics.mean(by_time):.4f}",
               f"{statistics.stdev(by_time):.4f}", f"{end_bytes / 1e6:.1f}", f"{statistics.mean(by_bytes):.4f}",
               f"{statistics.stdev(by_bytes):.4f}", f"{updates:.0f}", f"{moved / 1e6:.1f}",
               f"{statistics.mean(stale):.2f}" if stale else ""]
        writer.writerow(row)


def main(root):
    runs = {}
    for name in sorted(os.listdir(root)):
        if os.path.exists(os.path.join(root, name, "summary.json")):
            variant = name.split("-seed")[0].removeprefix("digits-")
            runs.setdefault(variant, []).append(trajectory(os.path.join(root, name)))
    table(runs, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
