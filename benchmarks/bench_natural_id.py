"""Natural-client partitioning of a million rows: hasfl-ray's numpy grouping against flwr-datasets' own
NaturalIdPartitioner on the same synthetic dataset (issue 47 item 2; Flower #3276 estimated 60 hours for FEMNIST by
writer).

The dataset: ``--rows`` rows (default 1,000,000) whose id column holds ``--ids`` distinct writer ids (default 3,597,
FEMNIST's writer count) as strings in a seeded random order, built with ``datasets.Dataset.from_dict`` in memory
(nothing is downloaded). Timed, each the median of ``--repeats``:

* ours: reading the id column and :func:`hasfl_ray.data.flower.natural_id_partition` (one stable argsort);
* Flower: ``NaturalIdPartitioner(partition_by="writer")`` on the same dataset, building every partition's index
  list (what ``load_partition`` builds on its first call; the ``select`` of each partition is not timed, as ours
  returns indices too).

Both give the same partitions (checked here on every run: same client order, same rows), and the machine's load
average is printed with the figures, as the machine is shared.

    python benchmarks/bench_natural_id.py [--rows 1000000] [--ids 3597] [--repeats 3] [--flower-repeats 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def synthetic(rows: int, ids: int, seed: int = 0):
    import datasets

    rng = np.random.default_rng(seed)
    writers = np.char.add("f", rng.integers(0, ids, size=rows).astype(str))
    return datasets.Dataset.from_dict({"writer": writers.tolist(), "label": rng.integers(0, 62, size=rows).tolist()})


def ours(table):
    from hasfl_ray.data.flower import column_array, natural_id_partition

    return natural_id_partition(column_array(table, "writer"))


def flowers(table):
    from flwr_datasets.partitioner import NaturalIdPartitioner

    chosen = NaturalIdPartitioner(partition_by="writer")
    chosen.dataset = table
    chosen._create_int_partition_id_to_natural_id()
    chosen._create_natural_id_to_int_partition_id()
    chosen._create_partition_id_to_indices()  # what load_partition builds on its first call
    return chosen


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ids", type=int, default=3597)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flower-repeats", type=int, default=1)
    args = parser.parse_args()
    import datasets
    from tqdm import tqdm  # noqa: F401 (Flower's loop shows a bar: off, it is not what is timed)

    datasets.disable_progress_bars()
    os.environ.setdefault("TQDM_DISABLE", "1")
    import hasfl_ray.data.flower  # noqa: F401 (imported before timing: torch's import is no part of a partition)

    table = synthetic(args.rows, args.ids)
    print(f"{args.rows:,} rows, {args.ids:,} writer ids; load average before: {os.getloadavg()}")
    mine = [timed(ours, table) for _ in range(args.repeats)]
    theirs = [timed(flowers, table) for _ in range(args.flower_repeats)]
    parts, distinct = mine[0][1]
    flower = theirs[0][1]
    assert len(parts) == flower.num_partitions
    for i, part in enumerate(parts):
        assert distinct[i] == flower.partition_id_to_natural_id[i]
        assert part.tolist() == list(flower._partition_id_to_indices[i])
    ours_s = statistics.median(t for t, _ in mine)
    flower_s = statistics.median(t for t, _ in theirs)
    print(f"ours (numpy argsort): {ours_s:.3f} s (median of {args.repeats}: "
          f"{', '.join(f'{t:.3f}' for t, _ in mine)})")
    print(f"flwr-datasets NaturalIdPartitioner: {flower_s:.3f} s (median of {args.flower_repeats}: "
          f"{', '.join(f'{t:.3f}' for t, _ in theirs)})")
    print(f"speed-up {flower_s / ours_s:.1f}x; identical partitions: yes; load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
