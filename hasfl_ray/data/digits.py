"""The embedded default dataset: scikit-learn's 1,797 real 8x8 handwritten digits (no download)."""

from __future__ import annotations

import numpy as np
import torch

from hasfl_ray.data.base import Dataset, FederatedDataset, TensorFederatedDataset
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
from hasfl_ray.registry import register_dataset


@register_dataset("digits")
class DigitsDataset(Dataset):
    """The embedded default: scikit-learn's handwritten digits (PAPER.md, "Protocol" defaults)."""

    model = "digits"
    defaults = dict(rounds=50, local_epochs=2, lr=0.05, clip_norm=10.0, batch_size=32)

    def load(self, config) -> FederatedDataset:
        return load_digits_federated(config.clients, config.alpha, config.seed)
