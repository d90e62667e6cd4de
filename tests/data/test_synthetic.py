"""FedProx Synthetic(alpha, beta): seeded, lazily generated, bounded in memory at any number of clients."""

import pickle

import numpy as np
import torch

from hasfl_ray.data import load_dataset
from hasfl_ray.data.synthetic import (MAX_CLIENT_SAMPLES, MIN_CLIENT_SAMPLES, NUM_FEATURES, TEST_SAMPLES,
                                      SyntheticFederatedDataset, client_sizes)
from hasfl_ray.data import synthetic
from hasfl_ray.data.synthetic import load_synthetic
from hasfl_ray.models import build_model


def test_same_seed_same_samples_and_a_new_seed_new_ones():
    a, b = SyntheticFederatedDataset(50, seed=3), SyntheticFederatedDataset(50, seed=3)
    positions = torch.arange(a.client_size(7))
    xa, ya = a.client_batch(7, positions)
    xb, yb = b.client_batch(7, positions)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert xa.shape == (a.client_size(7), NUM_FEATURES) and xa.dtype == torch.float32 and ya.dtype == torch.int64
    xc, _ = SyntheticFederatedDataset(50, seed=4).client_batch(7, torch.arange(10))
    assert not torch.equal(xa[:10], xc)


def test_a_client_does_not_depend_on_how_many_clients_there_are():
    small, large = SyntheticFederatedDataset(20, seed=1), SyntheticFederatedDataset(2000, seed=1)
    x_small, y_small = small.client_batch(5, torch.arange(small.client_size(5)))
    x_large, y_large = large.client_batch(5, torch.arange(large.client_size(5)))
    assert small.client_size(5) == large.client_size(5)
    assert torch.equal(x_small, x_large) and torch.equal(y_small, y_large)


def test_sizes_follow_the_clipped_lognormal():
    sizes = client_sizes(10_000, seed=0)
    assert sizes.dtype == np.int64 and sizes.min() >= MIN_CLIENT_SAMPLES and sizes.max() <= MAX_CLIENT_SAMPLES
    assert 100 < np.median(sizes) < 110  # exp(4) + 50 = 104.6
    assert (sizes == MAX_CLIENT_SAMPLES).mean() < 0.02


def test_test_set_is_bounded_and_pickles_small_for_many_clients():
    dataset = SyntheticFederatedDataset(10_000, seed=0)
    assert TEST_SAMPLES <= dataset.test_size < TEST_SAMPLES + 200
    dataset.client_batch(0, torch.arange(5))  # fills the per-process cache, which must not be shipped
    assert len(pickle.dumps(dataset)) < 1_500_000
    assert sum(b[1].numel() for b in dataset.test_batches(512)) == dataset.test_size


def test_alpha_beta_zero_is_valid_and_beta_moves_the_inputs():
    # Like FedProx's Synthetic(0, 0), every client keeps its own labeller: labels stay non-IID.
    tv = SyntheticFederatedDataset(30, seed=2, alpha=0.0, beta=0.0).tv_distances()
    assert np.isfinite(tv).all() and ((tv > 0) & (tv <= 1)).all()
    def data(alpha, beta):
        dataset = SyntheticFederatedDataset(30, seed=2, alpha=alpha, beta=beta)
        return torch.cat([torch.cat([x, y[:, None].float()], 1) for x, y in
                          (dataset.client_batch(i, torch.arange(50)) for i in range(30))])

    reference = data(1.0, 1.0)
    assert not torch.equal(reference, data(1.0, 0.5))  # beta moves the inputs
    # alpha's shift u_k is common to every class and cancels in the argmax, as in FedProx's generator
    assert torch.equal(reference, data(0.5, 1.0))


def test_histograms_match_the_generated_labels_and_the_mlp_fits_the_inputs():
    dataset = load_dataset("synthetic", 12, alpha=0.3, seed=5, synthetic_alpha=0.5, synthetic_beta=0.5)
    hist = dataset.label_histograms()
    assert hist.shape == (12, 10) and (hist.sum(axis=1) == dataset.sizes).all()
    _, y = dataset.client_batch(3, torch.arange(dataset.client_size(3)))
    assert (np.bincount(y.numpy(), minlength=10) == hist[3]).all()
    x, _ = next(dataset.test_batches(8))
    assert build_model(dataset.model, 0.5)(x).shape == (8, 10)


def test_batched_training_generates_each_clients_data_once(monkeypatch):
    """Batched training takes a batch from every client of a group at each step: the generated-data cache holds a
    whole group, so a client's samples are generated once per round, not once per step."""
    from hasfl_ray.training.batched import MAX_GROUP
    from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer

    dataset = load_synthetic(40, seed=3)
    generated = []
    original = dataset._samples
    monkeypatch.setattr(dataset, "_samples", lambda client, stream, count: generated.append(client)
                        or original(client, stream, count))
    trainer = Trainer(dataset, "synthetic", OptimizerSettings(batch_size=16))
    tasks = [ClientTask(client, 0, 1.0, 0.01, 3) for client in range(12)]
    trainer.train_group(tasks, build_model("synthetic").state_dict())
    assert sorted(generated) == list(range(12))
    assert synthetic.CACHED_CLIENTS >= MAX_GROUP
