"""Where a Ray round's time goes (issue 48 item 2): run a short simulation on the Ray backend inside a Ray session this
script starts, then read Ray's own task timeline (``ray.timeline``, Chrome-trace events of every actor method call)
and print, per actor method, its calls and seconds, beside the run's seconds per round and the same run on the local
backend, so the gap between Ray and local is split into time inside trainers, time in the server actor, and time in
neither (the driver, transfers, Ray's scheduling).

    python benchmarks/ray_timeline.py --dataset emnist --data-dir DATA/torchvision --device cuda --rounds 4 \
        --actors 2 --gpus-per-actor 0.45 [--trace OUT.json]

Needs Ray. The timeline is Ray's (task events are on by default); nothing here times a method by hand.
"""
import argparse
import collections
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def summarise(events, wall_from_us, wall_to_us):
    """Per event name: calls, total seconds and share of the window [wall_from_us, wall_to_us]."""
    actor_of = {}  # a worker (tid) named by the actor class whose methods ran on it ("task::TrainerActor.run")
    for event in events:
        if str(event.get("cat", "")).startswith("task::"):
            actor_of[event.get("tid")] = event["cat"][len("task::"):].split(".")[0]
    table = collections.defaultdict(lambda: [0, 0.0])
    for event in events:
        if event.get("ph") != "X" or "dur" not in event:
            continue
        if event["ts"] + event["dur"] < wall_from_us or event["ts"] > wall_to_us:
            continue
        cat = str(event.get("cat", event.get("name", "?")))
        label = cat[len("task::"):] if cat.startswith("task::") else f"{cat} ({actor_of.get(event.get('tid'), 'driver')})"
        row = table[label]
        row[0] += 1
        row[1] += event["dur"] / 1e6
    return sorted(((name, calls, seconds) for name, (calls, seconds) in table.items()), key=lambda r: -r[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="emnist")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--gpus-per-actor", type=float, default=None)
    parser.add_argument("--trace", default=None, help="keep Ray's Chrome trace here (default: a temporary file)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line last")
    args = parser.parse_args()

    import ray
    from hasfl_ray.api import simulate

    common = dict(dataset=args.dataset, rounds=args.rounds, device=args.device, progress=False)
    if args.data_dir:
        common["data_dir"] = args.data_dir
    with tempfile.TemporaryDirectory() as tmp:
        local = simulate(backend="local", out_dir=os.path.join(tmp, "local"), **common)
        # workers report task events every 100 ms instead of every second, so the last rounds' reach the GCS before
        # the backend ends its actors
        os.environ.setdefault("RAY_task_events_report_interval_ms", "100")
        ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, logging_level="WARNING")
        start_us = time.time() * 1e6
        extra = {"gpus_per_actor": args.gpus_per_actor} if args.gpus_per_actor is not None else {}
        remote = simulate(backend="ray", actors=args.actors, out_dir=os.path.join(tmp, "ray"), **common, **extra)
        end_us = time.time() * 1e6
        time.sleep(2.0)  # the GCS's own batching of the reported events
        trace = args.trace or os.path.join(tmp, "timeline.json")
        ray.timeline(filename=trace)
        events = json.load(open(trace))
        ray.shutdown()
    rounds_ray = [line["wall_s"] for line in remote.history]
    rounds_local = [line["wall_s"] for line in local.history]
    window = (end_us - start_us) / 1e6
    rows = summarise(events, start_us, end_us)
    print(f"{args.dataset} on {args.device}, {args.rounds} rounds, {args.actors} Ray actors"
          f"{'' if args.gpus_per_actor is None else f' at {args.gpus_per_actor} GPU each'}")
    print(f"seconds per round: ray {['%.3f' % s for s in rounds_ray]}, local {['%.3f' % s for s in rounds_local]}")
    print(f"params_sha256 equal: {remote['params_sha256'] == local['params_sha256']}; Ray run window {window:.2f} s "
          f"(start-up included: {remote.get('startup_s')})")
    print(f"{'actor method (Ray timeline)':60s} {'calls':>6s} {'seconds':>9s} {'of window':>9s}")
    for name, calls, seconds in rows[:25]:
        print(f"{name[:60]:60s} {calls:6d} {seconds:9.3f} {seconds / window:9.1%}")
    if args.json:
        print(json.dumps({"rounds_ray_s": rounds_ray, "rounds_local_s": rounds_local, "window_s": window,
                          "bit_identical": remote["params_sha256"] == local["params_sha256"],
                          "methods": [{"name": n, "calls": c, "seconds": s} for n, c, s in rows]}))


if __name__ == "__main__":
    main()
