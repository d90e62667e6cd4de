"""Short rounds on Ray: `hasfl-ray simulate` with 2 Ray actors against `--backend local`, as a user compares them
(issue 29, item 1).

The workload is the digits protocol of benchmarks/bench_vs_flower.py (20 clients, 10 a round, batch 32, lr 0.05)
at three settings:

- ``hasfl``: HAS-FL (the default algorithm: sub-models of several widths), 2 local epochs, a round of about 0.1 s
  on one core (issue 46 item 3: Ray x2 >= 1.5x local in every repeat);
- ``short``: FedAvg, 2 local epochs, a round of about 0.17 s: the round is as much the engine's as the training's;
- ``training``: FedAvg, 20 local epochs, a round of about 1 s: training-bound.

Each repeat runs the console script's own ``main`` as a subprocess for each backend, one after the other
(interleaved, so a busy spell of the machine hits both), with the defaults a user gets (checkpoints, metrics, every
evaluation the command does), through benchmarks/stamped_cli.py, which notes the moment each round ends in the
driver (its update applied, the next round about to be planned; on the local backend after the round's evaluation,
on Ray before it, since there it runs behind the next round's training). Rounds/s is measured from the end of
round 9 to the end of the last round: the first ten rounds (start-up, model building, caches) are left out. The
lines of metrics.jsonl are not a clock: on Ray a round's line, a checkpoint round's included, is written a round or
two late (docs/ray.md, 'A round on Ray'), and polling the file costs the CPU the trainers share. The time to the
end of the first round is printed beside the rates, and the default command's (``--backend`` left out: local
first, Ray takes over) with it. The two-process capacity of the machine (the same CNN steps in 1 process, then 2
at once: 2.0 on two idle cores) is measured before and after, since two actors can only be that much faster than
one process. Every run's params_sha256 is compared: they must be equal. Over the same rounds as the rate, each
run's CPU is read from /proc (benchmarks/run_cpu.py, holds under load): per round, the driver's, each trainer's,
Ray's raylet and GCS, all of the run's beside the trainers (what Ray costs on top of the training), and the
machine's CPU outside the run (something else running: a repeat to discount).

A target is met when every repeat's ratio (Ray against the local run interleaved with it) reaches it, not the
median. ``--placements`` names where Ray's server runs (``--server-placement``: auto, driver, actor; each a Ray run
of its own in every repeat, interleaved with the rest), to compare them on the same machine at the same time.

    python benchmarks/bench_short_rounds.py                      # every setting, 3 interleaved repeats
    python benchmarks/bench_short_rounds.py --settings hasfl --placements driver,actor --no-default
    python benchmarks/bench_short_rounds.py --settings short --repeats 1 --rounds 20
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_first_round import finished  # noqa: E402
from bench_simulation import parallel_capacity  # noqa: E402
from arguments import Parser, integer, names  # noqa: E402
from run_cpu import CpuWatch  # noqa: E402

#: The bounds of issue 29 item 1 and issue 46 item 3: Ray with 2 actors over the local backend, in rounds/s, in
#: every repeat.
TARGETS = {"hasfl": 1.5, "short": 1.5, "training": 1.6}
SETTINGS = {"hasfl": dict(algorithm="hasfl", local_epochs=2, rounds=40),
            "short": dict(algorithm="fedavg", local_epochs=2, rounds=40),
            "training": dict(algorithm="fedavg", local_epochs=20, rounds=21)}
COMMON = ["--dataset", "digits", "--clients", "20", "--clients-per-round", "10", "--batch-size", "32", "--lr", "0.05",
          "--seed", "0"]
RAY2 = ["--backend", "ray", "--actors", "2"]
#: The ray2 runs use Ray from their first round (as a run joining a cluster does): left to itself, a run this short
#: ends in the driver before Ray would have started (docs/ray.md, 'Start-up'), which the ``default`` column shows.
RAY_ENV = {"HASFL_HANDOFF_ROUND": "0"}


def backends(placements: Sequence[str], default: bool) -> Dict[str, List[str]]:
    """The runs of a repeat, in order: local, a Ray run with 2 actors per server placement (``ray2`` for auto,
    ``ray2-driver``, ``ray2-actor``), and the default command."""
    runs = {"local": ["--backend", "local"]}
    for placement in placements:
        if placement not in ("auto", "driver", "actor"):
            raise SystemExit(f"--placements has {placement!r}; expected auto, driver or actor")
        runs["ray2" if placement == "auto" else f"ray2-{placement}"] = \
            RAY2 + ([] if placement == "auto" else ["--server-placement", placement])
    if default:
        runs["default"] = []
    return runs
#: Rounds left out of the rate: start-up, model building, first-time caches.
SKIP = 10
#: `hasfl-ray` with a stamp as each round ends (benchmarks/stamped_cli.py).
STAMPED_CLI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stamped_cli.py")


def run(args: Sequence[str], out: str, timeout: float = 600.0, env: Optional[Dict[str, str]] = None
        ) -> Dict[str, object]:
    """`hasfl-ray simulate ARGS --out OUT --quiet` (through stamped_cli.py): seconds from the process start to the
    end of each round, the whole run's seconds, and its summary."""
    stamps_file = os.path.join(os.path.dirname(out), os.path.basename(out) + "-stamps.json")
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, STAMPED_CLI, "simulate", *args, "--out", out, "--quiet", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {}), "HASFL_ROUND_STAMPS": stamps_file})
    watch = CpuWatch(process.pid).start()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        watch.stop()
    summary, total = finished(process, args, start)
    with open(stamps_file, encoding="utf-8") as handle:
        stamps = [seconds - start for _, seconds in json.load(handle)]
    os.unlink(stamps_file)
    cpu = watch.window(start + stamps[SKIP - 1], start + stamps[-1]) if len(stamps) > SKIP else None
    return {"stamps": stamps, "total": total, "sha": summary["params_sha256"],
            "ray_from": summary.get("ray_from_round"), "cpu": cpu}


