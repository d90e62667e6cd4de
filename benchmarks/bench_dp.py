"""hasfl-ray's client-level DP beside Opacus for the same settings (docs/privacy.md, issue 47 item 1).

Two comparisons on the digits FedAvg workload (the digits CNN's parameters, every client at full width):

1. The noise: the per-coordinate std of what hasfl-ray's DP update adds to the mean of m clipped updates (measured on
   zero updates, so that the noise is all there is), beside the std of Opacus's own noise
   (``opacus.optimizers.optimizer._generate_noise`` with std z·C, divided by the expected batch m, as its DPOptimizer
   does), for the same z, C and m. Both should be z·C/m.
2. The privacy cost after T updates: Opacus's ``RDPAccountant`` (Poisson sampling at rate q = m/N, add-or-remove),
   dp-accounting's RDP for that same Poisson event, and what hasfl-ray reports for its run, whose sampling is fixed
   size (m of N without replacement, replace-one: ``hasfl_ray.engine.privacy.epsilon``) and, with ``pld``, no
   amplification. No epsilon here is a formula written by hand: each comes from one of the two libraries.

    python benchmarks/bench_dp.py [--clients 100 --per-round 10 --z 1.0 --clip 0.5 --steps 10,100,500 --delta 1e-5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging

import torch


def hasfl_noise_std(z: float, clip: float, m: int, seed: int = 0) -> float:
    from hasfl_ray.aggregation import aggregate_updates
    from hasfl_ray.aggregation.privacy import PrivacySettings, privatize
    from hasfl_ray.models import build_model

    shapes = {name: spec.shape for name, spec in build_model("digits").param_specs().items()}
    updates = [{name: torch.zeros(shape) for name, shape in shapes.items()} for _ in range(m)]

    def mean_of(ups, extra):
        return aggregate_updates(shapes, ups, [1.0] * len(ups))
    aggregate, _ = privatize(mean_of, shapes, updates, list(range(m)), PrivacySettings(z, clip, seed=seed))
    return float(torch.cat([t.flatten().double() for t in aggregate.delta.values()]).std())


def opacus_noise_std(z: float, clip: float, m: int, numel: int, seed: int = 0) -> float:
    from opacus.optimizers.optimizer import _generate_noise

    generator = torch.Generator().manual_seed(seed)
    noise = _generate_noise(std=z * clip, reference=torch.zeros(numel), generator=generator)
    return float((noise / m).double().std())  # DPOptimizer: (summed grad + noise) / expected_batch_size


def epsilons(clients: int, per_round: int, z: float, steps: int, delta: float) -> dict:
    import dp_accounting
    from opacus.accountants import RDPAccountant

    from hasfl_ray.config import RunConfig
    from hasfl_ray.engine import privacy

    q = per_round / clients
    opacus = RDPAccountant()
    for _ in range(steps):
        opacus.step(noise_multiplier=z, sample_rate=q)
    poisson = dp_accounting.rdp.RdpAccountant()
    poisson.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    run = RunConfig(clients=clients, clients_per_round=per_round, dp_noise_multiplier=z, dp_delta=delta)
    out = {"steps": steps, "opacus_rdp_poisson": opacus.get_epsilon(delta),
           "dp_accounting_rdp_poisson": poisson.get_epsilon(delta),
           "hasfl_rdp_fixed_size": privacy.epsilon(run, steps)}
    if steps <= 100:  # dp-accounting's PLD of small multipliers over many steps takes minutes
        out["hasfl_pld_unamplified"] = privacy.epsilon(dataclasses.replace(run, dp_accountant="pld"), steps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--z", type=float, default=1.0)
    parser.add_argument("--clip", type=float, default=0.5)
    parser.add_argument("--steps", default="10,100,500")
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # dp-accounting's notes on RDP orders it leaves out of the Poisson bound
    from hasfl_ray.models import build_model

    numel = sum(int(torch.Size(s.shape).numel()) for s in build_model("digits").param_specs().values())
    noise = {"expected_z_clip_over_m": args.z * args.clip / args.per_round,
             "hasfl": hasfl_noise_std(args.z, args.clip, args.per_round),
             "opacus": opacus_noise_std(args.z, args.clip, args.per_round, numel), "coordinates": numel}
    print(json.dumps({"noise_std": noise}, indent=1))
    for steps in (int(s) for s in args.steps.split(",")):
        print(json.dumps(epsilons(args.clients, args.per_round, args.z, steps, args.delta)))


if __name__ == "__main__":
    main()
