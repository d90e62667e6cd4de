"""The asynchronous mode at scale (issue 38 item 7, docs/async.md): the event loop's own cost per server update
against a synchronous round's, and the driver's peak memory with 10^4 and 10^5 virtual clients at the same C.

Each point runs an Engine on the synthetic dataset (local backend, lognormal devices, one local epoch) in a fresh
subprocess (its peak RSS is its own), with the backend's methods wrapped to time where the time goes:

- async: C clients in flight, FedBuff with K updates a server update; per server update, the wall seconds, the
  seconds inside training (``Backend.dispatch`` and ``Backend.train_deferred``: the local backend trains a server
  version's clients before its update), inside the server
  (``Backend.apply_arrivals``) and inside evaluation; the loop's own cost is the rest (sampling a client among the
  available ones, the clock's arrival time, the event queue, the staleness weights, the metrics line);
- sync: a synchronous round of K clients (``clients_per_round`` = K: the same updates per aggregation) on the same
  devices; per round, the wall seconds less training and aggregation (``Backend.run_round``) and evaluation.

The first update (or round) is left out: it pays one-off costs, and the first async update also the C initial
dispatches' training.

Both clocks are read: the wall clock and the main thread's CPU clock (``time.thread_time``: the loop runs on the
main thread; the wait for a busy core on a shared machine is not in it). The loop's own CPU per client is the
update's main-thread CPU less that inside training, the server and evaluation, over the K clients of the update
(round); the table ends with the asynchronous mode's against the synchronous mode's, per size, and the target
(issue 46: at most 2x).

    python benchmarks/bench_async.py                          # 10^4 and 10^5 clients, C = 1000, K = 100
    python benchmarks/bench_async.py --sizes 100000 --concurrency 1000 --buffer 100 --updates 20
    python benchmarks/bench_async.py --point async,10000 --profile /tmp/async.prof   # one point under cProfile
"""

from __future__ import annotations

import cProfile
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from arguments import Parser, integer, integers, refuse  # noqa: E402


def point_config(mode: str, clients: int, concurrency: int, buffer: int, updates: int):
    """The RunConfig of one point (its refusals, e.g. a buffer larger than the concurrency, one sentence)."""
    from hasfl_ray.engine import RunConfig

    common = dict(dataset="synthetic", clients=clients, backend="local", devices="lognormal", local_epochs=1,
                  rounds=updates + 1, checkpoint_every=0, algorithm="hasfl", seed=1, eval_samples=1000)
    if mode == "async":
        return RunConfig(**common, clients_per_round=buffer, mode="async", concurrency=concurrency,
                         buffer_size=buffer, eval_every_updates=updates + 1)
    return RunConfig(**common, clients_per_round=buffer)


def measure(mode: str, clients: int, concurrency: int, buffer: int, updates: int) -> dict:
    """One point, in this process: per update (round) seconds in all, in training, in the server, in evaluation."""
    from hasfl_ray.engine import Engine
    from hasfl_ray.engine import asynchronous
    from hasfl_ray.engine import evaluating

    engine = Engine(point_config(mode, clients, concurrency, buffer, updates))
    engine.prepare()
    keys = ("train", "server", "eval")
    spent = {f"{key}{clock}": 0.0 for key in keys for clock in ("", "_cpu")}
    backend = engine.backend

    def now():
        return time.perf_counter(), time.thread_time()

    def add(key, since):
        wall, cpu = now()
        spent[key] += wall - since[0]
        spent[key + "_cpu"] += cpu - since[1]

    def timed(owner, name, key):
        inner = getattr(owner, name)

        def wrapper(*args, **kwargs):
            since = now()
            try:
                return inner(*args, **kwargs)
            finally:
                add(key, since)
        setattr(owner, name, wrapper)

    timed(backend, "dispatch", "train")
    if hasattr(backend, "train_deferred"):  # the local backend's dispatches left for later: trained there
        timed(backend, "train_deferred", "train")
    timed(backend, "apply_arrivals", "server")
    timed(backend, "run_round", "train")  # a synchronous round: training and aggregation together
    request = evaluating.request_evaluation

    def evaluation(e, t):
        since = now()
        finish = request(e, t)
        add("eval", since)

        def done():
            begin = now()
            try:
                return finish()
            finally:
                add("eval", begin)
        done.ready = finish.ready
        return done

    evaluating.request_evaluation = evaluation
    rows = []
    marks = [now(), dict(spent)]
    peak_in_flight = [0]

    def mark():
        wall, cpu = now()
        rows.append({"wall": wall - marks[0][0], "cpu": cpu - marks[0][1],
                     **{k: spent[k] - marks[1][k] for k in spent}})
        marks[0], marks[1] = (wall, cpu), dict(spent)

    if mode == "async":
        original = asynchronous.AsyncLoop.server_update

        def server_update(self, wall_start):
            peak_in_flight[0] = max(peak_in_flight[0], len(self.state.in_flight) + len(self.state.buffer))
            original(self, wall_start)
            mark()

        asynchronous.AsyncLoop.server_update = server_update
    else:
        original = engine.run_round

        def run_round(t):
            line = original(t)
            mark()
            return line

        engine.run_round = run_round
    summary = engine.run()
    rows = rows[1:]  # the first pays one-off costs (and, async, the C initial dispatches)
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    own = mean["wall"] - sum(mean[key] for key in keys)
    own_cpu = mean["cpu"] - sum(mean[key + "_cpu"] for key in keys)
    return {"mode": mode, "clients": clients, "concurrency": concurrency if mode == "async" else None,
            "per_update": buffer, "measured": len(rows), "wall_s": mean["wall"], "train_s": mean["train"],
            "server_s": mean["server"], "eval_s": mean["eval"], "own_s": own, "own_cpu_s": own_cpu,
            "peak_in_flight": peak_in_flight[0] if mode == "async" else None,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "staleness_mean": summary.get("staleness_mean")}


