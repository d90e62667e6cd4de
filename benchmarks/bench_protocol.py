"""Seconds per round of the paper's protocol at full dataset size, and the GPU-hours a paper table costs.

The data are synthetic tensors with the shapes of the real sets (the timing depends on shapes and counts, not on
pixel values), built in memory in seconds, so no dataset has to be downloaded:

- EMNIST byclass: 697,932 training images 1x28x28 over 62 classes, 116,323 test images, 20 clients by Dirichlet
  alpha 0.3 label skew, batch 32, 1 local epoch, the paper's CNN (the same partition code as the real loader);
- Shakespeare: the 20 largest (play, role) clients of the complete works (LEAF's construction; sizes measured on
  a sample of the plays, 20,629 to 53,414 windows of 80 characters), batch 10, 1 local epoch, the LSTM.

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

``--pack CONFIG`` times a reproduction pack instead (``configs/pack-*.yaml``, docs/reproduction/packs.md): one cell
per variant (its first seed) on CIFAR-10-shaped data split by the cell's own partition, max(4, ``--rounds``)
rounds: the first warms up, the next are steady training rounds (with the test_accuracy every round has, and under
sBN its statistics pass; their median counts), the one before last adds the evaluation at every ``eval_widths``
width (what each ``eval_every`` round adds) and the last adds every client's local accuracy (once a run). The
projection is, per variant, seeds x (rounds x training round + rounds / eval_every x evaluation extra + local
accuracy), summed over the pack. ``--data-dir`` times the real CIFAR-10 (or its sample) instead of shaped data,
and ``--clients``/``--clients-per-round`` shrink the federation for it:

    python benchmarks/bench_protocol.py --pack configs/pack-heterofl-cifar10.yaml --device cuda   # the GPU-hours
    python benchmarks/bench_protocol.py --pack configs/pack-heterofl-cifar10.yaml --variants iid-a-b-c-d-e-fix \
        --data-dir DATA --clients 10 --clients-per-round 10 --device cpu --rounds 7  # a round
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
from hasfl_ray.data.partition import dirichlet_partition, partition_labels  # noqa: E402
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


def images(config, n_train, n_test, classes, shape, by_partition=False):
    """Synthetic uint8 images and labels, Dirichlet-split over ``config.clients`` like the real loaders (or by
    ``config.partition``, the loaders' own scheme, with ``by_partition``)."""
    n, m = max(int(n_train * scale()), 20 * 64), max(int(n_test * scale()), 500)
    generator = torch.Generator().manual_seed(config.seed)
    labels = torch.randint(0, classes, (n,), generator=generator)
    x = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=generator)
    if by_partition:
        parts = partition_labels(labels.numpy(), config.clients, config.partition, config.alpha,
                                 np.random.default_rng(config.seed))
    else:
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


class CIFAR10ShapedPartitioned(CIFAR10Shaped):
    """CIFAR-10-shaped images split by the run's ``partition`` (iid, classes:K, ...), for the packs."""

    label_partitions = True

    def load(self, config):
        x, y, test_x, test_y, parts = images(config, CIFAR_TRAIN, CIFAR_TEST, 10, (3, 32, 32), by_partition=True)
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


