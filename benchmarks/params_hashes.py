"""params_sha256 of every built-in algorithm, and of variants that set each of their options, on the digits, the
synthetic data and a small LSTM on random text: the "nothing changes in results" check of a refactoring.

Each run is short (8 clients, 4 a round, adaptation from round 2) and local; all of them take about a minute on
two cores. Compare two commits with benchmarks/before_after.py, or keep one side's output:

    python benchmarks/params_hashes.py --json /tmp/after.json
    python benchmarks/params_hashes.py --actors 2 --against /tmp/after.json     # the same on Ray, 2 trainer actors
    python benchmarks/before_after.py --before 9338156 --repeats 1 "params_hashes.py --against /tmp/after.json"

Options are given as flat keys (``mu=0.3``), which every version of hasfl-ray takes.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

import torch

import hasfl_ray
from hasfl_ray import Dataset
from hasfl_ray.data.base import TextFederatedDataset

ALGORITHMS = ("hasfl", "heterofl", "fjord", "uniform", "random-budget", "fedavg", "fedprox", "scaffold", "fedrolex")
#: Variants that move every built-in option off its default.
VARIANTS = (dict(algorithm="hasfl", coverage=False, p_min=0.3, gamma=0.4, beta=0.8, t_norm=4, epsilon=1e-6),
            dict(algorithm="random-budget", budget=0.45, coverage=False), dict(algorithm="fedprox", mu=0.3),
            dict(algorithm="heterofl", heterofl_weighting="count"), dict(algorithm="fedrolex", rolex_step=3),
            dict(algorithm="fjord", fjord_distill_weight=0.5), dict(algorithm="scaffold", scaffold_global_lr=0.5))
PROTOCOL = dict(clients=8, clients_per_round=4, warmup=2, t_adapt=2, backend="local", seed=7)


class TinyText(Dataset):
    """Random characters on a two-layer LSTM of 32 units: the Shakespeare model's code path, in seconds."""

    model = "params-hashes-lstm"
    model_config = dict(kind="lstm", vocab_size=20, embed_dim=8, hidden=32, layers=2, seq_len=12)
    defaults = dict(rounds=6, local_epochs=1, lr=0.5, clip_norm=5.0, batch_size=8)

    def load(self, config):
        generator = torch.Generator().manual_seed(0)
        samples = 24
        total = config.clients * samples
        stream = torch.randint(0, 20, (total + 13,), generator=generator, dtype=torch.uint8)
        return TextFederatedDataset("tiny-text", self.model, 20, stream, list(torch.arange(total).split(samples)),
                                    torch.arange(40), [f"c{i}" for i in range(config.clients)], 12)


def hashes(execution: Optional[dict] = None) -> dict:
    """Every case's params_sha256, on the local backend or with ``execution`` (``backend``, ``actors``) on Ray."""
    out = {}
    cases = [dict(algorithm=name) for name in ALGORITHMS] + list(VARIANTS)
    for dataset, rounds in (("digits", 8), ("synthetic", 8), (TinyText, 6)):
        label = dataset if isinstance(dataset, str) else "lstm"
        for case in cases:
            case = dict(case)
            summary = hasfl_ray.simulate({**PROTOCOL, "rounds": rounds, **case, **(execution or {})}, dataset=dataset)
            out[f"{label} {json.dumps(case, sort_keys=True)}"] = summary["params_sha256"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the hashes here")
    parser.add_argument("--against", help="compare with the hashes of an earlier --json; exit 1 on a difference")
    parser.add_argument("--actors", type=int, default=0,
                        help="run every case on Ray with this many trainer actors (default 0: the local backend); "
                             "the hashes must be the local backend's")
    args = parser.parse_args()
    execution = None
    if args.actors:
        import ray

        ray.init(num_cpus=max(2, args.actors), include_dashboard=False, logging_level="warning")
        execution = {"backend": "ray", "actors": args.actors}  # a Ray already running: every round on the actors
    found = hashes(execution)
    for key, value in found.items():
        print(f"{value[:16]}  {key}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(found, handle, indent=1)
    if args.against:
        with open(args.against, encoding="utf-8") as handle:
            other = json.load(handle)
        differ = [key for key in found if other.get(key) != found[key]]
        print(f"{len(found) - len(differ)} of {len(found)} params_sha256 equal to {args.against}")
        for key in differ:
            print(f"  differs: {key}")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
