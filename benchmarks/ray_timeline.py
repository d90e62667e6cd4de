"""Where a Ray round's time goes (issue 48 item 2): run a short simulation on the Ray backend inside a Ray session this
script starts, then read Ray's own task timeline (``ray.timeline``, Chrome-trace events of every actor method call)
and print, per actor method, its calls and seconds, beside the run's seconds per round and the same run on the local
backend, so the gap between Ray and local is split into time inside trainers, time in the server actor, and time in
neither (the driver, transfers, Ray's scheduling).

    python benchmarks/ray_timeline.py --dataset emnist --data-dir DATA/torchvision --device cuda --rounds 4 \
        --actors 2 --gpus-per-actor 0.45 [--trace OUT.json]
    python benchmarks/ray_timeline.py --dataset digits --algorithm hasfl --clients 20 --clients-per-round 10 \
        --local-epochs 2 --rounds 30 --server-placement driver,actor      # issue 46 item 3: the server's hop

With several ``--server-placement`` values the Ray run is repeated for each, one after the other, each with its own
table; beside it, the hand-off per round: from the end of a round's last trainer call (``TrainerActor.run``) to the
start of the next round's first, the time in which the trainers wait for the server (where it runs) and the next
round's calls.

Needs Ray. The timeline is Ray's (task events are on by default); nothing here times a method by hand.
"""
import argparse
import collections
import json
import os
import statistics
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


def handoffs(events):
    """Seconds from the end of each round's last ``TrainerActor.run`` to the start of the next round's first: a run
    that starts after every run before it ended opens a round (a round's calls wait for the previous round's
    aggregation, so they never overlap it)."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("ph") == "X" and "dur" in e and str(e.get("cat", "")).endswith("TrainerActor.run"))
    gaps, last_end = [], None
    for start, end in runs:
        if last_end is not None and start > last_end:
            gaps.append((start - last_end) / 1e6)
        last_end = end if last_end is None else max(last_end, end)
    return gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="emnist")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--gpus-per-actor", type=float, default=None)
    parser.add_argument("--algorithm", default=None)
    parser.add_argument("--clients", type=int, default=None)
    parser.add_argument("--clients-per-round", type=int, default=None)
    parser.add_argument("--local-epochs", type=int, default=None)
    parser.add_argument("--server-placement", default="auto", help="comma list of auto, driver, actor: a Ray run each")
    parser.add_argument("--trace", default=None, help="keep Ray's Chrome trace here (default: a temporary file)")
    parser.add_argument("--inline-bytes", type=int, default=None,
                        help="Ray's max_direct_call_object_size (default: the backend's INLINE_OBJECT_BYTES; 102400 "
                             "is Ray's own default, to compare)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line last")
    args = parser.parse_args()

    import ray
    from hasfl_ray.api import simulate

    common = dict(dataset=args.dataset, rounds=args.rounds, device=args.device, progress=False)
    for name in ("algorithm", "clients", "clients_per_round", "local_epochs"):
        if getattr(args, name) is not None:
            common[name] = getattr(args, name)
    if args.data_dir:
        common["data_dir"] = args.data_dir
    placements = args.server_placement.split(",")
    runs = []  # per placement: (placement, its summary, window start and end in µs)
    with tempfile.TemporaryDirectory() as tmp:
        local = simulate(backend="local", out_dir=os.path.join(tmp, "local"), **common)
        # workers report task events every 100 ms instead of every second, so the last rounds' reach the GCS before
        # the backend ends its actors
        os.environ.setdefault("RAY_task_events_report_interval_ms", "100")
        from hasfl_ray.simulation.backend import INLINE_OBJECT_BYTES  # as the backend starts its own Ray
        ray.init(num_cpus=max(2, os.cpu_count() or 2), include_dashboard=False, logging_level="WARNING",
                 _system_config={"max_direct_call_object_size": args.inline_bytes or INLINE_OBJECT_BYTES})
        extra = {"gpus_per_actor": args.gpus_per_actor} if args.gpus_per_actor is not None else {}
        for placement in placements:
            start_us = time.time() * 1e6
            remote = simulate(backend="ray", actors=args.actors, out_dir=os.path.join(tmp, f"ray-{len(runs)}-{placement}"),
                              server_placement=placement, **common, **extra)
            runs.append((placement, remote, start_us, time.time() * 1e6))
        time.sleep(2.0)  # the GCS's own batching of the reported events
        trace = args.trace or os.path.join(tmp, "timeline.json")
        ray.timeline(filename=trace)
        events = json.load(open(trace))
        ray.shutdown()
    rounds_local = [line["wall_s"] for line in local.history]
    report = []
    for placement, remote, start_us, end_us in runs:
        rounds_ray = [line["wall_s"] for line in remote.history]
        window = (end_us - start_us) / 1e6
        inside = [e for e in events if "ts" in e and start_us <= e["ts"] <= end_us]
        rows = summarise(inside, start_us, end_us)
        gaps = handoffs(inside)[2:]  # the first rounds' (start-up, first-time caches) left out
        print(f"\n{args.dataset} on {args.device}, {args.rounds} rounds, {args.actors} Ray actors"
              f"{'' if args.gpus_per_actor is None else f' at {args.gpus_per_actor} GPU each'}, server placement "
              f"{placement}")
        print(f"seconds per round: ray {['%.3f' % s for s in rounds_ray]}, local {['%.3f' % s for s in rounds_local]}")
        print(f"params_sha256 equal: {remote['params_sha256'] == local['params_sha256']}; Ray run window {window:.2f} s "
              f"(start-up included: {remote.get('startup_s')})")
        if gaps:
            print(f"hand-off between rounds (last trainer call's end to the next round's first call), {len(gaps)} "
                  f"rounds: median {statistics.median(gaps) * 1e3:.1f} ms, mean {statistics.mean(gaps) * 1e3:.1f} ms")
        print(f"{'actor method (Ray timeline)':60s} {'calls':>6s} {'seconds':>9s} {'of window':>9s}")
        for name, calls, seconds in rows[:25]:
            print(f"{name[:60]:60s} {calls:6d} {seconds:9.3f} {seconds / window:9.1%}")
        report.append({"server_placement": placement, "rounds_ray_s": rounds_ray, "rounds_local_s": rounds_local,
                       "window_s": window, "handoff_s": gaps,
                       "bit_identical": remote["params_sha256"] == local["params_sha256"],
                       "methods": [{"name": n, "calls": c, "seconds": s} for n, c, s in rows]})
    if args.json:
        print(json.dumps(report if len(report) > 1 else report[0]))

if __name__ == "__main__":
    main()
