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
    python benchmarks/bench_scale.py --dataset shakespeare --data-dir ../shared/data/shakespeare/plays \
        --sizes 635 --backends ray --ray-sizes "" --per-round 10 --rounds 3 \
        --eval-samples 10000                                             # every role of every play

--eval-samples N passes `--eval-samples N` (a seeded test subset, the same every round) to every run; --keep DIR
keeps each run directory under DIR (metrics.jsonl grows round by round, so a long run can be watched) instead of
a temporary folder. Each point also prints its raw per-round seconds as one `rounds:` line.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000,1000000", help="comma-separated client counts")
    parser.add_argument("--backends", default="local", help="comma-separated backends run at every size")
    parser.add_argument("--ray-sizes", default="1000000", help="sizes also run on the ray backend ('' for none)")
    parser.add_argument("--dataset", default="synthetic", help="dataset (default synthetic)")
    parser.add_argument("--algorithm", default="hasfl", help="algorithm (default hasfl, adapting every round)")
    parser.add_argument("--data-dir", help="--data-dir of the dataset (shakespeare: ../shared/data/shakespeare/plays)")
    parser.add_argument("--address", help="join this running Ray cluster (ray backend)")
    parser.add_argument("--per-round", type=int, default=100, help="clients per round (default 100)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3; the first is dropped)")
    parser.add_argument("--actors", type=int, default=2, help="Ray trainer actors (default 2)")
    parser.add_argument("--eval-samples", type=int, help="evaluate on a seeded subset of this many test samples")
    parser.add_argument("--keep", help="keep each run directory under this folder (default: a temporary one)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
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
