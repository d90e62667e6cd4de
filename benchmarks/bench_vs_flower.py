"""hasfl-ray against Flower's simulation engine on the same FedAvg workload, interleaved.

Both sides run the same thing, so that only the orchestration differs:

- the same clients: the workload's data set built and split by hasfl_ray's own loader on both sides;
- the same participants each round: ``hasfl_ray.engine.engine.sample_participants(seed, round)``;
- the same local work: hasfl_ray's ``Trainer.train`` (CNN at full width, SGD momentum 0.9, weight decay 1e-4,
  clipping 10, the protocol's epochs and batch size, per-client RNG streams), one torch thread per trainer;
- the same aggregation rule (FedAvg: the sample-weighted mean of the updates) and a central evaluation of the
  global model on the same test set after every round;
- the same parallelism: 2 Ray actors training clients (hasfl-ray: ``--actors 2``; Flower: ``client_resources
  num_cpus=1`` on a Ray instance of 2 CPUs) on a 2-CPU machine.

What differs is each engine's own machinery: hasfl-ray's trainer actors, object-store parameters and server
actor; Flower's ServerApp, Grid messages, SuperNodes and its Ray backend (Flower pins its own Ray, so it runs
in its own virtual environment, created by ``--setup`` from benchmarks/requirements-flower.txt). On the
Flower side virtual client i is the i-th SuperNode, and the message tells it which client it is (its
partition), as Flower's simulations do with ``partition-id``.

Three workloads:

- ``training``: the paper's digits protocol (20 clients, 10 per round, 2 local epochs, batch 32, lr 0.05): rounds
  of about 0.1-0.2 s, as much the engine's as the training's;
- ``training-20``: the same with 20 local epochs: training-bound;
- ``orchestration``: FedProx's Synthetic(1, 1) over 1,000 clients, 100 per round, 1 local epoch of the small MLP
  (60-128-128-10; a client is ~10 SGD steps of about a millisecond): short local work, so the round is mostly
  the engine's own overhead. (The digits set has too few samples to give 1,000 clients one each.)

Printed per workload: start-up (process start to the first round), rounds/s over the rounds after the first,
whole-process time, the hasfl-ray/Flower ratio, where each engine's round goes (the busiest trainer's time inside
``Trainer.train``, timed by each side around the same call; the rest of the exchange of parameters and updates
including aggregation; the central evaluation; and the engine's own remainder), and test accuracy per round side
by side.

    python benchmarks/bench_vs_flower.py --setup            # create Flower's venv (once; ~5 GB with torch)
    python benchmarks/bench_vs_flower.py --repeats 2        # both workloads, interleaved
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "BENCH_FLOWER_RESULT "
DEFAULT_VENV = os.path.join(os.path.expanduser("~"), ".cache", "hasfl-ray", "flower-venv")
ACTORS = 2

WORKLOADS = {
    "training": dict(dataset="digits", clients=20, clients_per_round=10, local_epochs=2, alpha=0.3, lr=0.05,
                     rounds=5),
    "training-20": dict(dataset="digits", clients=20, clients_per_round=10, local_epochs=20, alpha=0.3, lr=0.05,
                        rounds=5),
    "orchestration": dict(dataset="synthetic", clients=1000, clients_per_round=100, local_epochs=1, alpha=0.3,
                          lr=0.01, rounds=6),
}
COMMON = dict(seed=0, batch_size=32, momentum=0.9, weight_decay=1e-4, clip_norm=10.0)


def load_data(w: dict):
    """The workload's federated dataset, built by hasfl_ray's own loader (the same on both sides)."""
    if w["dataset"] == "digits":
        from hasfl_ray.data.digits import load_digits_federated
        return load_digits_federated(w["clients"], w["alpha"], w["seed"])
    from hasfl_ray.data.synthetic import load_synthetic
    return load_synthetic(w["clients"], w["seed"])


# -- hasfl-ray ---------------------------------------------------------------------------------------------------

def run_hasfl(workload: str, t0: float) -> dict:
    from hasfl_ray.engine import Engine, RunConfig

    os.environ["HASFL_HANDOFF_ROUND"] = "0"  # Ray from the first round: a run this short would otherwise end in the
    # driver before Ray were ready (docs/ray.md, 'Start-up'), which is not the comparison made here
    config = RunConfig(**COMMON, **WORKLOADS[workload], algorithm="fedavg", backend="ray", actors=ACTORS,
                       checkpoint_every=0)
    engine = Engine(config)
    stamps = {"begin": [], "end": [], "busiest_train": [], "train": []}
    run_round = engine.run_round

    def timed(t):
        stamps["begin"].append(time.time())
        line = run_round(t)
        stamps["end"].append(time.time())
        timing = getattr(engine.backend, "active", engine.backend).timing  # inside Trainer.train, summed, per trainer
        stamps["train"].append(timing.train_seconds)
        stamps["busiest_train"].append(max(timing.slot_train_seconds.values(), default=0.0))
        return line

    engine.run_round = timed
    stamps["exchange"], stamps["evaluate"] = [], []
    backend_round, request_evaluation = engine.backend.run_round, engine.request_evaluation

    def exchange(*args, **kwargs):  # dispatch, training, results back, aggregation on the server actor
        begin = time.time()
        out = backend_round(*args, **kwargs)
        stamps["exchange"].append(time.time() - begin)
        return out

    def request(t):  # the driver's wait for a round's evaluation (it runs on the trainers, overlapped)
        finish = request_evaluation(t)

        def timed_finish():
            begin = time.time()
            out = finish()
            stamps["evaluate"].append(time.time() - begin)
            return out

        timed_finish.ready = finish.ready
        return timed_finish

    engine.backend.run_round, engine.request_evaluation = exchange, request
    summary = engine.run()
    return {"startup": stamps["begin"][0] - t0, "begin": stamps["begin"], "end": stamps["end"],
            "accuracy": [line["test_accuracy"] for line in engine.history], "sha": summary["params_sha256"],
            "train": stamps["train"], "busiest_train": stamps["busiest_train"], "exchange": stamps["exchange"],
            "evaluate": stamps["evaluate"]}


# -- Flower ------------------------------------------------------------------------------------------------------

def run_flower(workload: str, t0: float) -> dict:
    sys.path.insert(0, ROOT)  # hasfl_ray from this checkout (its data, model and trainer; no Ray import)
    import numpy as np
    import torch
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from hasfl_ray.engine.engine import initial_parameters, sample_participants
    from hasfl_ray.engine.server import Server
    from hasfl_ray.training.determinism import apply_determinism
    from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer

    w = {**COMMON, **WORKLOADS[workload]}
    model = w["dataset"]  # digits -> the CNN, synthetic -> the MLP
    names = list(initial_parameters(model, w["seed"]))
    settings = OptimizerSettings(momentum=w["momentum"], weight_decay=w["weight_decay"], clip_norm=w["clip_norm"],
                                 local_epochs=w["local_epochs"], batch_size=w["batch_size"])
    def trainer() -> Tuple[Trainer, int]:
        """One trainer per ClientApp process (Ray actor), built on first use like hasfl-ray's; kept in a module of
        the process (not in this closure, which Flower may ship again with every message); (trainer, 1 if built
        now)."""
        import types

        cache = sys.modules.setdefault("_bench_vs_flower_cache", types.ModuleType("_bench_vs_flower_cache"))
        if not hasattr(cache, "trainer"):
            apply_determinism(True)
            cache.trainer = Trainer(load_data(w), model, settings, "cpu", 1)
            return cache.trainer, 1
        return cache.trainer, 0

    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        config = msg.content["config"]
        arrays = msg.content["arrays"].to_numpy_ndarrays()
        params = {name: torch.from_numpy(a) for name, a in zip(names, arrays)}
        task = ClientTask(int(config["client"]), int(config["round"]), 1.0, float(config["lr"]), w["seed"])
        local, built = trainer()
        begin = time.perf_counter()
        result = local.train(task, params)
        seconds = time.perf_counter() - begin
        update = ArrayRecord([result.update[name].numpy() for name in names])
        metrics = MetricRecord({"num-examples": result.num_samples, "client": result.client, "built": built,
                                "train-s": seconds, "pid": os.getpid()})
        return Message(content=RecordDict({"arrays": update, "metrics": metrics}), reply_to=msg)

    stamps = {"begin": [], "end": [], "accuracy": [], "trainers_built": 0, "train": [], "busiest_train": [],
              "exchange": [], "evaluate": []}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        apply_determinism(True)
        torch.set_num_threads(1)
        server = Server(model, initial_parameters(model, w["seed"]), load_data(w), 500, "reference", "cpu")
        nodes = sorted(grid.get_node_ids())
        while len(nodes) < w["clients"]:
            time.sleep(0.1)
            nodes = sorted(grid.get_node_ids())
        for t in range(w["rounds"]):
            stamps["begin"].append(time.time())
            participants = sample_participants(w["seed"], t, w["clients"], w["clients_per_round"])
            arrays = ArrayRecord([server.params[name].numpy() for name in names])
            lr = w["lr"] * 0.995 ** t
            messages = [Message(content=RecordDict({"arrays": arrays, "config": ConfigRecord(
                {"client": client, "round": t, "lr": lr})}), message_type="train", dst_node_id=nodes[client])
                for client in participants]
            begin = time.time()
            replies = sorted((r for r in grid.send_and_receive(messages) if not r.has_error()),
                             key=lambda r: int(r.content["metrics"]["client"]))
            per_process: dict = {}
            for r in replies:
                pid = int(r.content["metrics"]["pid"])
                per_process[pid] = per_process.get(pid, 0.0) + float(r.content["metrics"]["train-s"])
            stamps["train"].append(sum(per_process.values()))
            stamps["busiest_train"].append(max(per_process.values(), default=0.0))
            stamps["trainers_built"] += sum(int(r.content["metrics"]["built"]) for r in replies)
            if len(replies) != len(participants):
                raise RuntimeError(f"round {t}: {len(participants) - len(replies)} Flower clients failed")
            # FedAvg: the sample-weighted mean of the updates, added to the global model
            total = float(sum(r.content["metrics"]["num-examples"] for r in replies))
            updates = [(r.content["metrics"]["num-examples"] / total, r.content["arrays"].to_numpy_ndarrays())
                       for r in replies]
            for k, name in enumerate(names):
                mean = sum(weight * arrays[k] for weight, arrays in updates)
                server.params[name] += torch.from_numpy(np.asarray(mean, dtype=np.float32))
            stamps["exchange"].append(time.time() - begin)  # messages out, training, replies, aggregation
            begin = time.time()
            stamps["accuracy"].append(server.evaluate()[0])
            stamps["evaluate"].append(time.time() - begin)
            stamps["end"].append(time.time())

    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=w["clients"],
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"address": "local", "num_cpus": ACTORS,
                                                 "include_dashboard": False}})
    return {"startup": stamps["begin"][0] - t0, "begin": stamps["begin"], "end": stamps["end"],
            "accuracy": stamps["accuracy"], "trainers_built": stamps["trainers_built"], "train": stamps["train"],
            "busiest_train": stamps["busiest_train"], "exchange": stamps["exchange"], "evaluate": stamps["evaluate"]}


# -- the parent --------------------------------------------------------------------------------------------------

def setup(venv: str) -> None:
    """Create Flower's virtual environment (no system site packages) and install requirements-flower.txt."""
    begin = time.time()
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-r",
                    os.path.join(ROOT, "benchmarks", "requirements-flower.txt")], check=True)
    print(f"Flower's venv ready at {venv} in {time.time() - begin:.0f} s")


