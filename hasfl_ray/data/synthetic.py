"""FedProx's Synthetic(alpha, beta) benchmark (Li et al. 2020), generated per client on demand from (seed, client)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Iterator, Sequence, Tuple, Union

import numpy as np
import torch

from hasfl_ray.data.base import Dataset, FederatedDataset
from hasfl_ray.data.memory import check_client_memory
from hasfl_ray.registry import register_dataset
from hasfl_ray.training.seeding import numpy_rng

NUM_FEATURES = 60
NUM_CLASSES = 10
#: Client sizes are FedProx's lognormal(4, 2) + 50, clipped here so one outlier cannot dominate a round
#: (the unclipped tail reaches ~10^5 samples among 10,000 clients).
MIN_CLIENT_SAMPLES = 50
MAX_CLIENT_SAMPLES = 5000
#: The global test set draws this many samples in all, from at most TEST_CLIENTS clients.
TEST_SAMPLES = 2000
TEST_CLIENTS = 200
#: How many clients' generated training sets a trainer keeps. One at a time, a round trains a client start to
#: end; batched training (``--client-batching on``) takes a batch from every client of a group at each local
#: step, so the cache holds a whole group (hasfl_ray.training.batched.MAX_GROUP clients; at most 64 x 5,000
#: samples x 60 float32 = 77 MB), or every step would regenerate every client's data.
CACHED_CLIENTS = 64

#: Up to this many clients, clients.csv's tv_distance is exact for every client (each client's labels are
#: regenerated once at the end of the run: seconds per 10,000 clients). Beyond it, only the clients the run
#: sampled get one (their data is generated when they are sampled; the rest never are), measured against the
#: pooled labels of REFERENCE_CLIENTS seeded clients instead of all of them.
EXACT_TV_CLIENTS = 10_000
REFERENCE_CLIENTS = 1_000

# Stream kinds of hasfl_ray.training.seeding, disjoint from the engine's (1-5).
STREAM_SYNTHETIC_MODEL, STREAM_SYNTHETIC_TRAIN, STREAM_SYNTHETIC_TEST = 101, 102, 103
STREAM_SYNTHETIC_SIZES, STREAM_SYNTHETIC_TEST_CLIENTS = 104, 105
STREAM_SYNTHETIC_REFERENCE = 106


class ClientNames(Sequence):
    """``client_0``, ``client_1``, ... made when asked for: a million names cost nothing until written."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: Union[int, slice]):
        if isinstance(index, slice):
            return [f"client_{i}" for i in range(*index.indices(self.count))]
        if not -self.count <= index < self.count:
            raise IndexError(f"client {index} out of range for {self.count} clients")
        return f"client_{index % self.count}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == self.count and list(self) == list(other)


def client_sizes(num_clients: int, seed: int) -> np.ndarray:
    """n_i per client: int(lognormal(4, 2)) + 50, clipped to [50, 5000], int64 (num_clients,)."""
    draw = numpy_rng(seed, STREAM_SYNTHETIC_SIZES).lognormal(4.0, 2.0, num_clients)
    return np.clip(draw.astype(np.int64) + MIN_CLIENT_SAMPLES, MIN_CLIENT_SAMPLES, MAX_CLIENT_SAMPLES)


