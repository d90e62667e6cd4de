"""The federated dataset interface every loader implements, and its in-memory tensor implementation."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.errors import ConfigError, DataError


def check_splits(dataset: "FederatedDataset", label: str, owner: str) -> None:
    """Refuse, in one sentence, a loaded dataset that cannot be trained and evaluated: not a
    :class:`FederatedDataset`, no training sample (in any client) or no test sample (every round would report an
    accuracy and a loss of 0.0 and the run would "succeed"). Every dataset is checked, plug-ins included; a method of
    the dataset that raises is one sentence naming ``owner`` (``"dataset 'd'"``) and the method.

    Args:
        dataset: what the plug-in's ``load()`` returned.
        label: the dataset's name in the sentences (``emnist``, a plug-in's class).
        owner: how a failing method's sentence names the plug-in.
    """
    from hasfl_ray.registry import call_plugin, shown

    if not isinstance(dataset, FederatedDataset):
        raise DataError(f"dataset {label!r} returned {shown(dataset)} from load(); expected a hasfl_ray "
                        "FederatedDataset (a TensorFederatedDataset, TextFederatedDataset or a subclass)")
    test_size = call_plugin(owner, "test_size", lambda: int(dataset.test_size), early=True)
    if test_size <= 0:
        raise DataError(f"dataset {label!r} has an empty test split ({test_size} samples); expected at least one "
                        "test sample to evaluate the model on (check the dataset's test files)")
    train_size = call_plugin(owner, "client_sizes", lambda: int(np.sum(dataset.client_sizes(), dtype=np.int64)),
                             early=True)
    if train_size <= 0:
        raise DataError(f"dataset {label!r} has an empty training split ({train_size} samples over its clients); "
                        "expected at least one training sample (check the dataset's training files)")


class FederatedDataset(ABC):
    """A training set split over clients plus a global test set.

    Clients are addressed by index 0..num_clients-1; a client's samples by position
    0..client_size(i)-1. Loaders may materialise samples lazily (text windows, synthetic data).

    Attributes:
        name: dataset key (``digits``, ``emnist``, ``cifar10``, ``cifar100``, ``shakespeare``, ``synthetic``).
        model: key of the model it trains in :data:`hasfl_ray.models.MODEL_CONFIGS`.
        num_classes: number of labels.
        client_names: display name per client (a role for Shakespeare).
    """

    name: str
    model: str
    num_classes: int
    client_names: List[str]
    #: Local minibatch size this dataset is meant to train with (docs/datasets.md); the engine may override it.
    recommended_batch_size: int = 32
    #: Whether :meth:`client_batch` accepts positions on the dataset's device (after ``to(device)``). A trainer on
    #: a GPU then moves each epoch's order there once instead of copying positions per batch; False (the default,
    #: for a plug-in that indexes host tensors) keeps the positions on the host.
    device_positions: bool = False
    #: Architecture of ``model`` where it is not a built-in model (set from the plug-in's
    #: :attr:`Dataset.model_config`); travels with the dataset to every trainer, which registers it.
    model_config: Optional[Dict[str, Any]] = None
    #: Whether :meth:`test_view` keeps the training data too: the server's static-BatchNorm statistics pass reads it
    #: (:func:`hasfl_ray.models.resnet.sbn_statistics`, docs/models.md); set for a run whose model has sBN.
    view_keeps_train: bool = False

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

    def test_subset_batches(self, indices: torch.Tensor,
                            batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """The test samples at ``indices`` (sorted, distinct int64 positions in the test set), in that order,
        ``batch_size`` at a time (``eval_samples``). Default: one pass over :meth:`test_batches` keeping the chosen
        rows; a dataset holding its test set as tensors gathers them directly."""
        indices = torch.as_tensor(indices, dtype=torch.int64).cpu()
        xs: List[torch.Tensor] = []
        ys: List[torch.Tensor] = []
        held = offset = taken = 0
        for x, y in self.test_batches(batch_size):
            if taken == indices.numel():
                break
            n = int(y.shape[0])
            end = int(torch.searchsorted(indices, offset + n))
            if end > taken:
                local = indices[taken:end] - offset
                xs.append(x[local.to(x.device)])
                ys.append(y[local.to(y.device)])
                held += end - taken
                taken = end
            offset += n
            while held >= batch_size:
                x_all, y_all = torch.cat(xs), torch.cat(ys)
                yield x_all[:batch_size], y_all[:batch_size]
                xs, ys, held = [x_all[batch_size:]], [y_all[batch_size:]], held - batch_size
        if held:
            yield torch.cat(xs), torch.cat(ys)

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

    def client_sizes(self) -> np.ndarray:
        """n_i of every client, int64 (num_clients,). Datasets with very many clients return an array they hold
        (the default asks :meth:`client_size` once per client)."""
        return np.fromiter((self.client_size(i) for i in range(self.num_clients)), dtype=np.int64,
                           count=self.num_clients)

    def run_tv_distances(self, sampled: np.ndarray) -> np.ndarray:
        """``tv_distance`` of a run's clients.csv, float64 (num_clients,), NaN (written empty) where not computed.

        ``sampled`` is the boolean mask of the clients the run sampled. Default: :meth:`tv_distances` of every
        client; a dataset that generates clients on demand may compute only the sampled ones."""
        return self.tv_distances()

    def to(self, device: torch.device | str) -> "FederatedDataset":
        """Move held tensors to ``device`` (trainers keep the dataset on their device once). Default: no-op."""
        return self

    def test_view(self) -> "FederatedDataset":
        """A shallow copy for evaluation that keeps only what :meth:`test_batches` needs, so the server does not
        hold (or move to its device) the training set. Default: a shallow copy of everything."""
        return copy.copy(self)


class TensorFederatedDataset(FederatedDataset):
    """All samples held as tensors once; clients are index tensors into the training set.

    Image sets keep their pixels as uint8 (a quarter of float32's memory, and a quarter of the bytes
    shipped to each trainer) and standardise each batch on the fly: with ``mean`` and ``std`` given,
    batches are ``(x / 255 - mean[c]) / std[c]`` per channel c, as float32.

    Args:
        train_x, train_y: every training sample (inputs N x ..., int64 labels N).
        test_x, test_y: the global test set.
        client_indices: per client, int64 indices into ``train_x``.
        client_names: display name per client (default ``client_<i>``).
        mean, std: per-channel statistics of the [0, 1]-scaled uint8 inputs; both or neither.
        client_test_indices: per client, int64 indices into ``test_x``: its own test shard (``classes:K``, which
            splits the test set with the clients' label split as HeteroFL and FedRolex do), or None.
        label_split: per client, the labels it was dealt (``classes:K``), or None.
    """

    device_positions = True  # client_batch moves positions to its own device (a no-op there)

    def __init__(self, name: str, model: str, num_classes: int, train_x: torch.Tensor, train_y: torch.Tensor,
                 test_x: torch.Tensor, test_y: torch.Tensor, client_indices: Sequence[torch.Tensor],
                 client_names: Sequence[str] | None = None, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None, client_test_indices: Sequence[torch.Tensor] | None = None,
                 label_split: Sequence[Sequence[int]] | None = None):
        self.name, self.model, self.num_classes = name, model, num_classes
        self.client_test_indices = (None if client_test_indices is None else
                                    [torch.as_tensor(ix, dtype=torch.int64) for ix in client_test_indices])
        self.label_split = None if label_split is None else [list(map(int, labels)) for labels in label_split]
        self.train_x, self.train_y, self.test_x, self.test_y = train_x, train_y, test_x, test_y
        self.client_indices = [torch.as_tensor(ix, dtype=torch.int64) for ix in client_indices]
        self.client_names = list(client_names) if client_names is not None else \
            [f"client_{i}" for i in range(len(self.client_indices))]
        if (mean is None) != (std is None):
            raise ValueError("mean and std must be given together")
        self._scale: Tuple[torch.Tensor, torch.Tensor] | None = None
        if mean is not None and std is not None:
            shape = (1, len(mean)) + (1,) * (train_x.dim() - 2)
            mean_t = torch.tensor(list(mean), dtype=torch.float32).reshape(shape)
            std_t = torch.tensor(list(std), dtype=torch.float32).reshape(shape)
            # (x / 255 - mean) / std == x * a + b, one fused multiply-add per batch
            self._scale = (1.0 / (255.0 * std_t), -mean_t / std_t)
        self._device_indices = self.client_indices

    def _inputs(self, x: torch.Tensor) -> torch.Tensor:
        if self._scale is None:
            return x
        a, b = self._scale
        return torch.addcmul(b, x.to(torch.float32), a)

    def client_size(self, client: int) -> int:
        return int(self.client_indices[client].numel())

    def client_batch(self, client: int, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        ix = self._device_indices[client][positions.to(self.train_x.device)]
        return self._inputs(self.train_x[ix]), self.train_y[ix]

    @property
    def test_size(self) -> int:
        return int(self.test_y.numel())

    def test_batches(self, batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, self.test_size, batch_size):
            yield self._inputs(self.test_x[start:start + batch_size]), self.test_y[start:start + batch_size]

    def test_subset_batches(self, indices: torch.Tensor,
                            batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        indices = torch.as_tensor(indices, dtype=torch.int64).to(self.test_y.device)
        for start in range(0, indices.numel(), batch_size):
            ix = indices[start:start + batch_size]
            yield self._inputs(self.test_x[ix]), self.test_y[ix]

    def training_set_batch(self, indices: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Training samples ``indices`` (int64, any client's or none's): ``sbn_statistics_data: training_set``."""
        return self._inputs(self.train_x[indices]), self.train_y[indices]

    def label_histograms(self) -> np.ndarray:
        labels = self.train_y.cpu().numpy()
        return np.stack([np.bincount(labels[ix.numpy()], minlength=self.num_classes)
                         for ix in self.client_indices]).astype(np.int64)

    def test_view(self) -> "TensorFederatedDataset":
        view = copy.copy(self)
        if self.view_keeps_train:
            return view
        view.train_x, view.train_y = self.train_x[:0], self.train_y[:0]
        view.client_indices, view._device_indices, view.client_names = [], [], []
        return view

    def to(self, device: torch.device | str) -> "TensorFederatedDataset":
        for attr in ("train_x", "train_y", "test_x", "test_y"):
            setattr(self, attr, getattr(self, attr).to(device))
        # Index tensors live beside the data so client_batch never copies them host-to-device.
        self._device_indices = [ix.to(device) for ix in self.client_indices]
        if self._scale is not None:
            self._scale = (self._scale[0].to(device), self._scale[1].to(device))
        return self


class TextFederatedDataset(FederatedDataset):
    """Next-character prediction over one character stream; samples are windows generated lazily.

    Every client's text (and the test text) lives in one uint8 stream of symbol indices. A sample is
    the window starting at stream position k: inputs ``stream[k:k + seq_len]``, label
    ``stream[k + seq_len]``. Clients and the test set hold only window start positions (8 bytes per
    sample instead of seq_len + 1), and client_batch gathers the windows of a batch on demand.

    Args:
        stream: uint8 symbol indices, shape (L,).
        client_starts: per client, int64 start positions of its training windows.
        test_starts: int64 start positions of the global test windows.
        num_classes: vocabulary size.
        seq_len: window length.
    """

    device_positions = True  # client_batch moves positions to its own device (a no-op there)

    def __init__(self, name: str, model: str, num_classes: int, stream: torch.Tensor,
                 client_starts: Sequence[torch.Tensor], test_starts: torch.Tensor, client_names: Sequence[str],
                 seq_len: int, recommended_batch_size: int = 32):
        self.name, self.model, self.num_classes = name, model, num_classes
        self.stream = torch.as_tensor(stream, dtype=torch.uint8)
        self.client_starts = [torch.as_tensor(k, dtype=torch.int64) for k in client_starts]
        self.test_starts = torch.as_tensor(test_starts, dtype=torch.int64)
        self.client_names = list(client_names)
        self.seq_len = seq_len
        self.recommended_batch_size = recommended_batch_size
        self._offsets = torch.arange(seq_len + 1, dtype=torch.int64)
        self._device_starts = self.client_starts
        limit = self.stream.numel() - seq_len
        for starts in self.client_starts + [self.test_starts]:
            if starts.numel() and (int(starts.min()) < 0 or int(starts.max()) >= limit):
                raise ValueError(f"window starts must lie in [0, {limit}) for a stream of {self.stream.numel()} "
                                 f"symbols and windows of {seq_len}")

    def _windows(self, starts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        # One gather of (B, seq_len + 1) symbols; the last column is the label.
        window = self.stream[starts.unsqueeze(1) + self._offsets].to(torch.int64)
        return window[:, :-1], window[:, -1]

    def client_size(self, client: int) -> int:
        return int(self.client_starts[client].numel())

    def client_batch(self, client: int, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._windows(self._device_starts[client][positions.to(self.stream.device)])

    @property
    def test_size(self) -> int:
        return int(self.test_starts.numel())

    def test_batches(self, batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, self.test_size, batch_size):
            yield self._windows(self.test_starts[start:start + batch_size])

    def test_subset_batches(self, indices: torch.Tensor,
                            batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        starts = self.test_starts[torch.as_tensor(indices, dtype=torch.int64).to(self.test_starts.device)]
        for start in range(0, starts.numel(), batch_size):
            yield self._windows(starts[start:start + batch_size])

    def label_histograms(self) -> np.ndarray:
        stream = self.stream.cpu().numpy()
        return np.stack([np.bincount(stream[k.numpy() + self.seq_len], minlength=self.num_classes)
                         for k in self.client_starts]).astype(np.int64)

    def to(self, device: torch.device | str) -> "TextFederatedDataset":
        self.stream = self.stream.to(device)
        self.test_starts = self.test_starts.to(device)
        self._offsets = self._offsets.to(device)
        self._device_starts = [k.to(device) for k in self.client_starts]
        return self


class Dataset(ABC):
    """A dataset plug-in (``--dataset NAME`` or ``--dataset FILE.py:Class``): how to load the federated data, the
    model it trains and its protocol defaults. Built-ins register with ``@register_dataset("name")``.

    Attributes:
        model: the model to train: a built-in model (``digits``, ``emnist``, ``cifar10``, ``cifar100``,
            ``shakespeare``, ``synthetic``) or a new name described by :attr:`model_config`.
        model_config: the architecture of a new model: ``dict(kind="mlp", in_features=.., num_classes=..,
            hidden=(..,))`` or ``kind="cnn"`` / ``"lstm"`` with the arguments of
            :class:`~hasfl_ray.models.ImageCNN` / :class:`~hasfl_ray.models.CharLSTM`. Every hidden width slices.
        defaults: protocol defaults for the config fields left unset: ``rounds``, ``local_epochs``, ``lr``,
            ``clip_norm``, ``batch_size`` (any field whose default is None, under the algorithm's own values; a field
            with a default of its own is refused).
        label_partitions: True when :meth:`load` splits labelled samples by ``config.partition``
            (:func:`hasfl_ray.data.partition.partition_labels`), as the image sets do; False (the default:
            Shakespeare's roles, Synthetic's clients) refuses any partition but the default in one sentence.

    The ground truth of heterogeneity (``tv_distance`` in clients.csv, ``data inspect``) is the TV distance of each
    client's label histogram to the global one: :meth:`FederatedDataset.label_histograms` of :meth:`load`'s result.
    """

    name: ClassVar[str] = "base"
    model: ClassVar[str] = ""
    model_config: ClassVar[Optional[Dict[str, Any]]] = None
    defaults: ClassVar[Dict[str, Any]] = {}
    label_partitions: ClassVar[bool] = False

    def data_files(self, config: Any) -> Optional[List[str]]:
        """The files (folders: every file under them) :meth:`load` reads for ``config``, hashed into ``input_sha256``
        (docs/plugins.md); None (the default) where it cannot list them, which the run says in one sentence."""
        return None

    @abstractmethod
    def load(self, config: Any) -> FederatedDataset:
        """The federated dataset for ``config`` (a resolved RunConfig: ``clients``, ``alpha``, ``seed``,
        ``data_dir``, ``download`` and the rest): ``config.clients`` clients, split reproducibly from
        ``config.seed``. Bad or missing files raise :class:`hasfl_ray.errors.DataError` (one sentence)."""
