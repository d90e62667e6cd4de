"""Two intra-op threads against one, with OpenMP's waiting threads spinning or sleeping (issue 46 item 5).

Each case runs `hasfl-ray simulate` on the EMNIST sample (or digits) as a subprocess with ``--trainer-threads``
1 or 2 and ``OMP_WAIT_POLICY`` ACTIVE (spin, what a default of some OpenMP runtimes amounts to under load) or
PASSIVE (sleep, what the console script now sets), on an idle machine and beside a busy process that takes one core
(``--hog``: the condition of trainer actors or sweep cells sharing a machine). Cases are interleaved per repeat, so
a busy spell of the machine hits all of them. Printed: wall seconds and process CPU seconds per round (the median
over repeats), and each case's ratio to one thread on the same load, with the runs' params_sha256: the wait policy
never changes it; the thread count may (a reduction split in two sums in another order), which is why
``trainer_threads`` is part of a run's configuration.

    python benchmarks/bench_threads.py --data-dir DIR [--rounds 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = (("1 thread", 1, "PASSIVE"), ("2 threads, PASSIVE", 2, "PASSIVE"), ("2 threads, ACTIVE", 2, "ACTIVE"))


def hog() -> subprocess.Popen:
    """A process that keeps one core busy (pure Python arithmetic) until killed."""
    return subprocess.Popen([sys.executable, "-c", "x = 0\nwhile True:\n    x = (x + 1) % 1000003\n"])


def run_case(threads: int, policy: str, args, out: str):
    env = dict(os.environ, OMP_WAIT_POLICY=policy)
    env.pop("_HASFL_RAY_SET_OMP_WAIT_POLICY", None)
    command = [os.path.join(os.path.dirname(sys.executable), "hasfl-ray"), "simulate", "--backend", "local",
               "--dataset", args.dataset, "--rounds", str(args.rounds), "--trainer-threads", str(threads),
               "--out", out, "--quiet", "--json", "--local-eval-clients", "off"]
    if args.data_dir:
        command += ["--data-dir", args.data_dir]
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"case failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall / args.rounds, cpu / args.rounds, json.loads(done.stdout)["params_sha256"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="emnist")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {}
    for load in ("idle", "one core busy"):
        for repeat in range(args.repeats):
            busy = hog() if load != "idle" else None
            try:
                for name, threads, policy in CASES:
                    with tempfile.TemporaryDirectory() as folder:
                        results.setdefault((load, name), []).append(
                            run_case(threads, policy, args, os.path.join(folder, "run")))
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            print(f"{load}: repeat {repeat + 1} of {args.repeats} done", file=sys.stderr, flush=True)
    print(f"{'load':<14} {'case':<20} {'wall s/round':>13} {'CPU s/round':>12} {'wall / 1 thread':>16}  params_sha256")
    for load in ("idle", "one core busy"):
        base = statistics.median(r[0] for r in results[(load, CASES[0][0])])
        for name, _, _ in CASES:
            rows = results[(load, name)]
            wall = statistics.median(r[0] for r in rows)
            cpu = statistics.median(r[1] for r in rows)
            hashes = sorted({r[2][:12] for r in rows})
            print(f"{load:<14} {name:<20} {wall:>13.3f} {cpu:>12.3f} {wall / base:>15.2f}x  {', '.join(hashes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
