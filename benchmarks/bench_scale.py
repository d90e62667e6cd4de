"""Scale: start-up, seconds per round and peak driver memory of `hasfl-ray simulate` from 10^3 to 10^6 clients.

Every (clients, backend) point runs the real CLI, `hasfl-ray simulate --dataset synthetic --clients N
--clients-per-round S ...`, in a fresh subprocess (so imports, Ray start-up and peak memory are its own), with
the Engine's methods wrapped to time its phases:

- start-up: process start to the first round's first instruction (imports, data set, tiers, algorithm state,
  w^(0), the backend's actors);
- s/round: the rounds after the first (round 0 pays one-off costs: the first use of every code path);
- outside training: s/round less the seconds inside local training (local backend only: its trainer runs in
  the driver): sampling, allocation, aggregation, the algorithm's update, evaluation, the metrics line; the
  part of a round that could grow with the number of clients;
- finish: writing clients.csv (one row per client) and summary.json;
- whole: the subprocess's wall time, measured by the parent;
- peak RSS: the driver's ``ru_maxrss`` (Ray's actors are other processes and not included).

HAS-FL adapts every round here (--warmup 0 --t-adapt 1 --t-norm 1), so its per-client state arrays are
updated every round: the cost that may grow with N is exactly what these rounds show.

    python benchmarks/bench_scale.py                                   # 10^3 .. 10^6, local; ray at 10^6
    python benchmarks/bench_scale.py --sizes 1000,100000 --backends local,ray --rounds 4
    python benchmarks/bench_scale.py --dataset shakespeare --data-dir PLAYS \
        --sizes 635 --backends ray --ray-sizes "" --per-round 10 --rounds 3 \
        --eval-samples 10000                                             # every role of every play

--eval-samples N passes `--eval-samples N` (a seeded test subset, the same every round) to every run; --keep DIR
keeps each run directory under DIR (metrics.jsonl grows round by round, so a long run can be watched) instead of
a temporary folder. Each point also prints its raw per-round seconds as one `rounds:` line.

--clock measures the device clock of issue 26 (docs/clock.md) instead, in three tables:

- profiles: `draw_profiles(normalise_devices("lognormal"), seed, N)` for N clients in a fresh subprocess each:
  seconds, the arrays kept, the peak of what numpy and Python allocated while drawing (tracemalloc), the growth of
  the process's resident memory, and the same for the whole clock a run keeps (profiles, a Markov availability
  model and the clock's per-client arrays);
- invitations: seconds per round of `Clock.invite` (K clients among N, the clock moved 60 simulated seconds a
  round) with a Markov availability model (candidates drawn and asked until K are available) and with every client
  available under overselect (K(1+F) drawn without replacement), beside a pass over every client for reference
  (`rng.permutation(N)[:K]`);
- overhead: the digits protocol (20 clients, 10 a round, local backend) with and without a device population
  (lognormal, no deadline: the same training, checked by params_sha256), runs interleaved, seconds per round (the
  rounds after the first, median over the runs), and the clock's own seconds per round (`Clock.invite` and the
  engine's `_clocked_round` timed inside the clocked runs).

    python benchmarks/bench_scale.py --clock                                         # 10^6 profiles; 10^4..10^6
    python benchmarks/bench_scale.py --clock --clock-sizes 1000,10000 --profile-sizes 10000 --overhead-runs 2 \
        --overhead-rounds 3                                                            # a check that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MARK = "BENCH_SCALE_RESULT "


def child(args: argparse.Namespace) -> None:
    """Run the CLI in this process with the Engine's phases timed; print one JSON line."""
    import resource

    from hasfl_ray.engine import engine as engine_module

    stamps = {"rounds": []}
    Engine = engine_module.Engine
    run_round, finish = Engine.run_round, Engine.finish

    def timed_round(self, t):
        stamps.setdefault("first_round", time.time())  # wall clock: comparable with the parent's t0
        begin = time.perf_counter()
        line = run_round(self, t)
        stamps["rounds"].append(time.perf_counter() - begin)
        return line

    def timed_finish(self, wall_s):
        begin = time.perf_counter()
        summary = finish(self, wall_s)
        stamps["finish"] = time.perf_counter() - begin
        return summary

    Engine.run_round, Engine.finish = timed_round, timed_finish
    if args.backend == "local":  # local training happens in this process: time it, the rest of a round is overhead
        from hasfl_ray.training import local

        train = local.Trainer.train
        stamps["train"] = []

        def timed_train(self, task, params):
            begin = time.perf_counter()
            result = train(self, task, params)
            if len(stamps["train"]) <= len(stamps["rounds"]):
                stamps["train"].append(0.0)
            stamps["train"][len(stamps["rounds"])] += time.perf_counter() - begin
            return result

        local.Trainer.train = timed_train
    from hasfl_ray.cli.main import main

    argv = ["simulate", "--dataset", args.dataset, "--clients", str(args.clients), "--clients-per-round",
            str(args.per_round), "--rounds", str(args.rounds), "--backend", args.backend, "--algorithm",
            args.algorithm, "--warmup", "0",
            "--t-adapt", "1", "--t-norm", "1", "--checkpoint-every", "0", "--quiet", "--force", "--out", args.out]
    if args.backend == "ray" and args.actors:
        argv += ["--actors", str(args.actors)]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    if args.address:
        argv += ["--address", args.address]
    if args.eval_samples is not None:
        argv += ["--eval-samples", str(args.eval_samples)]
    try:
        main(argv, prog_name="hasfl-ray")
    except SystemExit as error:
        if error.code:
            raise
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size = os.path.getsize(os.path.join(args.out, "clients.csv"))
    print(MARK + json.dumps({"startup": stamps["first_round"] - args.t0, "rounds": stamps["rounds"],
                             "train": stamps.get("train"),
                             "finish": stamps["finish"], "rss_mb": rss_mb, "clients_csv_mb": size / 1e6}),
          flush=True)