def cpu_per_round(result: Dict[str, object]) -> Optional[Dict[str, object]]:
    """CPU ms per round over the rate's rounds (benchmarks/run_cpu.py): the driver, each trainer, Ray's raylet and
    GCS, the run's other processes, all but the trainers, and the machine's CPU outside the run; None off Linux."""
    if result["cpu"] is None:
        return None
    kinds, outside = result["cpu"]
    rounds = len(result["stamps"]) - SKIP
    ms = {kind: [seconds / rounds * 1e3 for seconds in values] for kind, values in kinds.items()}
    driver, trainers = sum(ms.get("driver", [])), sorted(ms.get("trainer", []), reverse=True)
    ray = sum(ms.get("raylet", [])) + sum(ms.get("gcs", []))
    other = sum(ms.get("other", []))
    return {"driver": driver, "trainers": trainers, "raylet+gcs": ray, "other": other,
            "beside trainers": driver + ray + other, "outside the run": outside / rounds * 1e3}


def cpu_line(result: Dict[str, object]) -> str:
    got = cpu_per_round(result)
    if got is None:
        return ""
    trainers = " + ".join(f"{t:.1f}" for t in got["trainers"]) or "-"
    return (f"; CPU ms/round: driver {got['driver']:.1f}, trainers {trainers}, raylet+gcs {got['raylet+gcs']:.1f}, "
            f"other {got['other']:.1f} (beside the trainers {got['beside trainers']:.1f}); outside the run "
            f"{got['outside the run']:.1f}")


def rate(result: Dict[str, object]) -> float:
    """Rounds/s from the end of round SKIP - 1 to the end of the last round."""
    stamps = result["stamps"]
    first = SKIP - 1
    if len(stamps) <= first + 1:
        raise SystemExit(f"--rounds gave {len(stamps)} rounds; expected more than {first + 1} (the rate starts at "
                         f"round {first})")
    return (len(stamps) - 1 - first) / (stamps[-1] - stamps[first])


