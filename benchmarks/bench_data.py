"""Local-training throughput: the dataset held on the trainer's device once vs a DataLoader per client per round.

The first is what hasfl-ray's trainers do (``FederatedDataset.client_batch`` indexes tensors that were
moved to the trainer's device once); the second is the common FL-simulator pattern of building a
``DataLoader(Subset(...))`` for each client in each round and copying every batch to the device. The
DataLoader side gets its most favourable set-up: pre-standardised float32 tensors in memory
(``TensorDataset``), no per-sample transforms, no worker processes.

Prints samples/s for the data path alone and for full SGD steps of the dataset's CNN at width p.

    python benchmarks/bench_data.py                                   # digits, CPU
    python benchmarks/bench_data.py --dataset emnist --data-dir DATA --width 0.25
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Iterator, Tuple

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

from hasfl_ray.data import FederatedDataset, load_dataset
from hasfl_ray.models import build_model

Batches = Callable[[int, int], Iterator[Tuple[torch.Tensor, torch.Tensor]]]


def resident_batches(dataset: FederatedDataset, batch_size: int) -> Batches:
    """The trainer's way: a permutation of positions, then client_batch on device-resident tensors."""

    def batches(client: int, round_index: int):
        generator = torch.Generator().manual_seed(round_index * 1000 + client)
        order = torch.randperm(dataset.client_size(client), generator=generator)
        for start in range(0, len(order), batch_size):
            yield dataset.client_batch(client, order[start:start + batch_size])

    return batches


def dataloader_batches(dataset: FederatedDataset, batch_size: int, device: torch.device) -> Batches:
    """The per-round way: a fresh DataLoader over the client's Subset every round, batches copied to device."""
    inputs = torch.cat([dataset.client_batch(i, torch.arange(dataset.client_size(i)))[0].cpu()
                        for i in range(dataset.num_clients)])
    labels = torch.cat([dataset.client_batch(i, torch.arange(dataset.client_size(i)))[1].cpu()
                        for i in range(dataset.num_clients)])
    offsets = [0]
    for i in range(dataset.num_clients):
        offsets.append(offsets[-1] + dataset.client_size(i))
    full = TensorDataset(inputs, labels)

    def batches(client: int, round_index: int):
        generator = torch.Generator().manual_seed(round_index * 1000 + client)
        subset = Subset(full, range(offsets[client], offsets[client + 1]))
        loader = DataLoader(subset, batch_size=batch_size, shuffle=True, generator=generator)
        for x, y in loader:
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    return batches


def measure(batches: Batches, clients, rounds: int, step: Callable[[torch.Tensor, torch.Tensor], None],
            device: torch.device) -> float:
    """Samples per second over ``rounds`` rounds of one local epoch for each of ``clients``."""
    samples = 0
    start = time.perf_counter()
    for round_index in range(rounds):
        for client in clients:
            for x, y in batches(client, round_index):
                step(x, y)
                samples += len(y)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return samples / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits", choices=["digits", "emnist", "cifar10"])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--clients", type=int, default=20, help="clients in the partition")
    parser.add_argument("--trained", type=int, default=4, help="clients trained per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--width", type=float, default=1.0, help="sub-model width p of the CNN")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (trainers default to 1)")
    parser.add_argument("--repeats", type=int, default=3, help="median of this many measurements")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dataset = load_dataset(args.dataset, args.clients, 0.3, 42, args.data_dir)
    clients = sorted(range(dataset.num_clients), key=dataset.client_size, reverse=True)[:args.trained]
    loader_way = dataloader_batches(dataset, args.batch_size, device)
    dataset.to(device)
    resident_way = resident_batches(dataset, args.batch_size)

    model = build_model(dataset.model, args.width).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

    def touch(x: torch.Tensor, y: torch.Tensor) -> None:
        x.sum()

    def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()

    print(f"{args.dataset}: {sum(dataset.client_size(c) for c in clients):,} samples per round over {len(clients)} "
          f"clients, batch {args.batch_size}, {args.rounds} rounds, CNN p={args.width}, {device}, "
          f"{args.threads} thread(s); median of {args.repeats}")
    print(f"{'data path':<30} {'data only (samples/s)':>22} {'SGD steps (samples/s)':>22}")
    ways = {"on device once (client_batch)": resident_way, "DataLoader per client/round": loader_way}
    for way in ways.values():  # warm-up: allocator, kernels and caches, untimed
        measure(way, clients[:1], 1, train_step, device)
    # Repeats alternate between the two ways so that drift on a shared machine hits both alike.
    timings = {label: ([], []) for label in ways}
    for _ in range(args.repeats):
        for label, way in ways.items():
            timings[label][0].append(measure(way, clients, args.rounds, touch, device))
            timings[label][1].append(measure(way, clients, args.rounds, train_step, device))
    results = {}
    for label, (data_only, training) in timings.items():
        results[label] = (statistics.median(data_only), statistics.median(training))
        print(f"{label:<30} {results[label][0]:>22,.0f} {results[label][1]:>22,.0f}")
    (resident_data, resident_train), (loader_data, loader_train) = results.values()
    print(f"{'speed-up':<30} {resident_data / loader_data:>21.1f}x {resident_train / loader_train:>21.2f}x")


if __name__ == "__main__":
    main()
