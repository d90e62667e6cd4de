"""Shared steps of the image loaders: pixel statistics and the Dirichlet-partitioned uint8 tensor dataset."""

from __future__ import annotations

import os
from typing import Tuple

import numpy as np
import torch

from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.data.partition import partition_splits
from hasfl_ray.errors import DataError

#: Fewest training samples a client of an image set may hold (docs/datasets.md).
MIN_CLIENT_SIZE = 10

#: Images per chunk when counting pixel values: bounds the temporary memory to ~100 MB on full EMNIST.
_STATISTICS_CHUNK = 16384


def check_image_root(name: str, data_dir: str | None) -> None:
    """Refuse, in one sentence, a ``data_dir`` that is a file where a torchvision root is expected."""
    if data_dir is not None and os.path.isfile(data_dir):
        raise DataError(f"data_dir {data_dir!r} is a file; expected a directory (the torchvision root that holds "
                        f"{name}'s files)")


def channel_statistics(images: np.ndarray) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """Per-channel mean and std of ``images / 255``, exact, from a histogram of the uint8 values.

    Args:
        images: uint8 array (N, C, H, W).

    Returns:
        (mean per channel, std per channel), each a tuple of C floats.
    """
    channels = images.shape[1]
    counts = np.zeros((channels, 256), dtype=np.int64)
    for start in range(0, len(images), _STATISTICS_CHUNK):
        chunk = images[start:start + _STATISTICS_CHUNK]
        for c in range(channels):
            counts[c] += np.bincount(chunk[:, c].ravel(), minlength=256)
    values = np.arange(256, dtype=np.float64) / 255.0
    total = counts.sum(axis=1)
    mean = (counts * values).sum(axis=1) / total
    variance = (counts * values ** 2).sum(axis=1) / total - mean ** 2
    std = np.sqrt(np.maximum(variance, 1e-12))
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


#: ``input_normalization: sources``: the per-channel mean and std of ``pixels / 255`` that every sub-model source
#: standardises CIFAR-10 (and FedRolex and FIARSE CIFAR-100) with, ``transforms.Normalize((0.4914, 0.4822, 0.4465),
#: (0.2023, 0.1994, 0.2010))``: HeteroFL src/data.py at cc40f3e, FedRolex data.py at 8135109, FIARSE
#: data/cifar10/data.py at 281519c, Flower's baselines/fjord/fjord/dataset.py (CIFAR_NORMALIZATION) at fdef7afb: the
#: means are CIFAR-10's, the stds not (its pixels' are 0.2470, 0.2435, 0.2616), so their inputs are 1.22-1.30 times
#: the training split's own standardisation (``split``).
SOURCE_NORMALIZATION = ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))


def partitioned_image_dataset(name: str, num_classes: int, train_images: np.ndarray, train_labels: np.ndarray,
                              test_images: np.ndarray, test_labels: np.ndarray, num_clients: int, alpha: float,
                              seed: int, partition: str = "dirichlet",
                              normalization: str = "split") -> TensorFederatedDataset:
    """uint8 images standardised per batch with the training split's statistics (``normalization`` split; sources:
    :data:`SOURCE_NORMALIZATION`), the training split
    partitioned over ``num_clients`` by Dirichlet(``alpha``) label skew drawn from ``seed`` (or the scheme
    ``partition`` names: :func:`~hasfl_ray.data.partition.partition_splits`; ``classes:K`` also gives each client its
    own test shard).

    Args:
        train_images, test_images: uint8 arrays (N, C, H, W), already in display orientation.
        train_labels, test_labels: integer labels (N,).
    """
    mean, std = SOURCE_NORMALIZATION if normalization == "sources" else channel_statistics(train_images)
    parts, test_parts, label_split = partition_splits(train_labels, test_labels, num_clients, partition, alpha,
                                                      np.random.default_rng(seed), min_size=MIN_CLIENT_SIZE,
                                                      seed=seed)
    return TensorFederatedDataset(
        name, name, num_classes,
        torch.from_numpy(np.ascontiguousarray(train_images)), torch.from_numpy(train_labels.astype(np.int64)),
        torch.from_numpy(np.ascontiguousarray(test_images)), torch.from_numpy(test_labels.astype(np.int64)),
        [torch.from_numpy(p) for p in parts], mean=mean, std=std,
        client_test_indices=None if test_parts is None else [torch.from_numpy(p) for p in test_parts],
        label_split=label_split)
