"""hasfl-ray's client-level DP beside Opacus and Flower's DP wrapper for the same settings (docs/privacy.md, issue 47
item 1).

Two comparisons on the digits FedAvg workload (the digits CNN's parameters, every client at full width):

1. The noise: the per-coordinate std of what hasfl-ray's DP update adds to the mean of m clipped updates (measured on
   zero updates, so that the noise is all there is), with fixed-size and with Poisson participation (whose mean is
   over the expected q·N = m), and of a Poisson round nobody joined; beside the std of Opacus's own noise
   (``opacus.optimizers.optimizer._generate_noise`` with std z·C, divided by the expected batch m, as its DPOptimizer
   does) and of Flower's ``DifferentialPrivacyServerSideFixedClipping`` (its ``add_gaussian_noise_to_params`` on
   zero parameters of the same shapes and its ``compute_stdv``, run in Flower's own venv by subprocess: Flower is not
   installed beside Ray), for the same z, C and m. All should be z·C/m.
2. The privacy cost after T updates: Opacus's ``RDPAccountant`` (Poisson sampling at rate q = m/N, add-or-remove),
   what hasfl-ray reports for a run with ``participation: poisson`` (dp-accounting's RDP and PLD of the run's own
   event, ``hasfl_ray.engine.privacy.epsilon``), the two libraries on the integer orders 2..64 alone (hasfl-ray's
   event in dp-accounting's RdpAccountant; Opacus's accountant given the same orders), and what hasfl-ray reports
   for fixed-size sampling (m of N without replacement, replace-one) and without amplification. No epsilon here is
   a formula written by hand: each comes from one of the two libraries.

    python benchmarks/bench_dp.py [--clients 100 --per-round 10 --z 1.0 --clip 0.5 --steps 10,100,500 --delta 1e-5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import subprocess
import warnings

import torch

FLOWER_VENV = os.path.join(os.path.expanduser("~"), ".cache", "hasfl-ray", "flower-venv")
INTEGER_ORDERS = list(range(2, 65))

# run by Flower's venv's python: its DP wrapper's own noise on zero parameters of the given shapes
FLOWER_CHILD = """
import json, sys
import numpy as np
try:
    from flwr.supercore import differential_privacy as dp
except ImportError:  # older flwr
    from flwr.common import differential_privacy as dp
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
import flwr
shapes, z, clip, m = json.loads(sys.argv[1])
np.random.seed(0)  # the wrapper draws from numpy's global generator
zeros = [np.zeros(s, dtype=np.float32) for s in shapes]
noised = parameters_to_ndarrays(dp.add_gaussian_noise_to_params(ndarrays_to_parameters(zeros), z, clip, m))
flat = np.concatenate([a.ravel().astype(np.float64) for a in noised])
print(json.dumps({"flwr": flwr.__version__, "module": dp.__name__, "std": float(flat.std()),
                  "compute_stdv": dp.compute_stdv(z, clip, m)}))
