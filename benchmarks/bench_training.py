"""Local training throughput: N clients of one width trained one at a time (Trainer.train) vs batched
(hasfl_ray.training.batched.train_batched: one stacked torch.func computation per local step), or, with
``--compare graphs``, one at a time eagerly vs one at a time with the whole local step replayed as a captured CUDA
graph (hasfl_ray.training.graphed, ``--cuda-graphs on``; CUDA only).

Both modes train the same clients (same data, data order, SGD with momentum 0.9, weight decay 1e-4 and
gradient-norm clipping, one local epoch) in one process, alternately, so the ratio is measured on one machine
under one load. Data is random (uint8 images of the dataset's shape, or a random character stream): throughput
does not depend on the values. A warm-up pass of each mode is dropped; the median of ``--repeats`` passes is
reported, as training samples per second (client samples x epochs / wall seconds).

    python benchmarks/bench_training.py --device cpu --model emnist --clients 4 --width 0.25 --samples 64
    python benchmarks/bench_training.py --device cuda --model emnist --clients 16 --width 0.5
    python benchmarks/bench_training.py --device cuda --model lstm --clients 16 --width 0.5 --batch-size 10
    python benchmarks/bench_training.py --device cuda --model lstm --clients 4 --width 1.0 --batch-size 10 \
        --samples 1000 --compare graphs

It also prints client local steps per second (the LSTM at batch 10 is launch-bound on a GPU) and, with
``--compare graphs``, whether the graphed results equal the eager ones bit for bit.

``--compare mixed`` trains a round of the protocol's shape (``--tiers`` clients at ``--widths``: by default 20
clients, 8/5/4/3 at p = 0.25/0.5/0.75/1.0, in a fixed shuffled client order) three ways: one at a time, batched per
width (``--client-batching on``: one unit per width) and mixed-width batched (``--client-batching mixed``: one unit,
every client padded to the widest width, hasfl_ray.training.mixed); ``--clients`` and ``--width`` are not used.
It prints the largest relative gap of the mixed updates to the one-at-a-time ones (float rounding):

    python benchmarks/bench_training.py --device cpu --model emnist --compare mixed --samples 16 --threads 1
    python benchmarks/bench_training.py --device cpu --model digits --compare mixed --samples 64 --threads 1 --clock cpu
    python benchmarks/bench_training.py --device cuda --model emnist --compare mixed --samples 128
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, List

import torch

from hasfl_ray.data.base import TensorFederatedDataset, TextFederatedDataset
from hasfl_ray.engine.engine import initial_parameters
from hasfl_ray.models import MODEL_CONFIGS
from hasfl_ray.training.batched import group_tasks, train_batched
from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer

#: --model aliases: the paper's EMNIST CNN and Shakespeare LSTM.
ALIASES = {"cnn": "emnist", "lstm": "shakespeare"}


def make_dataset(model: str, clients: int, samples: int, seed: int = 0):
    """``clients`` clients of ``samples`` random samples each, shaped for ``model``."""
    generator = torch.Generator().manual_seed(seed)
    config = MODEL_CONFIGS[model]
    total = clients * samples
    indices = list(torch.arange(total).split(samples))
    if config["kind"] == "lstm":
        seq_len = config["seq_len"]
        stream = torch.randint(0, config["vocab_size"], (total + seq_len + 1,), generator=generator,
                               dtype=torch.uint8)
        return TextFederatedDataset(model, model, config["vocab_size"], stream, indices, torch.arange(10),
                                    [f"client_{i}" for i in range(clients)], seq_len)
    if config["kind"] != "cnn":
        x = torch.randn(total, config["in_features"], generator=generator)
        y = torch.randint(0, config["num_classes"], (total,), generator=generator)
        return TensorFederatedDataset(model, model, config["num_classes"], x, y, x[:10], y[:10], indices)
    shape = (config["in_channels"], config["image_size"], config["image_size"])
    x = torch.randint(0, 256, (total, *shape), generator=generator, dtype=torch.uint8)
    y = torch.randint(0, config["num_classes"], (total,), generator=generator)
    channels = config["in_channels"]
    return TensorFederatedDataset(model, model, config["num_classes"], x, y, x[:10], y[:10], indices,
                                  mean=[0.5] * channels, std=[0.25] * channels)


def timed(device: torch.device, function: Callable[[], object], clock: Callable[[], float] = time.perf_counter
          ) -> float:
    """Seconds ``function`` takes on ``clock`` (wall by default; ``time.process_time`` for ``--clock cpu``)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = clock()
    function()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return clock() - start


