"""The asynchronous mode at scale (issue 38 item 7, docs/async.md): the event loop's own cost per server update
against a synchronous round's, and the driver's peak memory with 10^4 and 10^5 virtual clients at the same C.

Each point runs an Engine on the synthetic dataset (local backend, lognormal devices, one local epoch) in a fresh
subprocess (its peak RSS is its own), with the backend's methods wrapped to time where the time goes:

- async: C clients in flight, FedBuff with K updates a server update; per server update, the wall seconds, the
  seconds inside training (``Backend.dispatch``: the client trains at its dispatch), inside the server
  (``Backend.apply_arrivals``) and inside evaluation; the loop's own cost is the rest (sampling a client among the
  available ones, the clock's arrival time, the event queue, the staleness weights, the metrics line);
- sync: a synchronous round of K clients (``clients_per_round`` = K: the same updates per aggregation) on the same
  devices; per round, the wall seconds less training and aggregation (``Backend.run_round``) and evaluation.

The first update (or round) is left out: it pays one-off costs, and the first async update also the C initial
dispatches' training.

    python benchmarks/bench_async.py                          # 10^4 and 10^5 clients, C = 1000, K = 100
    python benchmarks/bench_async.py --sizes 100000 --concurrency 1000 --buffer 100 --updates 20
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def measure(mode: str, clients: int, concurrency: int, buffer: int, updates: int) -> dict:
    """One point, in this process: per update (round) seconds in all, in training, in the server, in evaluation."""
    from hasfl_ray.engine import Engine, RunConfig
    from hasfl_ray.engine import asynchronous
    from hasfl_ray.engine import evaluating

    common = dict(dataset="synthetic", clients=clients, backend="local", devices="lognormal", local_epochs=1,
                  rounds=updates + 1, checkpoint_every=0, algorithm="hasfl", seed=1, eval_samples=1000)
    if mode == "async":
        config = RunConfig(**common, clients_per_round=buffer, mode="async", concurrency=concurrency,
                           buffer_size=buffer, eval_every_updates=updates + 1)
    else:
        config = RunConfig(**common, clients_per_round=buffer)
    engine = Engine(config)
    engine.prepare()
    spent = {"train": 0.0, "server": 0.0, "eval": 0.0}
    backend = engine.backend

    def timed(owner, name, key):
        inner = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - start
        setattr(owner, name, wrapper)

    timed(backend, "dispatch", "train")
    timed(backend, "apply_arrivals", "server")
    timed(backend, "run_round", "train")  # a synchronous round: training and aggregation together
    request = evaluating.request_evaluation

    def evaluation(e, t):
        start = time.perf_counter()
        finish = request(e, t)
        spent["eval"] += time.perf_counter() - start

        def done():
            begin = time.perf_counter()
            try:
                return finish()
            finally:
                spent["eval"] += time.perf_counter() - begin
        done.ready = finish.ready
        return done

    evaluating.request_evaluation = evaluation
    rows = []
    marks = [time.perf_counter(), dict(spent)]
    peak_in_flight = [0]
    if mode == "async":
        original = asynchronous.AsyncLoop.server_update

        def server_update(self, wall_start):
            peak_in_flight[0] = max(peak_in_flight[0], len(self.state.in_flight) + len(self.state.buffer))
            original(self, wall_start)
            now = time.perf_counter()
            rows.append({"wall": now - marks[0], **{k: spent[k] - marks[1][k] for k in spent}})
            marks[0], marks[1] = now, dict(spent)

        asynchronous.AsyncLoop.server_update = server_update
    else:
        original = engine.run_round

        def run_round(t):
            line = original(t)
            now = time.perf_counter()
            rows.append({"wall": now - marks[0], **{k: spent[k] - marks[1][k] for k in spent}})
            marks[0], marks[1] = now, dict(spent)
            return line

        engine.run_round = run_round
    summary = engine.run()
    rows = rows[1:]  # the first pays one-off costs (and, async, the C initial dispatches)
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    own = mean["wall"] - mean["train"] - mean["server"] - mean["eval"]
    return {"mode": mode, "clients": clients, "concurrency": concurrency if mode == "async" else None,
            "per_update": buffer, "measured": len(rows), "wall_s": mean["wall"], "train_s": mean["train"],
            "server_s": mean["server"], "eval_s": mean["eval"], "own_s": own,
            "peak_in_flight": peak_in_flight[0] if mode == "async" else None,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "staleness_mean": summary.get("staleness_mean")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--buffer", type=int, default=100)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--point", help=argparse.SUPPRESS)  # MODE,CLIENTS: one point, in this process
    args = parser.parse_args()
    if args.point:
        mode, clients = args.point.split(",")
        print(json.dumps(measure(mode, int(clients), args.concurrency, args.buffer, args.updates)))
        return
    results = []
    for clients in (int(s) for s in args.sizes.split(",")):
        for mode in ("sync", "async"):
            out = subprocess.run([sys.executable, __file__, "--point", f"{mode},{clients}", "--concurrency",
                                  str(args.concurrency), "--buffer", str(args.buffer), "--updates",
                                  str(args.updates)], capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    print("\n| mode | clients | C | K (clients a round) | s/update (round) | training | server | evaluation | "
          "loop's own | own ms per client | peak in flight | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['mode']} | {r['clients']:,} | {r['concurrency'] or '-'} | {r['per_update']} | {r['wall_s']:.3f} | "
              f"{r['train_s']:.3f} | {r['server_s']:.3f} | {r['eval_s']:.3f} | {r['own_s'] * 1000:.1f} ms | "
              f"{r['own_s'] * 1000 / r['per_update']:.3f} | {r['peak_in_flight'] or '-'} | {r['peak_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
