"""Seconds per round of the paper's protocol at full dataset size, and the GPU-hours a paper table costs.

The data are synthetic tensors with the shapes of the real sets (the timing depends on shapes and counts, not on
pixel values), built in memory in seconds, so no dataset has to be downloaded:

- EMNIST byclass: 697,932 training images 1x28x28 over 62 classes, 116,323 test images, 20 clients by Dirichlet
  alpha 0.3 label skew, batch 32, 1 local epoch, the paper's CNN (the same partition code as the real loader);
- Shakespeare: the 20 largest (play, role) clients of the complete works (LEAF's construction; sizes measured on
  the plays in ../shared/data, 20,629 to 53,414 windows of 80 characters), batch 10, 1 local epoch, the LSTM.

Each algorithm runs ROUNDS rounds through the Engine (local backend, the defaults a user gets: ``auto`` training
modes, the fused kernel, deterministic exact float32); the last round's wall time is the steady figure (the first
includes CUDA-graph captures and allocator warm-up). Table 3's projection (EMNIST and CIFAR-10, 3 seeds, 200
rounds) is printed at K cells per GPU: K cells sharing a card finish K times as many cells in ``K / slowdown``
of the time, where the slowdown is measured (``--share-slowdown``, from ``hasfl-ray sweep --cells-per-gpu`` runs;
1.0 means K cells run as fast together as alone, the optimistic bound).

    python benchmarks/bench_protocol.py --device cuda                    # the full protocol, every algorithm
    python benchmarks/bench_protocol.py --device cpu --scale 0.002       # a CPU rehearsal on 0.2 % of the data

``--scale`` shrinks every client's data by that factor (the per-round time scales with it; the projection is then
scaled back up and marked as such).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hasfl_ray.data.base import Dataset, TensorFederatedDataset, TextFederatedDataset  # noqa: E402
from hasfl_ray.data.partition import dirichlet_partition  # noqa: E402
from hasfl_ray.engine import Engine, RunConfig  # noqa: E402

EMNIST_TRAIN, EMNIST_TEST, EMNIST_CLASSES = 697_932, 116_323, 62
#: Windows of the 20 largest (play, role) clients of the complete works (hasfl_ray.data.shakespeare on the plays).
SHAKESPEARE_SIZES = (53414, 35603, 33984, 28250, 27371, 26639, 26365, 25424, 24423, 24192, 23388, 23081, 22892,
                     22846, 22761, 22348, 21078, 21012, 21011, 20629)
SHAKESPEARE_TEST = 130_106
#: Table 3's algorithms on the image sets, Table 7's on Shakespeare.
IMAGE_ALGORITHMS = ("hasfl", "fjord", "uniform")
TEXT_ALGORITHMS = ("hasfl", "fjord", "uniform")
#: CIFAR-10: 50,000 training images 3x32x32 over 10 classes, 10,000 test images; K = 5 local epochs.
CIFAR_TRAIN, CIFAR_TEST = 50_000, 10_000


def scale() -> float:
    """The fraction of the data to build (the plug-in classes are loaded as a module of their own, so the value
    travels in the environment)."""
    return float(os.environ.get("HASFL_BENCH_SCALE", "1"))


def images(config, n_train, n_test, classes, shape):
    """Synthetic uint8 images and labels, Dirichlet-split over ``config.clients`` like the real loaders."""
    n, m = max(int(n_train * scale()), 20 * 64), max(int(n_test * scale()), 500)
    generator = torch.Generator().manual_seed(config.seed)
    labels = torch.randint(0, classes, (n,), generator=generator)
    x = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=generator)
    parts = dirichlet_partition(labels.numpy(), config.clients, config.alpha, np.random.default_rng(config.seed))
    test_x = torch.randint(0, 256, (m, *shape), dtype=torch.uint8, generator=generator)
    test_y = torch.randint(0, classes, (m,), generator=generator)
    return x, labels, test_x, test_y, parts


class EMNISTShaped(Dataset):
    """Synthetic images with full EMNIST's counts and shapes (``--scale`` of them), Dirichlet-split like the real one."""

    model = "emnist"
    defaults = dict(rounds=200, local_epochs=1, lr=0.01, clip_norm=10.0, batch_size=32)

    def load(self, config):
        x, y, test_x, test_y, parts = images(config, EMNIST_TRAIN, EMNIST_TEST, EMNIST_CLASSES, (1, 28, 28))
        return TensorFederatedDataset("emnist-shaped", "emnist", EMNIST_CLASSES, x, y, test_x, test_y, parts,
                                      mean=[0.17], std=[0.33])


