"""The fused sparse kernel alone, one process, on `hasfl-ray bench aggregate --layout L`'s EMNIST federation: the
median process CPU time of REPEATS calls (one thread unless OMP_NUM_THREADS says otherwise), so that builds can be
alternated in fresh processes on a loaded machine (HASFL_PORTABLE_CPU_KERNEL=1, HASFL_NO_AVX512_CPU_KERNEL=1, or
another checkout's extension on PYTHONPATH). Figures: benchmarks/RESULTS.md.

    OMP_NUM_THREADS=1 python benchmarks/sparse_one_thread.py mask 5 [CLIENTS]
"""

import statistics
import sys
import time

import torch


def main(argv):
    if len(argv) not in (2, 3) or argv[0] not in ("index", "mask") or not argv[1].isdigit() or int(argv[1]) < 1 \
            or (len(argv) == 3 and (not argv[2].isdigit() or int(argv[2]) < 1)):
        print("usage: sparse_one_thread.py index|mask REPEATS [CLIENTS]; expected a layout, a positive number of "
              "repeats and optionally of clients (default 50)", file=sys.stderr)
        return 2
    from hasfl_ray import ops
    from hasfl_ray.bench.layouts import layout_implementations, make_layout_federation

    if not ops.available():
        print("the fused kernel needs hasfl_ray._C; expected the extension built (pip install -e .)", file=sys.stderr)
        return 2
    layout, repeats = argv[0], int(argv[1])
    federation = make_layout_federation("emnist", int(argv[2]) if len(argv) == 3 else 50, layout)
    run = layout_implementations(federation, layout, include_slow=False)["fused kernel"]
    run()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    print(f"{layout}: {1000 * statistics.median(times):.1f} ms (median of {repeats}, process CPU time, "
          f"{torch.get_num_threads()} thread(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
