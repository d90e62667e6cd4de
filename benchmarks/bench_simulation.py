"""Round throughput of the simulator: local backend vs Ray with 1 and 2 trainer actors, and a plain PyTorch loop.

The workload makes local training dominate a round (digits CNN, 10 of 20 clients per round, 20 local
epochs), so the numbers show what the framework adds around it. For every backend it reports:

- rounds/s over the measured rounds (a first, warm-up round is run and dropped; actor start-up is not
  counted, and is printed separately);
- outside training: the share of a round's wall time not covered by the busiest trainer's local training
  (dispatch, parameter and update transfer, aggregation, evaluation, waiting): 1 - max_k(train_k) / wall;
- imbalance: the share lost because trainers finish at different times: (max_k - mean_k train_k) / wall.

The floor is the same clients, widths, data and SGD in one plain loop: no engine, no backend, no
algorithm bookkeeping (slices in, masked mean out, full-width evaluation).

Two trainers can only be as much faster as the machine lets two processes be: the benchmark first
measures that ceiling (the same CNN steps in 1 process, then in 2 at once) and prints it, since on a
shared machine other jobs take cores away.

    python benchmarks/bench_simulation.py                          # local, ray1, ray2, floor on CPU
    python benchmarks/bench_simulation.py --runs local,floor --device cuda    # a GPU without Ray
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from typing import Dict, List

import torch
from torch.nn import functional as F

from hasfl_ray.engine import Engine, LocalBackend, RunConfig
from hasfl_ray.engine.engine import initial_parameters, sample_participants
from hasfl_ray.models import build_model, extract
from hasfl_ray.training.evaluate import evaluate
from hasfl_ray.training.seeding import STREAM_CLIENT, torch_generator

WORKLOAD = dict(dataset="digits", clients=20, clients_per_round=10, local_epochs=20, seed=0, checkpoint_every=0)


class TimedLocalBackend(LocalBackend):
    """The local backend, recording the seconds spent inside Trainer.train."""

    def start(self, config, dataset, model_name, initial_params) -> None:
        super().start(config, dataset, model_name, initial_params)
        self.round_train_seconds = 0.0
        train = self.trainer.train

        def timed(task, params):
            start = time.perf_counter()
            result = train(task, params)
            self.round_train_seconds += time.perf_counter() - start
            return result

        self.trainer.train = timed


def run_engine(config: RunConfig) -> Dict[str, object]:
    """Rounds of ``config`` through the Engine; per round its wall time and per-trainer training seconds."""
    backend = TimedLocalBackend() if config.backend == "local" else None
    engine = Engine(config, backend=backend)
    engine.prepare()
    rounds: List[Dict[str, float]] = []
    run_round = engine.run_round

    def timed_round(t):
        if backend is not None:
            backend.round_train_seconds = 0.0
        start = time.perf_counter()
        line = run_round(t)
        wall = time.perf_counter() - start
        if backend is not None:
            per_trainer = [backend.round_train_seconds]
        else:
            timing = engine.backend.timing
            per_trainer = [timing.slot_train_seconds.get(k, 0.0) for k in range(len(engine.backend.slots))]
        rounds.append({"wall": wall, "max_train": max(per_trainer),
                       "mean_train": statistics.fmean(per_trainer)})
        return line

    engine.run_round = timed_round
    start = time.perf_counter()
    summary = engine.run()
    total = time.perf_counter() - start
    return {"rounds": rounds, "startup": total - sum(r["wall"] for r in rounds), "sha": summary["params_sha256"]}


def run_floor(config: RunConfig) -> Dict[str, object]:
    """The same rounds as a plain PyTorch loop (widths = each client's capacity tier, as HAS-FL's warm-up)."""
    from hasfl_ray.data import assign_tiers, load_dataset
    from hasfl_ray.engine.engine import STREAM_TIERS
    from hasfl_ray.training.seeding import numpy_rng

    c = config.resolved()
    device = torch.device(c.device)
    torch.set_num_threads(c.trainer_threads)
    dataset = load_dataset(c.dataset, c.clients, c.alpha, c.seed).to(device)
    p_max = assign_tiers(c.clients, numpy_rng(c.seed, STREAM_TIERS))
    global_params = {k: v.to(device) for k, v in initial_parameters(dataset.model, c.seed).items()}
    specs = build_model(dataset.model).param_specs()
    models = {}
    full_model = build_model(dataset.model).to(device)
    rounds = []
    for t in range(c.rounds):
        start = time.perf_counter()
        train_seconds = 0.0
        total = {k: torch.zeros_like(v) for k, v in global_params.items()}
        count = {k: torch.zeros_like(v) for k, v in global_params.items()}
        for client in sample_participants(c.seed, t, c.clients, c.clients_per_round):
            train_start = time.perf_counter()
            width = float(p_max[client])
            model = models.setdefault(width, build_model(dataset.model, width).to(device))
            params = dict(model.named_parameters())
            with torch.no_grad():
                initial = {k: extract(global_params[k], specs[k], width) for k in specs}
                for k, v in initial.items():
                    params[k].copy_(v)
            optimizer = torch.optim.SGD(model.parameters(), lr=c.lr * c.lr_decay ** t, momentum=c.momentum,
                                        weight_decay=c.weight_decay)
            generator = torch_generator(c.seed, STREAM_CLIENT, t, client)
            n = dataset.client_size(client)
            model.train()
            for _ in range(c.local_epochs):
                order = torch.randperm(n, generator=generator)
                for first in range(0, n, c.batch_size):
                    x, y = dataset.client_batch(client, order[first:first + c.batch_size])
                    optimizer.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x), y).backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip_norm)
                    optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            train_seconds += time.perf_counter() - train_start
            with torch.no_grad():
                for k, v in params.items():
                    region = tuple(slice(0, s) for s in v.shape)
                    total[k][region] += n * (v - initial[k])
                    count[k][region] += n
        with torch.no_grad():
            for k in global_params:
                global_params[k] += torch.where(count[k] > 0, total[k] / count[k].clamp(min=1), 0.0)
            for k, v in full_model.named_parameters():
                v.copy_(global_params[k])
        evaluate(full_model, dataset, c.eval_batch_size)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
        rounds.append({"wall": wall, "max_train": train_seconds, "mean_train": train_seconds})
    return {"rounds": rounds, "startup": 0.0, "sha": "-"}


def _cnn_steps(steps: int, queue) -> None:
    torch.set_num_threads(1)
    model = build_model("digits")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))
    for step in range(steps + 20):
        if step == 20:
            start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    queue.put(time.perf_counter() - start)


def parallel_capacity(steps: int = 300) -> float:
    """Throughput of 2 processes running CNN steps at once over 1 process alone (2.0 on two idle cores)."""
    context = multiprocessing.get_context("spawn")
    seconds = {}
    for count in (1, 2):
        queue = context.Queue()
        workers = [context.Process(target=_cnn_steps, args=(steps, queue)) for _ in range(count)]
        for worker in workers:
            worker.start()
        seconds[count] = [queue.get() for _ in workers]
        for worker in workers:
            worker.join()
    return 2 * seconds[1][0] / max(seconds[2])


def summarise(result: Dict[str, object]) -> Dict[str, float]:
    measured = result["rounds"][1:]  # round 0 builds models and warms caches
    wall = sum(r["wall"] for r in measured)
    return {"rate": len(measured) / wall,
            "outside": statistics.fmean(1 - r["max_train"] / r["wall"] for r in measured),
            "imbalance": statistics.fmean((r["max_train"] - r["mean_train"]) / r["wall"] for r in measured),
            "startup": result["startup"], "sha": result["sha"][:12]}


def spread(values: List[float], fmt: str) -> str:
    """Median, with the range over repeats when there are several."""
    median = format(statistics.median(values), fmt)
    return median if len(values) == 1 else f"{median} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="local,ray1,ray2,floor", help="comma list of local, ray1, ray2, floor")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per run, the first one dropped (default 4)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats of every run (default 3)")
    parser.add_argument("--local-epochs", type=int, default=WORKLOAD["local_epochs"])
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    runs = args.runs.split(",")
    base = dict(WORKLOAD, rounds=args.rounds, local_epochs=args.local_epochs, device=args.device)
    if any(run.startswith("ray") for run in runs):
        import ray
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 ** 2, logging_level="warning")
    measured: Dict[str, List[Dict[str, float]]] = {run: [] for run in runs}
    capacity: List[float] = []
    for repeat in range(args.repeats):
        if args.device == "cpu":
            capacity.append(parallel_capacity())
            print(f"repeat {repeat}: parallel capacity {capacity[-1]:.2f}x", flush=True)
        for run in runs:
            if run == "floor":
                result = run_floor(RunConfig(**base))
            elif run == "local":
                result = run_engine(RunConfig(**base, backend="local"))
            else:
                result = run_engine(RunConfig(**base, backend="ray", actors=int(run[len("ray"):])))
            measured[run].append(summarise(result))
            print(f"repeat {repeat}: {run} {measured[run][-1]['rate']:.3f} rounds/s", flush=True)
    print()
    if capacity:
        print(f"Parallel capacity of the machine (2 processes vs 1, same CNN steps): {spread(capacity, '.2f')}x")
    local = [m["rate"] for m in measured.get("local", [])]
    print("| run | rounds/s | vs local (same repeat) | outside training | imbalance | start-up s | params_sha256 |")
    print("|---|---|---|---|---|---|---|")
    for run in runs:
        rows = measured[run]
        ratios = [m["rate"] / base_rate for m, base_rate in zip(rows, local)] if local else [float("nan")]
        print(f"| {run} | {spread([m['rate'] for m in rows], '.3f')} | {spread(ratios, '.2f')}x | "
              f"{spread([100 * m['outside'] for m in rows], '.1f')} % | "
              f"{spread([100 * m['imbalance'] for m in rows], '.1f')} % | "
              f"{spread([m['startup'] for m in rows], '.1f')} | {rows[0]['sha']} |")


if __name__ == "__main__":
    main()
