"""Federated datasets: loaders, label partitions and capacity tiers."""

from __future__ import annotations

from types import SimpleNamespace

from hasfl_ray.data.base import Dataset, FederatedDataset, TensorFederatedDataset, TextFederatedDataset, check_splits
from hasfl_ray.data.partition import TIER_PROBABILITIES, TIERS, assign_tiers, dirichlet_partition, partition_labels, partition_splits
from hasfl_ray.federation import check_partition_applies
from hasfl_ray.registry import call_plugin, lookup, register_dataset, registered, spec_label

# The built-ins: one import each registers one --dataset name (its loader module, imported lazily, does the work).
from hasfl_ray.data import digits  # noqa: F401,E402
from hasfl_ray.data import emnist  # noqa: F401,E402
from hasfl_ray.data import cifar10  # noqa: F401,E402
from hasfl_ray.data import cifar100  # noqa: F401,E402
from hasfl_ray.data import shakespeare  # noqa: F401,E402
from hasfl_ray.data import synthetic  # noqa: F401,E402

#: Built-in ``--dataset`` names; each trains the built-in model of the same name.
DATASETS = registered("dataset")


def load_dataset(name: str, num_clients: int, alpha: float, seed: int, data_dir: str | None = None,
                 download: bool = False, synthetic_alpha: float = 1.0,
                 synthetic_beta: float = 1.0, partition: str = "dirichlet") -> FederatedDataset:
    """The federated dataset ``name`` (a registered name or a ``FILE.py:Class`` / ``MODULE:Class`` plug-in)
    partitioned over ``num_clients`` for run seed ``seed``.

    Image sets (emnist, cifar10, cifar100) read a torchvision root at ``data_dir`` and are split by
    Dirichlet(``alpha``) label skew drawn from ``seed`` (or the ``partition`` scheme: iid, classes:K, shards:S, ...; it
    applies to digits too, and to no other built-in: one sentence); shakespeare reads LEAF JSON or play text at
    ``data_dir`` and keeps its natural one-client-per-role partition (``alpha`` and ``seed`` unused);
    digits is embedded; synthetic is FedProx's Synthetic(``synthetic_alpha``, ``synthetic_beta``), generated
    per client from ``seed`` where it is trained (``alpha`` unused). Nothing is downloaded unless
    ``download`` is set. Missing, corrupt or truncated files raise :class:`hasfl_ray.errors.DataError` (one sentence naming the file and flag).
    """
    settings = SimpleNamespace(dataset=name, clients=num_clients, alpha=alpha, seed=seed, data_dir=data_dir,
                               download=download, synthetic_alpha=synthetic_alpha, synthetic_beta=synthetic_beta,
                               partition=partition)
    return load_plugin_dataset(lookup("dataset", name), settings)


def load_plugin_dataset(plugin: type, config) -> FederatedDataset:
    """Load the dataset of plug-in class ``plugin`` for ``config``; it carries the plug-in's model_config.

    What the plug-in raises (a DataError keeps its own sentence) is one sentence naming it and the method, its
    traceback shown with -v (no run directory exists yet); a dataset without a training or a test sample is
    refused (:func:`~hasfl_ray.data.base.check_splits`)."""
    name = getattr(config, "dataset", None)
    label = spec_label(name) if isinstance(name, str) else getattr(plugin, "__name__", "dataset")
    owner = f"dataset {label!r}"
    check_partition_applies(plugin, label, getattr(config, "partition", "dirichlet"))
    instance = call_plugin(owner, "__init__", plugin, early=True)
    dataset = call_plugin(owner, "load", lambda: instance.load(config), early=True)
    check_splits(dataset, label, owner)
    model_config = call_plugin(owner, "model_config", lambda: None if plugin.model_config is None
                               else dict(plugin.model_config), early=True)
    if model_config is not None and getattr(dataset, "model_config", None) is None:
        dataset.model_config = model_config
    return dataset


__all__ = ["DATASETS", "Dataset", "FederatedDataset", "TIERS", "TIER_PROBABILITIES", "TensorFederatedDataset",
           "TextFederatedDataset", "assign_tiers", "dirichlet_partition", "load_dataset", "load_plugin_dataset",
           "partition_labels", "partition_splits", "register_dataset"]
