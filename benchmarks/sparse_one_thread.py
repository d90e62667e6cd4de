"""The fused sparse kernel alone, one process, on `hasfl-ray bench aggregate --layout L`'s EMNIST federation: the
median process CPU time of REPEATS calls (one thread unless OMP_NUM_THREADS says otherwise), then of the whole call
(aggregate_updates: its checks and the layout too), so that builds can be alternated in fresh processes on a loaded
machine (HASFL_PORTABLE_CPU_KERNEL=1, HASFL_NO_AVX512_CPU_KERNEL=1, or another checkout's extension on PYTHONPATH).
Figures: benchmarks/RESULTS.md.

    OMP_NUM_THREADS=1 python benchmarks/sparse_one_thread.py mask 5 [CLIENTS]
"""

import statistics
import sys
import time

import torch


USAGE = "usage: sparse_one_thread.py index|mask REPEATS [CLIENTS]"


def problem_of(argv) -> str:
    """What is wrong with the arguments, as a sentence naming the value and what was expected, or ''."""
    if len(argv) not in (2, 3):
        return (f"sparse_one_thread.py takes 2 or 3 arguments, got {len(argv)} ({' '.join(argv) or 'none'}); expected "
                "a layout, a positive number of repeats and optionally of clients (default 50)")
    if argv[0] not in ("index", "mask"):
        return f"the layout is {argv[0]!r}; expected index or mask"
    for what, value in zip(("REPEATS", "CLIENTS"), argv[1:]):
        if not value.isdigit() or int(value) < 1:
            return f"{what} is {value!r}; expected a positive whole number"
    return ""


def main(argv):
    problem = problem_of(argv)
    if problem:
        print(f"{problem} ({USAGE})", file=sys.stderr)
        return 2
    from hasfl_ray import ops
    from hasfl_ray.bench.layouts import layout_implementations, make_layout_federation

    if not ops.available():
        print("the fused kernel needs hasfl_ray._C; expected the extension built (pip install -e .)", file=sys.stderr)
        return 2
    layout, repeats, clients = argv[0], int(argv[1]), int(argv[2]) if len(argv) == 3 else 50
    from hasfl_ray.bench.federation import check_case_memory
    from hasfl_ray.errors import ConfigError

    try:
        check_case_memory(["emnist"], [clients])  # one sentence, never minutes of swapping
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    federation = make_layout_federation("emnist", clients, layout)
    runs = layout_implementations(federation, layout, include_slow=False)
    medians = {}
    for name in ("fused kernel", "fused"):  # the op on a built layout; the whole call (checks and layout too)
        run = runs[name]
        run()
        times = []
        for _ in range(repeats):
            start = time.process_time()
            run()
            times.append(time.process_time() - start)
        medians[name] = statistics.median(times)
    print(f"{layout}: {1000 * medians['fused kernel']:.1f} ms (median of {repeats}, process CPU time, "
          f"{torch.get_num_threads()} thread(s)); end to end {1000 * medians['fused']:.1f} ms, "
          f"{medians['fused'] / medians['fused kernel']:.2f}x the kernel alone (the index lists and bitmasks "
          "checked and laid out around it)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
