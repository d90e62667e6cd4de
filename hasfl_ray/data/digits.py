"""The embedded default dataset: scikit-learn's 1,797 real 8x8 handwritten digits (no download)."""

from __future__ import annotations

import importlib.util
import os
from typing import Tuple

import numpy as np
import torch

from hasfl_ray.data.base import Dataset, FederatedDataset, TensorFederatedDataset
from hasfl_ray.data.partition import partition_splits

TEST_FRACTION = 0.2


def digits_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """(pixels (1797, 64) float64, labels (1797,) int) of scikit-learn's digits, read straight from the CSV file it
    ships (what ``sklearn.datasets.load_digits`` reads, to the same values) without importing scikit-learn, whose
    import (scipy.stats and more) took a second of every run's start-up (docs/ray.md, 'Start-up'). Where the file
    is not where scikit-learn keeps it, ``load_digits`` itself."""
    spec = importlib.util.find_spec("sklearn")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz") \
        if spec is not None and spec.submodule_search_locations else ""
    if os.path.isfile(path):
        table = np.loadtxt(path, delimiter=",")
        return table[:, :-1], table[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target


def load_digits_federated(num_clients: int, alpha: float, seed: int,
                          partition: str = "dirichlet") -> TensorFederatedDataset:
    """Digits split 80/20 into train and test by a fixed permutation (seed 0, independent of the run seed),
    the training part partitioned over ``num_clients`` with Dirichlet(``alpha``) label skew drawn from ``seed``
    (or the scheme ``partition`` names: :func:`~hasfl_ray.data.partition.partition_splits`).

    Pixels (0..16) are scaled to [0, 1] and standardised with the training mean and std.
    """
    pixels, target = digits_arrays()
    images = pixels.reshape(-1, 8, 8).astype(np.float32) / 16.0
    labels = target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    n_test = int(round(TEST_FRACTION * len(labels)))
    test_idx, train_idx = order[:n_test], np.sort(order[n_test:])
    mean, std = images[train_idx].mean(), images[train_idx].std()
    x = torch.from_numpy((images - mean) / std).unsqueeze(1)
    y = torch.from_numpy(labels)
    train_x, train_y = x[train_idx].contiguous(), y[train_idx].contiguous()
    test_y = y[test_idx].contiguous()
    parts, test_parts, label_split = partition_splits(train_y.numpy(), test_y.numpy(), num_clients, partition, alpha,
                                                      np.random.default_rng(seed), min_size=10, seed=seed)
    return TensorFederatedDataset("digits", "digits", 10, train_x, train_y, x[test_idx].contiguous(), test_y,
                                  [torch.from_numpy(p) for p in parts],
                                  client_test_indices=None if test_parts is None else
                                  [torch.from_numpy(p) for p in test_parts], label_split=label_split)
from hasfl_ray.registry import register_dataset


@register_dataset("digits")
class DigitsDataset(Dataset):
    """The embedded default: scikit-learn's handwritten digits (PAPER.md, "Protocol" defaults)."""

    model = "digits"
    label_partitions = True
    defaults = dict(rounds=50, local_epochs=2, lr=0.05, clip_norm=10.0, batch_size=32)

    def load(self, config) -> FederatedDataset:
        return load_digits_federated(config.clients, config.alpha, config.seed,
                                     getattr(config, "partition", "dirichlet"))
