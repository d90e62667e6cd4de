"""``--precision bf16`` against fp32 over whole runs: speed and accuracy, the two interleaved in one process.

For each seed the same run (HAS-FL unless ``--algorithm``, local backend, one trainer thread) is made in fp32 and in
bf16, one after the other (the order alternates from seed to seed), so both see the same machine under the same
load. Each run is timed whole (every round: training, aggregation, evaluation at each width, which stays float32) in
process CPU time and wall time, and its training alone is timed too (CPU seconds inside ``Trainer.train_unit``). It
prints, per precision, the final accuracy and the final accuracy at each evaluated width as mean ± std over the
seeds, bf16's difference to fp32 and whether it lies within one (fp32) std; and the fp32/bf16 time ratios of each
seed (whole run and training alone) with their median.

    python benchmarks/bench_precision.py --dataset digits --rounds 30 --seeds 3
    python benchmarks/bench_precision.py --dataset emnist --data-dir DATA --rounds 5 \\
        --clients 20 --clients-per-round 10 --local-steps 5 --eval-samples 1000 --seeds 3
    python benchmarks/bench_precision.py --dataset cifar10 --data-dir DATA --algorithm heterofl \\
        --set model=preresnet18-1112 --set model_norm=sbn --set model_scaler=on --rounds 2 --clients 20 \\
        --clients-per-round 3 --local-steps 5 --eval-samples 200 --seeds 3     # the HeteroFL pack's ResNet

DATA is a folder holding the torchvision EMNIST and CIFAR-10 files (docs/datasets.md). ``--json PATH`` writes every
run's figures. Accuracy on this CPU and on a GPU: the bf16 arithmetic is the same
(autocast's op lists), the kernels are not, so the accuracies agree in distribution, not bit for bit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Dict, List

import torch
import yaml

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.training.trainer import Trainer


class TrainingClock:
    """Process CPU seconds spent inside :meth:`Trainer.train_unit` (the local backend trains in this process)."""

    def __init__(self):
        self.seconds = 0.0
        self._original = Trainer.train_unit

    def __enter__(self):
        clock, original = self, self._original

        def timed(trainer, tasks, global_params):
            start = time.process_time()
            try:
                return original(trainer, tasks, global_params)
            finally:
                clock.seconds += time.process_time() - start

        Trainer.train_unit = timed
        return self

    def __exit__(self, *exc):
        Trainer.train_unit = self._original


def one_run(config: Dict, precision: str, seed: int) -> Dict:
    with tempfile.TemporaryDirectory() as out:
        engine = Engine(RunConfig(**config, precision=precision, seed=seed), out_dir=out)
        with TrainingClock() as clock:
            cpu, wall = time.process_time(), time.perf_counter()
            summary = engine.run()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return dict(precision=precision, seed=seed, cpu_s=cpu, wall_s=wall, train_cpu_s=clock.seconds,
                final_accuracy=summary["final_accuracy"], at_width=summary.get("accuracy_at_width_final", {}),
                params_sha256=summary["params_sha256"])


def mean_std(values: List[float]) -> str:
    return f"{100 * statistics.mean(values):.2f} ± {100 * (statistics.stdev(values) if len(values) > 1 else 0):.2f}"


def report(runs: List[Dict]) -> None:
    by = {p: [r for r in runs if r["precision"] == p] for p in ("fp32", "bf16")}
    rows = [("final", [r["final_accuracy"] for r in by["fp32"]], [r["final_accuracy"] for r in by["bf16"]])]
    for width in by["fp32"][0]["at_width"]:
        rows.append((f"p={width}", [r["at_width"][width] for r in by["fp32"]],
                     [r["at_width"][width] for r in by["bf16"]]))
    print("| accuracy (%) | fp32 mean ± std | bf16 mean ± std | bf16 - fp32 (points) | within one fp32 std |")
    print("|---|---|---|---|---|")
    for label, exact, rounded in rows:
        gap = 100 * (statistics.mean(rounded) - statistics.mean(exact))
        std = 100 * statistics.stdev(exact) if len(exact) > 1 else 0.0
        within = "yes" if abs(gap) <= std else "no"
        print(f"| {label} | {mean_std(exact)} | {mean_std(rounded)} | {gap:+.2f} | {within} |")
    print()
    print("| seed | whole run CPU s fp32 / bf16 | ratio | training CPU s fp32 / bf16 | ratio | wall s fp32 / bf16 |")
    print("|---|---|---|---|---|---|")
    whole, training = [], []
    for exact, rounded in zip(by["fp32"], by["bf16"]):
        whole.append(exact["cpu_s"] / rounded["cpu_s"])
        training.append(exact["train_cpu_s"] / rounded["train_cpu_s"])
        print(f"| {exact['seed']} | {exact['cpu_s']:.1f} / {rounded['cpu_s']:.1f} | {whole[-1]:.2f} | "
              f"{exact['train_cpu_s']:.1f} / {rounded['train_cpu_s']:.1f} | {training[-1]:.2f} | "
              f"{exact['wall_s']:.1f} / {rounded['wall_s']:.1f} |")
    print(f"\nmedian fp32/bf16: whole run {statistics.median(whole):.2f}x, training {statistics.median(training):.2f}x")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--data-dir")
    parser.add_argument("--algorithm", default="hasfl")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--clients", type=int)
    parser.add_argument("--clients-per-round", type=int)
    parser.add_argument("--local-steps", type=int)
    parser.add_argument("--eval-samples", type=int)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="another config key (YAML value), e.g. model=preresnet18-1112 (repeatable)")
    parser.add_argument("--json", help="write every run's figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    config = dict(dataset=args.dataset, algorithm=args.algorithm, rounds=args.rounds, backend="local",
                  trainer_threads=1, checkpoint_every=0, local_eval_clients="off")
    for key in ("data_dir", "clients", "clients_per_round", "local_steps", "eval_samples"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    for item in args.set:
        key, _, value = item.partition("=")
        config[key] = yaml.safe_load(value)
    print(f"{args.dataset}, {args.algorithm}, {args.rounds} rounds, seeds 0-{args.seeds - 1}: {config}")
    runs = []
    for seed in range(args.seeds):
        order = ("fp32", "bf16") if seed % 2 == 0 else ("bf16", "fp32")
        for precision in order:
            runs.append(one_run(config, precision, seed))
            r = runs[-1]
            print(f"  seed {seed} {precision}: final {100 * r['final_accuracy']:.2f} %, CPU {r['cpu_s']:.1f} s "
                  f"(training {r['train_cpu_s']:.1f} s), wall {r['wall_s']:.1f} s", flush=True)
    runs.sort(key=lambda r: (r["precision"], r["seed"]))
    report(runs)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(runs, handle, indent=1)


if __name__ == "__main__":
    main()
