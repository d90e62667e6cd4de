"""The federated dataset interface every loader implements, and its in-memory tensor implementation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator, List, Sequence, Tuple

import numpy as np
import torch


class FederatedDataset(ABC):
    """A training set split over clients plus a global test set.

    Clients are addressed by index 0..num_clients-1; a client's samples by position
    0..client_size(i)-1. Loaders may materialise samples lazily (text windows, synthetic data).

    Attributes:
        name: dataset key (``digits``, ``emnist``, ``cifar10``, ``shakespeare``, ``synthetic``).
        model: key of the model it trains in :data:`hasfl_ray.models.MODEL_CONFIGS`.
        num_classes: number of labels.
        client_names: display name per client (a role for Shakespeare).
    """

    name: str
    model: str
    num_classes: int
    client_names: List[str]

    @property
    def num_clients(self) -> int:
        return len(self.client_names)

    @abstractmethod
    def client_size(self, client: int) -> int:
        """Number of training samples n_i of ``client``."""

    @abstractmethod
    def client_batch(self, client: int, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Inputs and int64 labels of the given sample positions (int64 tensor) of ``client``."""

    @abstractmethod
    def test_batches(self, batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """The global test set in fixed order, ``batch_size`` samples at a time."""

    @property
    @abstractmethod
    def test_size(self) -> int:
        """Number of test samples."""

    @property
    def train_size(self) -> int:
        return sum(self.client_size(i) for i in range(self.num_clients))

    @abstractmethod
    def label_histograms(self) -> np.ndarray:
        """Ground-truth label counts, int64 array (num_clients, num_classes)."""

    def tv_distances(self) -> np.ndarray:
        """Total-variation distance of each client's label distribution to the global one, (num_clients,)."""
        hist = self.label_histograms().astype(np.float64)
        client = hist / np.maximum(hist.sum(axis=1, keepdims=True), 1)
        overall = hist.sum(axis=0) / max(hist.sum(), 1)
        return 0.5 * np.abs(client - overall).sum(axis=1)

    def to(self, device: torch.device | str) -> "FederatedDataset":
        """Move held tensors to ``device`` (trainers keep the dataset on their device once). Default: no-op."""
        return self


class TensorFederatedDataset(FederatedDataset):
    """All samples held as tensors once; clients are index tensors into the training set.

    Args:
        train_x, train_y: every training sample (inputs, int64 labels).
        test_x, test_y: the global test set.
        client_indices: per client, int64 indices into ``train_x``.
    """

    def __init__(self, name: str, model: str, num_classes: int, train_x: torch.Tensor, train_y: torch.Tensor,
                 test_x: torch.Tensor, test_y: torch.Tensor, client_indices: Sequence[torch.Tensor],
                 client_names: Sequence[str] | None = None):
        self.name, self.model, self.num_classes = name, model, num_classes
        self.train_x, self.train_y, self.test_x, self.test_y = train_x, train_y, test_x, test_y
        self.client_indices = [torch.as_tensor(ix, dtype=torch.int64) for ix in client_indices]
        self.client_names = list(client_names) if client_names is not None else \
            [f"client_{i}" for i in range(len(self.client_indices))]

    def client_size(self, client: int) -> int:
        return int(self.client_indices[client].numel())

    def client_batch(self, client: int, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        ix = self.client_indices[client].to(self.train_x.device)[positions.to(self.train_x.device)]
        return self.train_x[ix], self.train_y[ix]

    @property
    def test_size(self) -> int:
        return int(self.test_y.numel())

    def test_batches(self, batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, self.test_size, batch_size):
            yield self.test_x[start:start + batch_size], self.test_y[start:start + batch_size]

    def label_histograms(self) -> np.ndarray:
        labels = self.train_y.cpu().numpy()
        return np.stack([np.bincount(labels[ix.numpy()], minlength=self.num_classes)
                         for ix in self.client_indices]).astype(np.int64)

    def to(self, device: torch.device | str) -> "TensorFederatedDataset":
        for attr in ("train_x", "train_y", "test_x", "test_y"):
            setattr(self, attr, getattr(self, attr).to(device))
        return self