def measure(engine: str, workload: str, venv: str) -> dict:
    python = sys.executable if engine == "hasfl" else os.path.join(venv, "bin", "python")
    # each engine starts a Ray instance of its own, never joining one that another job started on this machine
    env = dict(os.environ, RAY_ADDRESS="local")
    begin = time.time()
    done = subprocess.run([python, os.path.abspath(__file__), "--child", engine, "--workload", workload, "--t0",
                           repr(begin)], capture_output=True, text=True, cwd=ROOT, env=env)
    whole = time.time() - begin
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if done.returncode or not lines:
        raise RuntimeError(f"{engine} on {workload} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1][len(MARK):])
    result["whole"] = whole
    # Flower starts its Ray actors inside round 0, hasfl-ray before it: "start-up" (to round 0's start) is not
    # comparable between them, the end of round 0 (start-up plus one round) is
    result["first_done"] = result["end"][0] - begin
    later = [e - b for b, e in zip(result["begin"][1:], result["end"][1:])]
    result["rounds_per_s"] = len(later) / (result["end"][-1] - result["begin"][1])
    result["round_s"] = later
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", default=DEFAULT_VENV, help=f"Flower's virtual environment (default {DEFAULT_VENV})")
    parser.add_argument("--setup", action="store_true", help="create Flower's virtual environment and exit")
    parser.add_argument("--workloads", default="training,training-20,orchestration")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats per workload (default 2)")
    parser.add_argument("--child", choices=("hasfl", "flower"), help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = (run_hasfl if args.child == "hasfl" else run_flower)(args.workload, args.t0)
        print(MARK + json.dumps(result), flush=True)
        os._exit(0)  # do not wait for Ray's atexit handlers
    if args.setup:
        setup(args.venv)
        return
    if not os.path.exists(os.path.join(args.venv, "bin", "python")):
        sys.exit(f"Flower's venv {args.venv} does not exist; run with --setup first")
    for workload in [w for w in args.workloads.split(",") if w]:
        w = {**COMMON, **WORKLOADS[workload]}
        print(f"\n## {workload}: {w['clients']} clients, {w['clients_per_round']} per round, {w['local_epochs']} "
              f"local epoch(s), {w['rounds']} rounds (first dropped), {ACTORS} Ray actors, {os.cpu_count()} CPUs",
              flush=True)
        runs = {"hasfl": [], "flower": []}
        for repeat in range(args.repeats):
            for engine in ("hasfl", "flower") if repeat % 2 == 0 else ("flower", "hasfl"):
                r = measure(engine, workload, args.venv)
                runs[engine].append(r)
                built = f", trainers built {r['trainers_built']}" if "trainers_built" in r else ""
                if r.get("busiest_train"):  # hasfl-ray: the busiest trainer's share of the rounds after round 0
                    rounds = [e - b for b, e in zip(r["begin"][1:], r["end"][1:])]
                    built += (f", busiest trainer trained {100 * sum(r['busiest_train'][1:]) / sum(rounds):.0f} % of "
                              f"the round, all trainers {sum(r['train'][1:]) / len(rounds):.2f} s/round")
                print(f"  repeat {repeat} {engine:6}: {r['rounds_per_s']:.3f} rounds/s, start-up {r['startup']:.1f} s, "
                      f"round 0 done {r['first_done']:.1f} s, whole {r['whole']:.1f} s{built}", flush=True)
        med = {e: {k: statistics.median(r[k] for r in runs[e])
                   for k in ("rounds_per_s", "startup", "first_done", "whole")} for e in runs}
        print("\n| engine | rounds/s | to round 0's start s | to round 0's end s | whole process s |\n"
              "|---|---|---|---|---|")
        for e, label in (("hasfl", "hasfl-ray"), ("flower", "Flower")):
            lo = min(r["rounds_per_s"] for r in runs[e])
            hi = max(r["rounds_per_s"] for r in runs[e])
            print(f"| {label} | {med[e]['rounds_per_s']:.3f} ({lo:.3f}-{hi:.3f}) | {med[e]['startup']:.1f} | "
                  f"{med[e]['first_done']:.1f} | {med[e]['whole']:.1f} |")
        print(f"| hasfl-ray / Flower | {med['hasfl']['rounds_per_s'] / med['flower']['rounds_per_s']:.2f}x | | "
              f"{med['flower']['first_done'] / med['hasfl']['first_done']:.2f}x faster | "
              f"{med['flower']['whole'] / med['hasfl']['whole']:.2f}x faster |")
        print("\nWhere a round goes (median over repeats of the mean over the rounds after round 0, seconds):\n\n"
              "| engine | round | training, busiest trainer | training, all trainers | train + aggregate exchange, "
              "rest of it | evaluation | engine's own (round - busiest training - evaluation) |\n"
              "|---|---|---|---|---|---|---|")
        for e, label in (("hasfl", "hasfl-ray"), ("flower", "Flower")):
            def mean_after_first(r, key):
                return sum(r[key][1:]) / max(len(r[key]) - 1, 1)
            parts = {k: statistics.median(mean_after_first(r, k) for r in runs[e])
                     for k in ("busiest_train", "train", "exchange", "evaluate")}
            whole = statistics.median(statistics.mean(r["round_s"]) for r in runs[e])
            print(f"| {label} | {whole:.3f} | {parts['busiest_train']:.3f} | {parts['train']:.3f} | "
                  f"{parts['exchange'] - parts['busiest_train']:.3f} | {parts['evaluate']:.3f} | "
                  f"{whole - parts['busiest_train'] - parts['evaluate']:.3f} |")
        print("\n| round | hasfl-ray accuracy | Flower accuracy |\n|---|---|---|")
        for t, (a, b) in enumerate(zip(runs["hasfl"][0]["accuracy"], runs["flower"][0]["accuracy"])):
            print(f"| {t} | {a:.4f} | {b:.4f} |")


if __name__ == "__main__":
    main()
