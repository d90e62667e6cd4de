"""Federated datasets: loaders, Dirichlet partitions and capacity tiers."""

from __future__ import annotations

from hasfl_ray.data.base import FederatedDataset, TensorFederatedDataset
from hasfl_ray.data.partition import TIER_PROBABILITIES, TIERS, assign_tiers, dirichlet_partition

DATASETS = ("digits",)


def load_dataset(name: str, num_clients: int, alpha: float, seed: int, data_dir: str | None = None,
                 download: bool = False) -> FederatedDataset:
    """The federated dataset ``name`` partitioned over ``num_clients`` for run seed ``seed``."""
    if name == "digits":
        from hasfl_ray.data.digits import load_digits_federated
        return load_digits_federated(num_clients, alpha, seed)
    raise ValueError(f"dataset {name!r} is unknown; expected one of {', '.join(DATASETS)}")


__all__ = ["DATASETS", "FederatedDataset", "TIERS", "TIER_PROBABILITIES", "TensorFederatedDataset",
           "assign_tiers", "dirichlet_partition", "load_dataset"]
