"""A dataset plug-in: a CSV of feature columns and a last ``label`` column (examples/my_dataset.csv, or
``--data-dir`` naming another such file), split over the clients with Dirichlet label skew.

    hasfl-ray simulate --dataset examples/my_dataset.py:MyDataset --algorithm heterofl
"""

import os

import numpy as np
import torch

from hasfl_ray import Dataset, TensorFederatedDataset
from hasfl_ray.data import dirichlet_partition
from hasfl_ray.errors import DataError

CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "my_dataset.csv")


class MyDataset(Dataset):
    # the model it trains: a new MLP (hidden widths slice like the built-in models)
    model = "csv-mlp"
    model_config = dict(kind="mlp", in_features=4, num_classes=3, hidden=(32, 32))
    # protocol defaults for the config fields left unset
    defaults = dict(rounds=20, local_epochs=1, lr=0.05, clip_norm=10.0, batch_size=16)

    def data_files(self, config):
        # the files load() reads: hashed into config.yaml, so --resume and a sweep's reuse notice an edit
        return [config.data_dir or CSV]

    def load(self, config):
        path = config.data_dir or CSV
        try:
            table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32, ndmin=2)
        except (OSError, ValueError) as error:
            raise DataError(f"CSV file {path!r} cannot be read ({error}); expected numbers with a header line")
        x, y = torch.from_numpy(table[:, :-1]), torch.from_numpy(table[:, -1].astype(np.int64))
        x = (x - x.mean(0)) / x.std(0)
        order = np.random.default_rng(0).permutation(len(y))  # fixed 80/20 train/test split
        test, train = order[: len(y) // 5], np.sort(order[len(y) // 5:])
        # TV ground truth: clients.csv's tv_distance comes from these labels (label_histograms)
        parts = dirichlet_partition(y[train].numpy(), config.clients, config.alpha,
                                    np.random.default_rng(config.seed), min_size=4)
        return TensorFederatedDataset("my-dataset", self.model, 3, x[train], y[train], x[test], y[test],
                                      [torch.from_numpy(p) for p in parts])
