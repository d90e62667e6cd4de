"""hasfl-ray's server optimisers against Flower's FedAdam, FedYogi and FedAdagrad on one fixed sequence of aggregated
updates (float64): the largest difference of the parameters after each step, per optimiser.

Flower is not installed beside hasfl-ray (its flwr 1.42 pins protobuf < 7 and packaging < 26, which this project's Ray
environment has newer), so run it where flwr imports: Flower's venv (``python benchmarks/bench_vs_flower.py
--setup``), or any flwr unpacked into a folder given with ``--flwr-path`` (``pip install --no-deps --target DIR
flwr typer rich shellingham markdown-it-py mdurl pycryptodome iterators tomli tomli_w`` imports its strategies):

    python benchmarks/server_optim_vs_flower.py --flwr-path /tmp/flwr
    python benchmarks/server_optim_vs_flower.py --steps 20 --size 1000

tests/aggregation/test_server_optim.py::test_flowers_strategies_on_the_same_sequence is the same comparison as a test
(skipped, saying why, where flwr does not import). Flower's FedAdam (1.42.0) multiplies η by Adam's bias correction
√(1 − β2^(t+1)) / (1 − β1^(t+1)), which Reddi et al.'s Algorithm 2 has not: the comparison passes hasfl-ray that η
for each step. Exit status 1 when a difference exceeds --tolerance.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch


def compare(kind: str, steps: int, size: int, seed: int) -> float:
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAdagrad, FedAdam, FedYogi

    from hasfl_ray.aggregation.server_optim import DEFAULTS, ServerOptimizer, server_update

    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(size)
    eta, beta1, beta2, tau = DEFAULTS[kind]
    tau = 1e-3
    kwargs = dict(eta=eta, tau=tau) if kind == "fedadagrad" else dict(eta=eta, beta_1=beta1, beta_2=beta2, tau=tau)
    strategy = {"fedadam": FedAdam, "fedyogi": FedYogi, "fedadagrad": FedAdagrad}[kind](
        initial_parameters=ndarrays_to_parameters([x0]), **kwargs)
    import flwr.server.strategy.fedadam as fedadam_module

    corrected = kind == "fedadam" and "eta_norm" in open(fedadam_module.__file__, encoding="utf-8").read()
    flower, ours, state, worst = x0.copy(), {"w": torch.from_numpy(x0.copy())}, None, 0.0
    mask = {"w": torch.ones(size, dtype=torch.bool)}
    for t in range(1, steps + 1):
        delta = rng.standard_normal(size) * 0.1
        fit = FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters([flower + delta]),
                     num_examples=1, metrics={})
        before = flower
        flower = parameters_to_ndarrays(strategy.aggregate_fit(t, [(None, fit)], [])[0])[0]
        lr = eta * np.sqrt(1 - beta2 ** (t + 1)) / (1 - beta1 ** (t + 1)) if corrected else eta
        updated, state = server_update(ServerOptimizer(kind, lr, 0.0, beta1, beta2 or 0.0, tau), ours,
                                       {"w": torch.from_numpy(before + delta - before)}, 1.0, state, lambda: mask)
        ours.update(updated)
        worst = max(worst, float(np.abs(ours["w"].numpy() - flower).max()))
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flwr-path", help="a folder holding flwr (put first on sys.path)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-12)
    args = parser.parse_args()
    if args.flwr_path:
        sys.path.insert(0, args.flwr_path)
    try:
        import flwr
    except ImportError as error:
        print(f"flwr does not import here ({error}); run this from Flower's venv or give --flwr-path")
        return 2
    failed = False
    for kind in ("fedadam", "fedyogi", "fedadagrad"):
        worst = compare(kind, args.steps, args.size, args.seed)
        failed |= worst > args.tolerance
        print(f"{kind:<11} flwr {flwr.__version__}: {args.steps} steps of {args.size} parameters, largest difference "
              f"{worst:.3g}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