class SyntheticFederatedDataset(FederatedDataset):
    """Synthetic(alpha, beta): client k has its own softmax-regression labeller and its own input distribution.

    Client k draws u_k ~ N(0, alpha), B_k ~ N(0, beta), v_k ~ N(B_k, 1)^60, W_k ~ N(u_k, 1)^(60x10),
    b_k ~ N(u_k, 1)^10; its samples are x ~ N(v_k, diag(j^-1.2)) and y = argmax(W_k^T x + b_k) (FedProx's
    generator, with the covariance's diagonal form sampled directly). beta controls how much the clients'
    inputs differ. alpha is kept as defined, but note that the shift u_k is common to every class and
    cancels in the argmax, so, exactly as with FedProx's own generator, it changes no sample: the
    labellers differ between clients through their N(0, 1) parts at every alpha.

    Nothing per client is stored but its size: a client's samples are regenerated from
    (seed, client) wherever it is trained, so memory does not grow with the number of clients and a
    pickled copy (what Ray ships to each trainer) is a few hundred kB even for 10,000 clients. The
    global test set is bounded: ``TEST_SAMPLES`` samples from up to ``TEST_CLIENTS`` seeded clients,
    from a stream separate from their training samples.

    Args:
        num_clients: number of clients N.
        seed: run seed; every draw derives from it.
        alpha, beta: the benchmark's heterogeneity parameters (>= 0; FedProx uses (0, 0), (0.5, 0.5), (1, 1)).
    """

    name = "synthetic"
    model = "synthetic"
    device_positions = True  # client_batch moves positions to its own device (a no-op there)
    num_classes = NUM_CLASSES

    def __init__(self, num_clients: int, seed: int, alpha: float = 1.0, beta: float = 1.0):
        self.seed, self.alpha, self.beta = seed, float(alpha), float(beta)
        check_client_memory(num_clients)  # one sentence, not a MemoryError from the arrays below
        self.sizes = client_sizes(num_clients, seed)
        self.client_names = ClientNames(num_clients)  # not a list: nothing per client is a Python object
        self._scale = np.power(np.arange(1, NUM_FEATURES + 1, dtype=np.float64), -0.6)  # sqrt of j^-1.2
        self.device = torch.device("cpu")
        self._cache: "OrderedDict[int, Tuple[torch.Tensor, torch.Tensor]]" = OrderedDict()
        test_x, test_y = self._test_set(num_clients)
        self.test_x, self.test_y = torch.from_numpy(test_x), torch.from_numpy(test_y)

    def _labeller(self, client: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(v_k (60,), W_k (60, 10), b_k (10,)) of ``client``, float64."""
        rng = numpy_rng(self.seed, STREAM_SYNTHETIC_MODEL, client)
        u, b_mean = rng.normal(0.0, self.alpha), rng.normal(0.0, self.beta)
        v = rng.normal(b_mean, 1.0, NUM_FEATURES)
        w = rng.normal(u, 1.0, (NUM_FEATURES, NUM_CLASSES))
        b = rng.normal(u, 1.0, NUM_CLASSES)
        return v, w, b

    def _samples(self, client: int, stream: int, count: int) -> Tuple[np.ndarray, np.ndarray]:
        """``count`` samples of ``client`` from ``stream``: float32 (count, 60) inputs, int64 labels."""
        v, w, b = self._labeller(client)
        # float32 normals halve the generation time; the labels come from float64 logits so that a
        # different BLAS on another node cannot flip a near-tie.
        z = numpy_rng(self.seed, stream, client).standard_normal((count, NUM_FEATURES), dtype=np.float32)
        x = v + z * self._scale
        y = np.argmax(x @ w + b, axis=1).astype(np.int64)
        return x.astype(np.float32), y

    def _test_set(self, num_clients: int) -> Tuple[np.ndarray, np.ndarray]:
        count = min(num_clients, TEST_CLIENTS)
        clients = np.sort(numpy_rng(self.seed, STREAM_SYNTHETIC_TEST_CLIENTS).choice(num_clients, count,
                                                                                       replace=False))
        per_client = -(-TEST_SAMPLES // count)
        parts = [self._samples(int(c), STREAM_SYNTHETIC_TEST, per_client) for c in clients]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def client_size(self, client: int) -> int:
        return int(self.sizes[client])

    def client_sizes(self) -> np.ndarray:
        return self.sizes.copy()

    @property
    def train_size(self) -> int:
        return int(self.sizes.sum())

    def client_data(self, client: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """All training samples of ``client`` on this dataset's device (generated once, a few kept)."""
        if client in self._cache:
            self._cache.move_to_end(client)
            return self._cache[client]
        x, y = self._samples(client, STREAM_SYNTHETIC_TRAIN, self.client_size(client))
        data = (torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device))
        self._cache[client] = data
        while len(self._cache) > CACHED_CLIENTS:
            self._cache.popitem(last=False)
        return data

    def client_batch(self, client: int, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        x, y = self.client_data(client)
        positions = positions.to(self.device)
        return x[positions], y[positions]

    @property
    def test_size(self) -> int:
        return int(self.test_y.numel())

    def test_batches(self, batch_size: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for start in range(0, self.test_size, batch_size):
            yield self.test_x[start:start + batch_size], self.test_y[start:start + batch_size]

    def label_histograms(self) -> np.ndarray:
        """Label counts per client, int64 (num_clients, 10): regenerates every client's labels once (streaming,
        O(num_clients x 10) memory; a few seconds per 10,000 clients)."""
        return self._histograms(np.arange(self.num_clients))

    def client_label_histograms(self, clients: np.ndarray) -> np.ndarray:
        """Label counts of ``clients`` only, int64 (len(clients), 10): each one's labels regenerated."""
        return self._histograms(clients)

    def _histograms(self, clients: np.ndarray) -> np.ndarray:
        from threadpoolctl import threadpool_limits

        clients = np.asarray(clients, dtype=np.int64)
        hist = np.zeros((len(clients), NUM_CLASSES), dtype=np.int64)
        with threadpool_limits(1, user_api="blas"):  # thousands of tiny matmuls: threads only add overhead
            for k, client in enumerate(clients.tolist()):
                hist[k] = self._label_histogram(client)
        return hist

    def _label_histogram(self, client: int) -> np.ndarray:
        _, y = self._samples(client, STREAM_SYNTHETIC_TRAIN, self.client_size(client))
        return np.bincount(y, minlength=NUM_CLASSES)

    def run_tv_distances(self, sampled: np.ndarray) -> np.ndarray:
        """Exact for every client up to EXACT_TV_CLIENTS clients; beyond, the sampled clients' only (NaN for the
        rest), against the pooled labels of REFERENCE_CLIENTS clients drawn from the seed (the same for every run
        of this seed and size, whatever it sampled)."""
        if self.num_clients <= EXACT_TV_CLIENTS:
            return self.tv_distances()
        from threadpoolctl import threadpool_limits

        reference = numpy_rng(self.seed, STREAM_SYNTHETIC_REFERENCE).choice(self.num_clients, REFERENCE_CLIENTS,
                                                                             replace=False)
        tv = np.full(self.num_clients, np.nan)
        with threadpool_limits(1, user_api="blas"):
            overall = sum(self._label_histogram(int(c)) for c in np.sort(reference)).astype(np.float64)
            overall /= overall.sum()
            for client in np.flatnonzero(sampled):
                hist = self._label_histogram(int(client)).astype(np.float64)
                tv[client] = 0.5 * np.abs(hist / max(hist.sum(), 1) - overall).sum()
        return tv

    def to(self, device: torch.device | str) -> "SyntheticFederatedDataset":
        self.device = torch.device(device)
        self._cache.clear()
        self.test_x, self.test_y = self.test_x.to(self.device), self.test_y.to(self.device)
        return self

    def __getstate__(self) -> Dict[str, object]:
        # Generated client data is a per-process cache; copies (Ray's object store) start without it.
        state = dict(self.__dict__)
        state["_cache"] = OrderedDict()
        return state


def load_synthetic(num_clients: int, seed: int, alpha: float = 1.0, beta: float = 1.0) -> SyntheticFederatedDataset:
    """Synthetic(``alpha``, ``beta``) over ``num_clients`` clients for run seed ``seed``."""
    return SyntheticFederatedDataset(num_clients, seed, alpha, beta)


@register_dataset("synthetic")
class SyntheticDataset(Dataset):
    """FedProx's Synthetic(alpha, beta)."""

    model = "synthetic"
    defaults = dict(rounds=50, local_epochs=1, lr=0.01, clip_norm=10.0, batch_size=32)

    def load(self, config) -> FederatedDataset:
        return load_synthetic(config.clients, config.seed, config.synthetic_alpha, config.synthetic_beta)