def measure(clients: int, backend: str, args: argparse.Namespace) -> dict:
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench_scale_", dir=args.keep) as temporary:
        out = os.path.join(args.keep, f"{args.dataset}-{clients}-{backend}-{args.per_round}") if args.keep \
            else temporary
        begin = time.time()
        command = [sys.executable, os.path.abspath(__file__), "--child", "--clients", str(clients), "--per-round",
                   str(args.per_round), "--rounds", str(args.rounds), "--backend", backend, "--out",
                   os.path.join(out, "run"), "--t0", repr(begin), "--actors", str(args.actors), "--dataset",
                   args.dataset, "--algorithm", args.algorithm] + (["--data-dir", args.data_dir] if args.data_dir else []) + \
            (["--address", args.address] if args.address else []) + \
            (["--eval-samples", str(args.eval_samples)] if args.eval_samples is not None else [])
        # Ray from round 0 (no local first rounds while Ray starts, docs/ray.md 'Start-up'): every round timed is Ray's
        env = {**os.environ, "HASFL_HANDOFF_ROUND": "0"} if backend == "ray" else None
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        whole = time.time() - begin
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode or not lines:
        raise RuntimeError(f"{clients} clients on {backend} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1][len(MARK):])
    result["whole"] = whole
    return result


# ------------------------------------------------------------------------------------ the device clock (--clock)

def _resident_mb() -> float:
    """This process's resident memory now, MB (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError):
        return 0.0


def clock_profiles_child(clients: int) -> None:
    """One size of the profiles table, in this (fresh) process: print one JSON line."""
    import gc
    import tracemalloc

    import numpy as np

    from hasfl_ray.clock import Clock, WidthCosts, draw_profiles, make_availability
    from hasfl_ray.clock.spec import normalise_devices

    spec = normalise_devices("lognormal")
    costs = WidthCosts("digits")  # the model's cost table: torch and the model are loaded before measuring
    draw_profiles(spec, 0, 10)  # numpy's generators warmed up
    samples = np.full(clients, 70, dtype=np.int64)  # n_i: the engine holds it with or without a clock
    gc.collect()
    result = {}
    for part in ("profiles", "clock"):
        resident = _resident_mb()
        tracemalloc.start()
        begin = time.perf_counter()
        profiles = draw_profiles(spec, 42, clients)
        if part == "clock":  # what a run keeps: the profiles, a Markov availability model, the clock's arrays
            kept = Clock(profiles, make_availability("markov:3600,1800", None, 42), costs, samples, 32, 2, 42)
        seconds = time.perf_counter() - begin
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        arrays = sum(a.nbytes for a in (profiles.speed, profiles.down, profiles.up, profiles.latency))
        if part == "clock":
            arrays += kept.busy.nbytes + kept.waiting.nbytes + kept.invited.nbytes
        result[part] = {"seconds": seconds, "arrays_mb": arrays / 1e6, "kept_mb": current / 1e6,
                        "peak_mb": peak / 1e6, "rss_mb": _resident_mb() - resident}
        del profiles
        kept = None
        gc.collect()
    print(MARK + json.dumps(result), flush=True)


def clock_invite_child(sizes, per_round: int, rounds: int) -> None:
    """The invitations table, in this process: print one JSON line of per-round seconds (median over ``rounds``)."""
    import numpy as np

    from hasfl_ray.clock import Clock, WidthCosts, draw_profiles, make_availability
    from hasfl_ray.clock.spec import normalise_devices

    spec, costs = normalise_devices("lognormal"), WidthCosts("digits")
    result = {}
    for clients in sizes:
        profiles = draw_profiles(spec, 42, clients)
        samples = np.full(clients, 70, dtype=np.int64)
        row = {}
        for name, availability, policy, overselect in (("markov", "markov:3600,1800", "drop", None),
                                                       ("overselect", "always", "overselect", 0.3)):
            clock = Clock(profiles, make_availability(availability, None, 42), costs, samples, 32, 2, 42,
                          policy=policy, overselect=overselect)
            times = []
            for t in range(rounds):
                begin = time.perf_counter()
                invitation = clock.invite(t, per_round)
                times.append(time.perf_counter() - begin)
                assert invitation is not None and len(invitation.clients) == clock.invitations(per_round)
                clock.now += 60.0
            row[name] = float(np.median(times))
            if name == "markov":  # the clients whose chains were drawn (lazily, as asked): what the model keeps
                row["chains"] = len(clock.availability._chains)
        rng = np.random.default_rng(0)
        times = []
        for _ in range(max(3, rounds // 10)):
            begin = time.perf_counter()
            rng.permutation(clients)[:per_round]
            times.append(time.perf_counter() - begin)
        row["pass"] = float(np.median(times))
        result[str(clients)] = row
    print(MARK + json.dumps(result), flush=True)


def clock_overhead(runs: int, rounds: int) -> dict:
    """The overhead table: ``runs`` digits runs with and without devices, interleaved (ABBA...), in this process."""
    import numpy as np

    from hasfl_ray.clock import clock as clock_module
    from hasfl_ray.engine import Engine, RunConfig
    from hasfl_ray.engine import engine as engine_module

    inside, rounds_s = [], []  # per round of the current run: seconds inside the clock, seconds of the round
    Engine_, Clock_ = engine_module.Engine, clock_module.Clock
    run_round, clocked_round, invite = Engine_.run_round, Engine_._clocked_round, Clock_.invite

    def round_timed(self, t):
        inside.append(0.0)
        begin = time.perf_counter()
        line = run_round(self, t)
        rounds_s.append(time.perf_counter() - begin)
        return line

    def clock_timed(function):
        def wrapper(*args, **kwargs):
            begin = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                inside[-1] += time.perf_counter() - begin
        return wrapper

    Engine_.run_round, Engine_._clocked_round, Clock_.invite = round_timed, clock_timed(clocked_round), \
        clock_timed(invite)
    results = {"plain": [], "clocked": []}
    digests = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench_clock_") as folder:
            for k in range(runs):
                modes = ("plain", "clocked") if k % 2 == 0 else ("clocked", "plain")
                for mode in modes:
                    rounds_s.clear()
                    inside.clear()
                    config = RunConfig(backend="local", rounds=rounds, checkpoint_every=0,
                                       devices="lognormal" if mode == "clocked" else None)
                    summary = Engine(config, out_dir=os.path.join(folder, f"{mode}-{k}")).run()
                    digests.setdefault(mode, set()).add(summary["params_sha256"])
                    later = slice(1, None) if rounds > 1 else slice(None)
                    results[mode].append({"round": float(np.mean(rounds_s[later])),
                                          "clock": float(np.mean(inside[later]))})
    finally:
        Engine_.run_round, Engine_._clocked_round, Clock_.invite = run_round, clocked_round, invite
    same = digests["plain"] == digests["clocked"] and len(digests["plain"]) == 1
    return {"results": results, "same_params": same}


def clock_main(args: argparse.Namespace) -> None:
    """The three tables of --clock, side by side with their targets (docs/clock.md, issue 26 item 8)."""
    import numpy as np

    here = os.path.abspath(__file__)
    print(f"device clock (issue 26), {os.cpu_count()} CPUs", flush=True)
    print("\nprofiles (lognormal defaults), each size in a fresh process; target at 10^6 clients: <= 100 MB, a second "
          "or two")
    header = ("clients", "what", "s", "arrays MB", "kept MB (tracemalloc)", "peak MB while drawing (tracemalloc)",
              "resident growth MB")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    for clients in [int(s) for s in args.profile_sizes.split(",") if s]:
        done = subprocess.run([sys.executable, here, "--clock-child", "profiles", "--clients", str(clients)],
                              capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
        if done.returncode or not lines:
            raise RuntimeError(f"profiles of {clients} clients failed:\n{done.stderr[-3000:]}")
        result = json.loads(lines[-1][len(MARK):])
        for part, what in (("profiles", "draw_profiles"), ("clock", "profiles + Markov availability + Clock")):
            r = result[part]
            print(f"| {clients:,} | {what} | {r['seconds']:.3f} | {r['arrays_mb']:.1f} | {r['kept_mb']:.1f} | "
                  f"{r['peak_mb']:.1f} | {r['rss_mb']:.1f} |", flush=True)

    sizes = [int(s) for s in args.clock_sizes.split(",") if s]
    print(f"\ninvitations, {args.per_round} clients a round, median of {args.invite_rounds} rounds (target: flat in "
          "the number of clients, O(clients per round))")
    done = subprocess.run([sys.executable, here, "--clock-child", "invite", "--clock-sizes", args.clock_sizes,
                           "--per-round", str(args.per_round), "--rounds", str(args.invite_rounds)],
                          capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode or not lines:
        raise RuntimeError(f"invitations failed:\n{done.stderr[-3000:]}")
    invite = json.loads(lines[-1][len(MARK):])
    header = ("clients", "Clock.invite, markov:3600,1800 ms/round", "Markov chains drawn after the rounds",
              "Clock.invite, overselect 0.3 ms/round", "reference O(clients): rng.permutation(N)[:K] ms")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for clients in sizes:
        r = invite[str(clients)]
        print(f"| {clients:,} | {1e3 * r['markov']:.3f} | {r['chains']:,} | {1e3 * r['overselect']:.3f} | "
              f"{1e3 * r['pass']:.3f} |")

    print(f"\noverhead on the digits protocol (local backend, {args.overhead_rounds} rounds a run, the first dropped; "
          f"{args.overhead_runs} runs of each, interleaved; target: <= 2 %)", flush=True)
    overhead = clock_overhead(args.overhead_runs, args.overhead_rounds)
    plain = [r["round"] for r in overhead["results"]["plain"]]
    clocked = [r["round"] for r in overhead["results"]["clocked"]]
    inside = [r["clock"] for r in overhead["results"]["clocked"]]
    header = ("run", "s/round, median of runs", "s/round, each run", "clock's own ms/round (median)")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    print(f"| without devices | {np.median(plain):.4f} | {', '.join(f'{x:.4f}' for x in plain)} | - |")
    print(f"| devices lognormal | {np.median(clocked):.4f} | {', '.join(f'{x:.4f}' for x in clocked)} | "
          f"{1e3 * np.median(inside):.3f} |")
    ratio, share = np.median(clocked) / np.median(plain), np.median(inside) / np.median(clocked)
    print(f"clocked / plain s/round: {ratio:.4f} ({100 * (ratio - 1):+.2f} %); the clock's own time: "
          f"{100 * share:.2f} % of a clocked round; same params_sha256 with and without devices: "
          f"{overhead['same_params']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000,1000000", help="comma-separated client counts")
    parser.add_argument("--backends", default="local", help="comma-separated backends run at every size")
    parser.add_argument("--ray-sizes", default="1000000", help="sizes also run on the ray backend ('' for none)")
    parser.add_argument("--dataset", default="synthetic", help="dataset (default synthetic)")
    parser.add_argument("--algorithm", default="hasfl", help="algorithm (default hasfl, adapting every round)")
    parser.add_argument("--data-dir", help="--data-dir of the dataset (shakespeare: a folder of the Gutenberg *_gut.txt plays)")
    parser.add_argument("--address", help="join this running Ray cluster (ray backend)")
    parser.add_argument("--per-round", type=int, default=100, help="clients per round (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3; the first is dropped)")
    parser.add_argument("--actors", type=int, default=2, help="Ray trainer actors (default 2)")
    parser.add_argument("--eval-samples", type=int, help="evaluate on a seeded subset of this many test samples")
    parser.add_argument("--keep", help="keep each run directory under this folder (default: a temporary one)")
    parser.add_argument("--clock", action="store_true", help="measure the device clock instead (issue 26)")
    parser.add_argument("--profile-sizes", default="1000000", help="--clock: client counts of the profiles table")
    parser.add_argument("--clock-sizes", default="10000,100000,1000000",
                        help="--clock: client counts of the invitations table")
    parser.add_argument("--invite-rounds", type=int, default=200, help="--clock: rounds of invitations per size")
    parser.add_argument("--overhead-runs", type=int, default=6, help="--clock: digits runs with and without devices")
    parser.add_argument("--overhead-rounds", type=int, default=30, help="--clock: rounds per digits run")
    parser.add_argument("--clock-child", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.clock_child == "profiles":
        clock_profiles_child(args.clients)
        return
    if args.clock_child == "invite":
        clock_invite_child([int(s) for s in args.clock_sizes.split(",") if s], args.per_round, args.rounds)
        return
    if args.clock:
        clock_main(args)
        return
    if args.child:
        child(args)
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    ray_sizes = {int(s) for s in args.ray_sizes.split(",") if s}
    backends = [b for b in args.backends.split(",") if b]
    points = [(n, b) for n in sizes for b in backends] + \
        [(n, "ray") for n in sizes if n in ray_sizes and "ray" not in backends]
    evaluation = f"eval on {args.eval_samples} test samples" if args.eval_samples else "eval on the whole test set"
    print(f"{args.dataset}, {args.algorithm}, {args.per_round} clients per round, {args.rounds} rounds (first dropped), "
          f"{os.cpu_count()} CPUs; ray: {args.actors} trainer actors; {evaluation}", flush=True)
    header = ("clients", "backend", "start-up s", "s/round", "outside training s/round", "finish s", "whole s", "peak RSS MB", "clients.csv MB")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header), flush=True)
    raw = []
    for clients, backend in points:
        r = measure(clients, backend, args)
        raw.append(f"rounds: {clients:,} clients on {backend}: " + ", ".join(f"{s:.1f}" for s in r["rounds"]) + " s")
        later = r["rounds"][1:] or r["rounds"]
        per_round = sum(later) / len(later)
        outside = "-"
        if r.get("train"):
            train = r["train"][1:] if len(r["rounds"]) > 1 else r["train"]
            outside = f"{(sum(later) - sum(train)) / len(later):.3f}"
        print(f"| {clients:,} | {backend} | {r['startup']:.1f} | {per_round:.3f} | {outside} | {r['finish']:.2f} | "
              f"{r['whole']:.1f} | {r['rss_mb']:,.0f} | {r['clients_csv_mb']:.1f} |", flush=True)
    print("\n".join(raw), flush=True)


if __name__ == "__main__":
    main()
