"""Federated datasets: loaders, Dirichlet partitions and capacity tiers."""

from __future__ import annotations

import os

from hasfl_ray.data.base import FederatedDataset, TensorFederatedDataset, TextFederatedDataset
from hasfl_ray.data.partition import TIER_PROBABILITIES, TIERS, assign_tiers, dirichlet_partition
from hasfl_ray.errors import ConfigError, DataError

#: Dataset keys of ``--dataset``; every one has a model of the same name in MODEL_CONFIGS.
DATASETS = ("digits", "emnist", "cifar10", "shakespeare", "synthetic")


def load_dataset(name: str, num_clients: int, alpha: float, seed: int, data_dir: str | None = None,
                 download: bool = False, synthetic_alpha: float = 1.0,
                 synthetic_beta: float = 1.0) -> FederatedDataset:
    """The federated dataset ``name`` partitioned over ``num_clients`` for run seed ``seed``.

    Image sets (emnist, cifar10) read a torchvision root at ``data_dir`` and are split by
    Dirichlet(``alpha``) label skew drawn from ``seed``; shakespeare reads LEAF JSON or play text at
    ``data_dir`` and keeps its natural one-client-per-role partition (``alpha`` and ``seed`` unused);
    digits is embedded; synthetic is FedProx's Synthetic(``synthetic_alpha``, ``synthetic_beta``), generated
    per client from ``seed`` where it is trained (``alpha`` unused). Nothing is downloaded unless
    ``download`` is set. Missing, corrupt or truncated files raise :class:`hasfl_ray.errors.DataError` (one sentence naming the file and flag).
    """
    if name == "digits":
        from hasfl_ray.data.digits import load_digits_federated
        return load_digits_federated(num_clients, alpha, seed)
    if name in ("emnist", "cifar10") and data_dir is not None and os.path.isfile(data_dir):
        raise DataError(f"data_dir {data_dir!r} is a file; expected a directory (the torchvision root that holds "
                        f"{name}'s files)")
    if name == "emnist":
        from hasfl_ray.data.emnist import load_emnist
        return load_emnist(num_clients, alpha, seed, data_dir, download)
    if name == "cifar10":
        from hasfl_ray.data.cifar10 import load_cifar10
        return load_cifar10(num_clients, alpha, seed, data_dir, download)
    if name == "shakespeare":
        from hasfl_ray.data.shakespeare import load_shakespeare
        return load_shakespeare(num_clients, data_dir, download)
    if name == "synthetic":
        from hasfl_ray.data.synthetic import load_synthetic
        return load_synthetic(num_clients, seed, synthetic_alpha, synthetic_beta)
    raise ConfigError(f"dataset {name!r} is unknown; expected one of {', '.join(DATASETS)}")


__all__ = ["DATASETS", "FederatedDataset", "TIERS", "TIER_PROBABILITIES", "TensorFederatedDataset",
           "TextFederatedDataset", "assign_tiers", "dirichlet_partition", "load_dataset"]
