"""The embedded default dataset: scikit-learn's 1,797 real 8x8 handwritten digits (no download)."""

from __future__ import annotations

import numpy as np
import torch

from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.data.partition import dirichlet_partition

TEST_FRACTION = 0.2


def load_digits_federated(num_clients: int, alpha: float, seed: int) -> TensorFederatedDataset:
    """Digits split 80/20 into train and test by a fixed permutation (seed 0, independent of the run seed),
    the training part partitioned over ``num_clients`` with Dirichlet(``alpha``) label skew drawn from ``seed``.

    Pixels (0..16) are scaled to [0, 1] and standardised with the training mean and std.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = bunch.images.astype(np.float32) / 16.0
    labels = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    n_test = int(round(TEST_FRACTION * len(labels)))
    test_idx, train_idx = order[:n_test], np.sort(order[n_test:])
    mean, std = images[train_idx].mean(), images[train_idx].std()
    x = torch.from_numpy((images - mean) / std).unsqueeze(1)
    y = torch.from_numpy(labels)
    train_x, train_y = x[train_idx].contiguous(), y[train_idx].contiguous()
    parts = dirichlet_partition(train_y.numpy(), num_clients, alpha, np.random.default_rng(seed), min_size=10)
    return TensorFederatedDataset("digits", "digits", 10, train_x, train_y, x[test_idx].contiguous(),
                                  y[test_idx].contiguous(), [torch.from_numpy(p) for p in parts])