class CIFAR10Shaped(Dataset):
    """Synthetic images with CIFAR-10's counts and shapes, Dirichlet-split; the protocol's K = 5 local epochs."""

    model = "cifar10"
    defaults = dict(rounds=200, local_epochs=5, lr=0.01, clip_norm=10.0, batch_size=32)

    def load(self, config):
        x, y, test_x, test_y, parts = images(config, CIFAR_TRAIN, CIFAR_TEST, 10, (3, 32, 32))
        return TensorFederatedDataset("cifar10-shaped", "cifar10", 10, x, y, test_x, test_y, parts,
                                      mean=[0.49, 0.48, 0.45], std=[0.25, 0.24, 0.26])


class ShakespeareShaped(Dataset):
    """A random character stream with one client per role of the 20 largest, windows of 80 characters."""

    model = "shakespeare"
    defaults = dict(rounds=200, local_epochs=1, lr=0.1, clip_norm=5.0, batch_size=10)

    def load(self, config):
        sizes = [max(int(s * scale()), 12) for s in SHAKESPEARE_SIZES[:config.clients]]
        generator = torch.Generator().manual_seed(config.seed)
        length = sum(sizes) + 81
        stream = torch.randint(0, 95, (length,), dtype=torch.uint8, generator=generator)
        starts, offset = [], 0
        for size in sizes:
            starts.append(torch.arange(offset, offset + size))
            offset += size
        test = torch.randint(0, length - 81, (max(int(SHAKESPEARE_TEST * scale()), 100),), generator=generator)
        return TextFederatedDataset("shakespeare-shaped", "shakespeare", 95, stream, starts, test,
                                    [f"role_{i}" for i in range(len(sizes))], 80, recommended_batch_size=10)


def seconds_per_round(dataset: str, algorithm: str, device: str, rounds: int, eval_samples: int) -> list:
    here = os.path.abspath(__file__)
    config = RunConfig(dataset=f"{here}:{dataset}", algorithm=algorithm, rounds=rounds, device=device,
                       backend="local", warmup=0, t_adapt=1, eval_samples=eval_samples)
    engine = Engine(config)
    engine.run()
    return [line["wall_s"] for line in engine.history]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of every client's data (CPU rehearsal)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per algorithm (the last one is reported)")
    parser.add_argument("--datasets", default="emnist,cifar10,shakespeare")
    parser.add_argument("--algorithms", default=None, help="override the per-dataset lists (comma-separated)")
    parser.add_argument("--cells-per-gpu", type=int, default=1, help="K of the projection")
    parser.add_argument("--share-slowdown", type=float, default=1.0,
                        help="per-cell slowdown when K cells share a GPU (measured; 1.0 = none)")
    parser.add_argument("--eval-samples", type=int, default=10_000, help="test samples evaluated per round")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not 0 < args.scale <= 1:
        parser.error(f"--scale is {args.scale}; expected a fraction in (0, 1]")
    os.environ["HASFL_BENCH_SCALE"] = repr(args.scale)
    rows = []
    for name in args.datasets.split(","):
        plugin = {"emnist": "EMNISTShaped", "cifar10": "CIFAR10Shaped", "shakespeare": "ShakespeareShaped"}[name]
        algorithms = args.algorithms.split(",") if args.algorithms else \
            (TEXT_ALGORITHMS if name == "shakespeare" else IMAGE_ALGORITHMS)
        for algorithm in algorithms:
            start = time.perf_counter()
            per_round = seconds_per_round(plugin, algorithm, args.device, args.rounds, args.eval_samples)
            steady = per_round[-1] / args.scale  # back to full size
            rows.append({"dataset": name, "algorithm": algorithm, "first_round_s": per_round[0],
                         "steady_round_s": per_round[-1], "full_size_round_s": steady,
                         "wall_s": time.perf_counter() - start})
            print(f"{name:12s} {algorithm:10s} rounds {['%.2f' % s for s in per_round]} s; full size "
                  f"{steady:.2f} s/round{' (scaled up)' if args.scale < 1 else ''}", flush=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    k, slowdown = args.cells_per_gpu, args.share_slowdown
    projection = {"cells_per_gpu": k, "share_slowdown": slowdown, "device": device}
    for name in ("emnist", "cifar10"):
        table = [r for r in rows if r["dataset"] == name]
        if not table:
            continue
        hours = sum(r["full_size_round_s"] for r in table) * 200 * 3 / 3600  # each algorithm x 3 seeds x 200 rounds
        projection[f"table3_{name}_gpu_hours"] = hours * slowdown / k
        print(f"\nTable 3, {name} half ({len(table)} algorithms x 3 seeds x 200 rounds) on {device}: {hours:.2f} "
              f"hours one cell at a time; at K={k} cells per GPU (slowdown {slowdown:g}): "
              f"{hours * slowdown / k:.2f} GPU-hours" + (" (target: at most 3 on one H100)" if name == "emnist" else "")
              + (" [scaled up from --scale: a rehearsal, not a figure]" if args.scale < 1 else ""))
    if args.json:
        print(json.dumps({"device": device, "scale": args.scale, "rows": rows, "projection": projection}))


if __name__ == "__main__":
    main()