def protocol_round(tiers: List[int], widths: List[float], lr: float = 0.01) -> List[ClientTask]:
    """One task per client, ``tiers[k]`` of them at ``widths[k]``, the widths in a fixed shuffled client order (a
    round's participants sorted by client id have their widths in no order)."""
    drawn = [width for count, width in zip(tiers, widths) for _ in range(count)]
    order = torch.randperm(len(drawn), generator=torch.Generator().manual_seed(0)).tolist()
    return [ClientTask(client, 0, drawn[k], lr, 0) for client, k in enumerate(order)]


def by_units(trainer: Trainer, tasks: List[ClientTask], params, batching: str) -> List[object]:
    """The round's results as a backend trains them with ``--client-batching batching``: planned units, in order."""
    results: List[object] = [None] * len(tasks)
    for unit in group_tasks(tasks, batching, pads_exactly=trainer.workspace.pads_exactly):
        for position, result in zip(unit, trainer.train_unit([tasks[k] for k in unit], params)):
            results[position] = result
    return results


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--model", default="emnist",
                        help="emnist (the paper's EMNIST CNN; alias cnn), shakespeare (the LSTM; alias lstm), "
                             "cifar10, digits or synthetic (default emnist)")
    parser.add_argument("--clients", type=int, default=8, help="clients of one width (default 8)")
    parser.add_argument("--width", type=float, default=0.5, help="their sub-model width p (default 0.5)")
    parser.add_argument("--samples", type=int, default=128, help="training samples per client (default 128)")
    parser.add_argument("--batch-size", type=int, default=32, help="local batch size (default 32)")
    parser.add_argument("--repeats", type=int, default=3, help="measured passes per mode (default 3)")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's default)")
    parser.add_argument("--compare", choices=("batched", "graphs", "mixed"), default="batched",
                        help="batched: one at a time vs batched (default); graphs: one at a time eagerly vs with "
                             "CUDA graphs (CUDA only); mixed: a protocol round one at a time vs batched per width vs "
                             "mixed-width batched")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall seconds (default) or this process's CPU seconds (a shared CPU machine: with "
                             "--threads 1, CPU time is what the modes cost, whatever else runs there)")
    parser.add_argument("--tiers", default="8,5,4,3",
                        help="--compare mixed: clients at each of --widths (default 8,5,4,3: the protocol's 20)")
    parser.add_argument("--widths", default="0.25,0.5,0.75,1.0",
                        help="--compare mixed: the tiers' widths (default 0.25,0.5,0.75,1.0)")
    args = parser.parse_args(argv)
    if args.compare == "mixed":
        tiers = [int(v) for v in args.tiers.split(",")]
        widths = [float(v) for v in args.widths.split(",")]
        if len(tiers) != len(widths) or min(tiers) < 0 or sum(tiers) < 1:
            parser.error(f"--tiers is {args.tiers!r} and --widths {args.widths!r}; expected one client count >= 0 "
                         "per width, at least one client in all")
        args.clients = sum(tiers)
    model = ALIASES.get(args.model, args.model)
    device = torch.device(args.device)
    if args.compare == "graphs" and device.type != "cuda":
        print(f"--compare graphs: CUDA graphs need a CUDA device (--device cuda); on {device.type} there is nothing "
              "to compare (--cuda-graphs on runs the same step eagerly there)")
        return
    if device.type == "cuda":
        from hasfl_ray.training.determinism import apply_determinism

        apply_determinism(True)  # the settings of a run (before CUDA starts), so eager and graphed are comparable
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    dataset = make_dataset(model, args.clients, args.samples)
    settings = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=10.0, local_epochs=1,
                                 batch_size=args.batch_size)
    trainer = Trainer(dataset, model, settings, str(device), threads)
    params = {name: tensor.to(device) for name, tensor in initial_parameters(model, 0).items()}
    tasks = [ClientTask(client, 0, args.width, 0.01, 0) for client in range(args.clients)]
    if args.compare == "mixed":
        tasks = protocol_round(tiers, widths)
        modes = {"one at a time": lambda: [trainer.train(task, params) for task in tasks],
                 "per width": lambda: by_units(trainer, tasks, params, "on"),
                 "mixed": lambda: by_units(trainer, tasks, params, "mixed")}
        if device.type == "cuda":  # the default on a GPU: one at a time, each local step a replayed CUDA graph
            graphed = Trainer(make_dataset(model, args.clients, args.samples), model, settings, str(device), threads,
                              cuda_graphs=True)
            modes["graphed one at a time"] = lambda: [graphed.train(task, params) for task in tasks]
    elif args.compare == "graphs":
        graphed = Trainer(make_dataset(model, args.clients, args.samples), model, settings, str(device), threads,
                          cuda_graphs=True)
        modes = {"one at a time": lambda: [trainer.train(task, params) for task in tasks],
                 "graphed": lambda: [graphed.train(task, params) for task in tasks]}
    else:
        modes = {"one at a time": lambda: [trainer.train(task, params) for task in tasks],
                 "batched": lambda: train_batched(trainer, tasks, params)}
    seconds = {mode: [] for mode in modes}
    outputs = {}
    for repeat in range(args.repeats + 1):
        for mode, function in modes.items():
            elapsed = timed(device, lambda: outputs.__setitem__(mode, function()),
                            time.process_time if args.clock == "cpu" else time.perf_counter)
            if repeat:  # the first pass of each mode is a warm-up (and, graphed, captures the step)
                seconds[mode].append(elapsed)
    samples = args.clients * args.samples * settings.local_epochs
    steps = sum(result.steps for result in outputs["one at a time"])
    shape = (f"tiers {args.tiers} at widths {args.widths}" if args.compare == "mixed" else f"width {args.width}")
    print(f"model {model} {shape} | {args.clients} clients x {args.samples} samples, batch "
          f"{args.batch_size}, 1 epoch | device {device}, {threads} threads | median of {args.repeats} | "
          f"{args.clock} seconds")
    print(f"{'mode':<16}{'seconds':>10}{'samples/s':>12}{'steps/s':>10}")
    rates = {}
    for mode, values in seconds.items():
        median = statistics.median(values)
        rates[mode] = samples / median
        print(f"{mode:<16}{median:>10.3f}{rates[mode]:>12.1f}{steps / median:>10.1f}")
    if args.compare == "graphs":
        captured = sum(step.captured for step in graphed.steps._steps.values())
        same = all(a.loss == b.loss and all(torch.equal(a.update[n], b.update[n]) for n in a.update)
                   for a, b in zip(outputs["one at a time"], outputs["graphed"]))
        print(f"graphed steps captured: {captured} of {len(graphed.steps)}; graphed == eager bit for bit: "
              f"{'yes' if same else 'NO'}")
        print(f"graphed / one at a time: {rates['graphed'] / rates['one at a time']:.2f}x")
    elif args.compare == "mixed":
        gap = max(float((b.update[n] - a.update[n]).norm() / max(float(a.update[n].norm()), 1e-3))
                  for a, b in zip(outputs["one at a time"], outputs["mixed"]) for n in a.update)
        print(f"units: per width {len(group_tasks(tasks, 'on'))}, mixed "
              f"{len(group_tasks(tasks, 'mixed', pads_exactly=trainer.workspace.pads_exactly))}; largest relative "
              f"gap of the mixed updates to one at a time: {gap:.1e}")
        print(f"mixed / per width: {rates['mixed'] / rates['per width']:.2f}x; mixed / one at a time: "
              f"{rates['mixed'] / rates['one at a time']:.2f}x; per width / one at a time: "
              f"{rates['per width'] / rates['one at a time']:.2f}x")
        if "graphed one at a time" in rates:
            print(f"mixed / graphed one at a time: {rates['mixed'] / rates['graphed one at a time']:.2f}x; "
                  f"per width / graphed one at a time: {rates['per width'] / rates['graphed one at a time']:.2f}x")
    else:
        print(f"batched / one at a time: {rates['batched'] / rates['one at a time']:.2f}x")


if __name__ == "__main__":
    main()