def pack_rows(args) -> list:
    """One row per variant of the pack ``args.pack``: its steady training round, the extra seconds of an evaluation
    round and of the local accuracy, and the variant's full-protocol hours (seeds x rounds), from max(4,
    ``--rounds``) timed rounds of its first seed: warm-up, training rounds (their median), + widths, + local."""
    from hasfl_ray.sweep import plan_sweep

    plan = plan_sweep(args.pack, {})
    wanted = args.variants.split(",") if args.variants else None
    unknown = sorted(set(wanted or ()) - {cell.algorithm for cell in plan.cells})
    if unknown:
        raise SystemExit(f"--variants names {', '.join(unknown)}; expected variants of {args.pack}: "
                         + ", ".join(dict.fromkeys(cell.algorithm for cell in plan.cells)))
    here = os.path.abspath(__file__)
    rows = []
    for variant in dict.fromkeys(cell.algorithm for cell in plan.cells):
        if wanted and variant not in wanted:
            continue
        cells = [c for c in plan.cells if c.algorithm == variant]
        values = dict(cells[0].values)
        full_rounds = int(values.get("rounds") or CIFAR10Shaped.defaults["rounds"])
        eval_every = int(values.get("eval_every") or 5)  # the CIFAR-10 and plug-in default
        timed = max(args.rounds, 4)  # 0: warm-up, 1 .. timed - 3: training, timed - 2: + widths, last: + local
        values.update(rounds=timed, eval_every=timed - 1, device=args.device, backend="local",
                      eval_samples=args.eval_samples, checkpoint_every=10 ** 6)
        for key in ("clients", "clients_per_round"):
            if getattr(args, key) is not None:
                values[key] = getattr(args, key)
        if args.data_dir:
            values["data_dir"] = args.data_dir
        else:
            values["dataset"] = f"{here}:CIFAR10ShapedPartitioned"
        engine = Engine(RunConfig.from_dict(values, f"pack cell {variant}", foreign="drop"))
        engine.run()
        per_round = [line["wall_s"] for line in engine.history]
        factor = 1.0 if args.data_dir else 1 / args.scale
        train_s = float(np.median(per_round[1:-2])) * factor
        eval_extra_s = max(per_round[-2] * factor - train_s, 0.0)
        local_s = max(per_round[-1] - per_round[-2], 0.0) * factor
        cell_h = (full_rounds * train_s + -(-full_rounds // eval_every) * eval_extra_s + local_s) / 3600
        rows.append({"variant": variant, "rounds_timed": per_round, "train_round_s": train_s,
                     "eval_extra_s": eval_extra_s, "local_accuracy_s": local_s, "full_rounds": full_rounds,
                     "eval_every": eval_every, "seeds": len(cells), "cell_hours": cell_h,
                     "hours": cell_h * len(cells)})
        print(f"{variant:28s} rounds {['%.2f' % s for s in per_round]} s; training round {train_s:.2f} s, "
              f"evaluation +{eval_extra_s:.2f} s every {eval_every}, local accuracy +{local_s:.2f} s; "
              f"{full_rounds} rounds x {len(cells)} seeds = {cell_h * len(cells):.2f} h"
              + (" (scaled up)" if factor != 1 else ""), flush=True)
    return rows


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
    parser.add_argument("--pack", help="time a reproduction pack (configs/pack-*.yaml) instead of the paper's protocol")
    parser.add_argument("--variants", help="with --pack: only these variants (comma-separated)")
    parser.add_argument("--data-dir", help="with --pack: time the real CIFAR-10 under this torchvision root")
    parser.add_argument("--clients", type=int, help="with --pack: override the pack's clients")
    parser.add_argument("--clients-per-round", type=int, help="with --pack: override the pack's clients per round")
    args = parser.parse_args()
    if not 0 < args.scale <= 1:
        parser.error(f"--scale is {args.scale}; expected a fraction in (0, 1]")
    os.environ["HASFL_BENCH_SCALE"] = repr(args.scale)
    if args.pack:
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
        rows = pack_rows(args)
        hours = sum(r["hours"] for r in rows)
        k, slowdown = args.cells_per_gpu, args.share_slowdown
        note = " [scaled up from --scale: a rehearsal, not a figure]" if args.scale < 1 and not args.data_dir else ""
        if args.data_dir or args.clients or args.clients_per_round:
            note += " [not the pack's full protocol: --data-dir/--clients change the data per round]"
        print(f"\n{args.pack} ({len(rows)} variants) on {device}: {hours:.2f} hours one cell at a time; at K={k} "
              f"cells per GPU (slowdown {slowdown:g}): {hours * slowdown / k:.2f} GPU-hours{note}")
        if args.json:
            print(json.dumps({"device": device, "scale": args.scale, "pack": args.pack, "rows": rows,
                              "hours": hours, "gpu_hours": hours * slowdown / k}))
        return
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