def main() -> None:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=integers(1), default="10000,100000")
    parser.add_argument("--concurrency", type=integer(1), default=1000)
    parser.add_argument("--buffer", type=integer(1), default=100)
    parser.add_argument("--updates", type=integer(1), default=10)
    parser.add_argument("--point", help="MODE,CLIENTS (sync or async): one point, in this process")
    parser.add_argument("--profile", help="with --point: write the point's cProfile statistics here (pstats)")
    args = parser.parse_args()
    mode, _, clients = (args.point or "").partition(",")
    if args.point and (mode not in ("sync", "async") or not clients.isdigit() or int(clients) < 1):
        refuse(f"--point is {args.point!r}; expected MODE,CLIENTS with MODE sync or async, e.g. async,10000")
    if args.profile and not args.point:
        refuse(f"--profile is {args.profile!r} but --point is unset; expected it with --point (one point's profile)")
    from hasfl_ray.errors import ConfigError

    for size, point_mode in ([(int(clients), mode)] if args.point else [(n, m) for n in args.sizes
                                                                       for m in ("sync", "async")]):
        try:  # every point's config refused here, before any point runs
            point_config(point_mode, size, args.concurrency, args.buffer, args.updates)
        except ConfigError as error:
            refuse(f"{error} (with --sizes {size}, --concurrency {args.concurrency}, --buffer {args.buffer})")
    if args.point:
        profile = cProfile.Profile() if args.profile else None
        if profile is not None:
            profile.enable()
        result = measure(mode, int(clients), args.concurrency, args.buffer, args.updates)
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile)
        print(json.dumps(result))
        return
    results = []
    for clients in args.sizes:
        for mode in ("sync", "async"):
            out = subprocess.run([sys.executable, __file__, "--point", f"{mode},{clients}", "--concurrency",
                                  str(args.concurrency), "--buffer", str(args.buffer), "--updates",
                                  str(args.updates)], capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    print("\n| mode | clients | C | K (clients a round) | s/update (round) | training | server | evaluation | "
          "loop's own | own ms per client | own CPU ms per client | peak in flight | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['mode']} | {r['clients']:,} | {r['concurrency'] or '-'} | {r['per_update']} | {r['wall_s']:.3f} | "
              f"{r['train_s']:.3f} | {r['server_s']:.3f} | {r['eval_s']:.3f} | {r['own_s'] * 1000:.1f} ms | "
              f"{r['own_s'] * 1000 / r['per_update']:.3f} | {r['own_cpu_s'] * 1000 / r['per_update']:.3f} | "
              f"{r['peak_in_flight'] or '-'} | {r['peak_rss_mb']:.0f} |")
    print()
    for clients in sorted({r["clients"] for r in results}):
        cpu = {r["mode"]: r["own_cpu_s"] / r["per_update"] for r in results if r["clients"] == clients}
        ratio = cpu["async"] / cpu["sync"] if cpu["sync"] > 0 else float("inf")
        print(f"{clients:,} clients: the loop's own CPU per client, async {cpu['async'] * 1000:.3f} ms against "
              f"sync {cpu['sync'] * 1000:.3f} ms: {ratio:.2f}x (target: at most 2x, "
              f"{'met' if ratio <= 2 else 'not met'})")


if __name__ == "__main__":
    main()
