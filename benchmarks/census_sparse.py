"""The mask layout's lane census (issue 44 item 1): how full the fused kernel's 16-lane words are.

The CPU sparse kernel visits a covering client's values 64 columns (4 words of 16 lanes) at a time, and such a step
costs the same whatever its bits; a slice client's values fill its lanes. For ``bench aggregate --layout mask``'s
federation this prints the values, the lane slots of the 64-column steps that hold any value (the kernel's work),
their ratio (lane use) overall and per width, and the share of empty 16-column words inside those steps: the lane
work the layout costs per value against the slice layout's.

    python benchmarks/census_sparse.py [--model emnist] [--clients 50] [--seed 0]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from hasfl_ray.bench.aggregate import MODELS
from hasfl_ray.bench.federation import check_case_memory
from hasfl_ray.bench.layouts import make_layout_federation
from hasfl_ray.errors import ConfigError


def census(model: str, clients: int, seed: int) -> None:
    federation = make_layout_federation(model, clients, "mask", seed=seed)
    totals = defaultdict(lambda: np.zeros(4, dtype=np.int64))  # width -> clients, values, steps, non-empty words
    for width, update in zip(federation.widths, federation.updates):
        row = totals[width]
        row[0] += 1
        for name, packed in update.items():
            size = int(np.prod(federation.shapes[name]))
            bits = np.unpackbits(packed.bits.numpy(), bitorder="little")[:size].astype(bool)
            bits = np.pad(bits, (0, -size % 64))
            row[1] += int(bits.sum())
            row[2] += int(bits.reshape(-1, 64).any(axis=1).sum())
            row[3] += int(bits.reshape(-1, 16).any(axis=1).sum())
    clients_, values, steps, words = np.sum(list(totals.values()), axis=0)
    print(f"{model}, {clients} clients, masks at the tier mix: {values / 1e6:.1f} M values in {64 * steps / 1e6:.1f} M "
          f"lane slots: lane use {values / (64 * steps):.1%}; {1 - words / (4 * steps):.1%} of the "
          f"{4 * steps / 1e6:.2f} M word steps empty; lane work per value {64 * steps / values:.2f}x a slice's "
          f"({16 * words / values:.2f}x with every empty word skipped)")
    for width in sorted(totals):
        n, v, s, w = totals[width]
        print(f"  width {width}: {n} clients, {v / 1e6:.2f} M values, lane use {v / (64 * s):.1%}, "
              f"{64 * s / (64 * steps):.1%} of the lane slots")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="emnist")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.clients < 1:
        parser.error(f"--clients is {args.clients}; expected a positive number of clients")
    if args.seed < 0:
        parser.error(f"--seed is {args.seed}; expected a seed >= 0")
    if args.model not in MODELS:
        parser.error(f"--model is {args.model!r}; expected one of {', '.join(MODELS)}")
    try:
        check_case_memory([args.model], [args.clients])  # one sentence, never minutes of swapping
    except ConfigError as error:
        parser.error(str(error))
    census(args.model, args.clients, args.seed)


if __name__ == "__main__":
    main()
