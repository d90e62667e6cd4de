"""Time to first round: from the prompt to the first round's metrics line, of `hasfl-ray simulate` with the defaults
(backend auto: Ray where it is installed) and with `--backend local`, side by side (issue 24, item 8).

Each repeat runs the real console script as a subprocess, the two backends one after the other (interleaved, so a
busy spell of the machine hits both), and measures from the moment the process is started to the moment RUN/
metrics.jsonl holds its first line (polled every 5 ms); the run then finishes and exits before the next starts.
The target: the default within 5 s, or within 1.5x the local backend's time, whichever is larger. Both runs'
params_sha256 are compared too (the early Ray start must not change a bit), and the round Ray took over at is
printed (the default trains its first rounds in the driver while Ray starts: docs/ray.md, 'Start-up').

    python benchmarks/bench_first_round.py                     # 5 repeats of `simulate --rounds 1`
    python benchmarks/bench_first_round.py --repeats 3 -- --dataset synthetic     # flags after -- go to simulate
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

#: The bound of item 8: the default's first round within this many seconds, or RATIO x the local backend's.
TARGET_S, RATIO = 5.0, 1.5


def console_script() -> List[str]:
    """The `hasfl-ray` beside this Python (the installed console script), else `python -m hasfl_ray.cli.main`."""
    script = os.path.join(os.path.dirname(sys.executable), "hasfl-ray")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "hasfl_ray.cli.main"]


def first_round(args: Sequence[str], out: str, timeout: float) -> Dict[str, object]:
    """Run `hasfl-ray simulate ARGS --out OUT --quiet`; seconds from the start to the first metrics line, the whole
    run's seconds and its params_sha256."""
    metrics = os.path.join(out, "metrics.jsonl")
    start = time.perf_counter()
    process = subprocess.Popen([*console_script(), "simulate", *args, "--out", out, "--quiet", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first: Optional[float] = None
    while process.poll() is None and time.perf_counter() - start < timeout:
        if first is None and os.path.exists(metrics) and os.path.getsize(metrics) > 0:
            first = time.perf_counter() - start
        time.sleep(0.005)
    summary, total = finished(process, args, start)
    if first is None and os.path.exists(metrics) and os.path.getsize(metrics) > 0:
        first = total  # the run ended between two polls
    return {"first": first, "total": total, "sha": summary["params_sha256"], "ray_from": summary.get("ray_from_round")}


def finished(process: subprocess.Popen, args: Sequence[str], start: float) -> Tuple[Dict[str, object], float]:
    """The summary `hasfl-ray simulate ARGS` printed and the seconds since ``start``, once ``process`` has ended
    (killed when still running after the caller's timeout); a failed run ends the benchmark with its error."""
    if process.poll() is None:
        process.kill()
    stdout, stderr = process.communicate()
    total = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"`hasfl-ray simulate {' '.join(args)}` failed (exit {process.returncode}): "
                         f"{stderr.strip()[-500:]}")
    return json.loads(stdout[:stdout.rindex("}") + 1]), total


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds a run may take before it is killed.")
    parser.add_argument("extra", nargs="*", help="Flags for simulate (after --).")
    options = parser.parse_args(argv)
    common = ["--rounds", str(options.rounds), *options.extra]
    runs = {"default": common, "local": [*common, "--backend", "local"]}
    times: Dict[str, List[float]] = {name: [] for name in runs}
    ends: Dict[str, List[float]] = {name: [] for name in runs}
    takeovers: List[object] = []
    shas: Dict[str, set] = {name: set() for name in runs}
    scratch = tempfile.mkdtemp(prefix="bench-first-round-")
    try:
        print(f"{'repeat':>6}  {'default s':>10}  {'local s':>8}  {'ratio':>6}")
        for repeat in range(options.repeats):
            row = {}
            for name, args in runs.items():
                out = os.path.join(scratch, f"{name}-{repeat}")
                result = first_round(args, out, options.timeout)
                times[name].append(result["first"])
                ends[name].append(result["total"])
                if name == "default":
                    takeovers.append(result["ray_from"])
                shas[name].add(result["sha"])
                row[name] = result["first"]
                shutil.rmtree(out, ignore_errors=True)
            print(f"{repeat + 1:>6}  {row['default']:>10.2f}  {row['local']:>8.2f}  "
                  f"{row['default'] / row['local']:>6.2f}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    default, local = statistics.median(times["default"]), statistics.median(times["local"])
    bound = max(TARGET_S, RATIO * local)
    print(f"{'median':>6}  {default:>10.2f}  {local:>8.2f}  {default / local:>6.2f}")
    print(f"time to first round, median of {options.repeats}: default {default:.2f} s (min "
          f"{min(times['default']):.2f}), --backend local {local:.2f} s (min {min(times['local']):.2f}); "
          f"bound max({TARGET_S:g} s, {RATIO:g} x local) = {bound:.2f} s: {'met' if default <= bound else 'NOT met'}")
    print(f"whole run, median: default {statistics.median(ends['default']):.2f} s, --backend local "
          f"{statistics.median(ends['local']):.2f} s; Ray took over at round (summary.json ray_from_round; None: "
          f"the run ended first, every round ran in the driver): {', '.join(map(str, takeovers))}")
    same = len(shas["default"] | shas["local"]) == 1
    print(f"params_sha256: {'identical' if same else 'DIFFERENT'} across backends and repeats "
          f"({', '.join(sorted(s[:12] for s in shas['default'] | shas['local']))})")


if __name__ == "__main__":
    main()