def spread(values: List[float], fmt: str) -> str:
    median = format(statistics.median(values), fmt)
    return median if len(values) == 1 else f"{median} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", type=names(tuple(SETTINGS)), default="hasfl,short,training",
                        help="comma list of hasfl, short, training")
    parser.add_argument("--placements", type=names(("auto", "driver", "actor")), default="auto",
                        help="comma list of Ray server placements to run (auto, driver, actor), each against local")
    parser.add_argument("--repeats", type=integer(1), default=3)
    parser.add_argument("--rounds", type=integer(SKIP + 1), default=None,
                        help=f"rounds per run (default: 40 hasfl and short, 21 training; more than {SKIP})")
    parser.add_argument("--no-default", action="store_true", help="leave out the default command's first round")
    args = parser.parse_args(argv)
    capacity = [parallel_capacity()]
    print(f"two-process capacity: {capacity[0]:.2f}x (2.0 on two idle cores)", flush=True)
    workdir = tempfile.mkdtemp(prefix="bench-short-rounds-")
    rows = []
    try:
        for setting in args.settings:
            spec = SETTINGS[setting]
            rounds = args.rounds or spec["rounds"]
            base = [*COMMON, "--algorithm", spec["algorithm"], "--local-epochs", str(spec["local_epochs"]),
                    "--rounds", str(rounds)]
            runs = backends(args.placements, not args.no_default)
            got: Dict[str, List[Dict[str, object]]] = {name: [] for name in runs}
            for repeat in range(args.repeats):
                for name, flags in runs.items():
                    out = os.path.join(workdir, f"{setting}-{name}-{repeat}")
                    got[name].append(run([*base, *flags], out, env=RAY_ENV if name.startswith("ray2") else None))
                    shutil.rmtree(out, ignore_errors=True)
                    r = got[name][-1]
                    print(f"  {setting} {name} #{repeat}: {rate(r):.2f} rounds/s, first round at "
                          f"{r['stamps'][0]:.2f} s, whole run {r['total']:.1f} s, load {os.getloadavg()[0]:.1f}"
                          f"{cpu_line(r)}", flush=True)
            shas = {r["sha"] for results in got.values() for r in results}
            for name in got:
                if name.startswith("ray2"):
                    ratios = [rate(ray) / rate(local) for ray, local in zip(got[name], got["local"])]
                    rows.append((setting, name, spec["local_epochs"], got, ratios, len(shas) == 1))
        capacity.append(parallel_capacity())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ntwo-process capacity: {capacity[0]:.2f}x before, {capacity[1]:.2f}x after")
    print(f"{'setting':<9} {'ray run':<11} {'epochs':>6} {'local r/s':>16} {'ray r/s':>16} {'ray/local':>18} "
          f"{'target':>7} {'first round (s): ' + ' / '.join(rows[0][3]):>44} {'same sha':>8}")
    for setting, name, epochs, got, ratios, same in rows:
        first = " / ".join(spread([r["stamps"][0] for r in got[run_name]], ".2f") for run_name in got)
        met = sum(ratio >= TARGETS[setting] for ratio in ratios)
        verdict = f"{'met' if met == len(ratios) else 'NOT met'} ({met} of {len(ratios)} repeats)"
        print(f"{setting:<9} {name:<11} {epochs:>6} {spread([rate(r) for r in got['local']], '.2f'):>16} "
              f"{spread([rate(r) for r in got[name]], '.2f'):>16} {spread(ratios, '.3f'):>18} "
              f"{TARGETS[setting]:>5.1f}x {first:>44} {'yes' if same else 'NO':>8}  {verdict}")
    for setting, got in {row[0]: row[3] for row in rows}.items():
        for name, results in got.items():
            cpus = [c for c in map(cpu_per_round, results) if c is not None]
            if cpus:
                trainers = [sum(c["trainers"]) for c in cpus]
                together = f"{statistics.median(trainers):.1f}" if any(trainers) else "- (none: one process)"
                print(f"CPU ms/round, {setting} {name} (median over repeats): driver "
                      f"{statistics.median(c['driver'] for c in cpus):.1f}, trainers together {together}, raylet+gcs "
                      f"{statistics.median(c['raylet+gcs'] for c in cpus):.1f}, beside the trainers "
                      f"{statistics.median(c['beside trainers'] for c in cpus):.1f}; outside the run, per repeat: "
                      + ", ".join(f"{c['outside the run']:.1f}" for c in cpus))
    if "default" in rows[0][3]:
        print("default command: Ray took over at round",
              ", ".join(str(r["ray_from"]) for setting in dict.fromkeys(row[0] for row in rows)
                        for r in next(row[3] for row in rows if row[0] == setting)["default"]))


if __name__ == "__main__":
    main()