"""


def digits_shapes():
    from hasfl_ray.models import build_model

    return {name: tuple(spec.shape) for name, spec in build_model("digits").param_specs().items()}


def hasfl_noise_std(z: float, clip: float, m: int, expected=None, nobody: bool = False, seed: int = 0) -> float:
    """The std of hasfl-ray's noise on the mean of m zero updates (``expected``: Poisson participation's q·N;
    ``nobody``: a Poisson round without a participant, the noise alone)."""
    from hasfl_ray.aggregation import aggregate_updates
    from hasfl_ray.aggregation.privacy import PrivacySettings, privatize

    shapes = digits_shapes()
    zero = {name: torch.zeros(shape) for name, shape in shapes.items()}
    updates = [] if nobody else [dict(zero) for _ in range(m)]

    def mean_of(ups, extra):
        return aggregate_updates(shapes, ups or [zero], [1.0] * max(len(ups), 1))
    settings = PrivacySettings(z, clip, seed=seed, expected=expected)
    aggregate, _ = privatize(mean_of, shapes, updates, list(range(len(updates))), settings)
    return float(torch.cat([t.flatten().double() for t in aggregate.delta.values()]).std())


def opacus_noise_std(z: float, clip: float, m: int, numel: int, seed: int = 0) -> float:
    from opacus.optimizers.optimizer import _generate_noise

    generator = torch.Generator().manual_seed(seed)
    noise = _generate_noise(std=z * clip, reference=torch.zeros(numel), generator=generator)
    return float((noise / m).double().std())  # DPOptimizer: (summed grad + noise) / expected_batch_size


def flower_noise(z: float, clip: float, m: int, venv: str):
    """Flower's DifferentialPrivacyServerSideFixedClipping noise (std measured, and its compute_stdv), from Flower's
    venv; a one-line reason instead where that venv is missing or fails."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        return f"Flower's venv is missing at {venv} (python benchmarks/bench_vs_flower.py --setup makes it)"
    arguments = json.dumps([list(digits_shapes().values()), z, clip, m])
    done = subprocess.run([python, "-c", FLOWER_CHILD, arguments], capture_output=True, text=True, timeout=600)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"Flower's DP wrapper did not run in {venv}: {last}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def integer_orders_of(opacus, delta: float) -> float:
    with warnings.catch_warnings():  # (its note that the best order is the smallest, 2: many steps)
        warnings.simplefilter("ignore")
        return opacus.get_epsilon(delta, alphas=INTEGER_ORDERS)


def epsilons(clients: int, per_round: int, z: float, steps: int, delta: float) -> dict:
    import dp_accounting
    from opacus.accountants import RDPAccountant

    from hasfl_ray.config import RunConfig
    from hasfl_ray.engine import privacy

    q = per_round / clients
    opacus = RDPAccountant()
    for _ in range(steps):
        opacus.step(noise_multiplier=z, sample_rate=q)
    poisson = RunConfig(clients=clients, clients_per_round=per_round, dp_noise_multiplier=z, dp_delta=delta,
                        participation="poisson")
    own = dp_accounting.rdp.RdpAccountant(orders=INTEGER_ORDERS,
                                          neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    own.compose(privacy.dp_event(poisson), steps)  # hasfl-ray's own event for the run
    fixed = dataclasses.replace(poisson, participation="fixed")
    out = {"steps": steps, "opacus_rdp_poisson": opacus.get_epsilon(delta),
           "hasfl_rdp_poisson": privacy.epsilon(poisson, steps),
           "opacus_integer_orders": integer_orders_of(opacus, delta),
           "hasfl_event_integer_orders": own.get_epsilon(delta),
           "hasfl_rdp_fixed_size": privacy.epsilon(fixed, steps)}
    if steps <= 100:  # dp-accounting's PLD of small multipliers over many steps takes minutes
        out["hasfl_pld_poisson"] = privacy.epsilon(dataclasses.replace(poisson, dp_accountant="pld"), steps)
        out["hasfl_pld_unamplified"] = privacy.epsilon(dataclasses.replace(fixed, dp_accountant="pld"), steps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--z", type=float, default=1.0)
    parser.add_argument("--clip", type=float, default=0.5)
    parser.add_argument("--steps", default="10,100,500")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--flower-venv", default=FLOWER_VENV, help=f"Flower's venv (default {FLOWER_VENV})")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # dp-accounting's notes on RDP orders it leaves out of the Poisson bound
    z, clip, m = args.z, args.clip, args.per_round
    numel = sum(int(torch.Size(s).numel()) for s in digits_shapes().values())
    noise = {"expected_z_clip_over_m": z * clip / m, "coordinates": numel,
             "hasfl_fixed_size": hasfl_noise_std(z, clip, m),
             "hasfl_poisson": hasfl_noise_std(z, clip, m, expected=float(m)),
             "hasfl_poisson_nobody_came": hasfl_noise_std(z, clip, m, expected=float(m), nobody=True),
             "opacus": opacus_noise_std(z, clip, m, numel), "flower": flower_noise(z, clip, m, args.flower_venv)}
    print(json.dumps({"noise_std": noise}, indent=1))
    for steps in (int(s) for s in args.steps.split(",")):
        print(json.dumps(epsilons(args.clients, args.per_round, z, steps, args.delta)))


if __name__ == "__main__":
    main()
