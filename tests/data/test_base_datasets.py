"""The tensor and text dataset implementations: per-batch standardisation, lazy windows, devices."""

import numpy as np
import pytest
import torch

from hasfl_ray.data import TensorFederatedDataset, TextFederatedDataset

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def uint8_dataset():
    generator = torch.Generator().manual_seed(0)
    train_x = torch.randint(0, 256, (40, 3, 4, 4), dtype=torch.uint8, generator=generator)
    test_x = torch.randint(0, 256, (7, 3, 4, 4), dtype=torch.uint8, generator=generator)
    train_y, test_y = torch.arange(40) % 5, torch.arange(7) % 5
    return TensorFederatedDataset("t", "t", 5, train_x, train_y, test_x, test_y,
                                  [torch.arange(0, 25), torch.arange(25, 40)], mean=(0.1, 0.5, 0.9),
                                  std=(0.2, 0.3, 0.4))


@pytest.mark.parametrize("device", DEVICES)
def test_uint8_inputs_are_standardised_per_channel(device):
    ds = uint8_dataset()
    raw = ds.train_x[25:30].float() / 255
    ds.to(device)
    x, y = ds.client_batch(1, torch.arange(5))
    mean = torch.tensor([0.1, 0.5, 0.9]).view(1, 3, 1, 1)
    std = torch.tensor([0.2, 0.3, 0.4]).view(1, 3, 1, 1)
    assert x.device.type == device and x.dtype == torch.float32
    torch.testing.assert_close(x.cpu(), (raw - mean) / std)
    assert y.tolist() == [0, 1, 2, 3, 4]
    assert ds.label_histograms().tolist() == [[5, 5, 5, 5, 5], [3, 3, 3, 3, 3]]
    assert sum(len(yb) for _, yb in ds.test_batches(3)) == 7


def text_dataset():
    stream = torch.arange(200, dtype=torch.uint8) % 95
    return TextFederatedDataset("s", "shakespeare", 95, stream, [torch.arange(0, 50), torch.arange(100, 110)],
                                torch.arange(60, 90), ["a", "b"], seq_len=80)


@pytest.mark.parametrize("device", DEVICES)
def test_text_windows_are_gathered_on_demand(device):
    ds = text_dataset().to(device)
    x, y = ds.client_batch(1, torch.tensor([0, 9]))
    assert x.device.type == device and x.shape == (2, 80) and x.dtype == torch.int64
    assert x[0].cpu().tolist() == [v % 95 for v in range(100, 180)] and int(y[0]) == 180 % 95
    assert int(y[1]) == 189 % 95
    assert ds.test_size == 30 and sum(len(yb) for _, yb in ds.test_batches(8)) == 30
    histogram = ds.label_histograms()
    assert histogram.shape == (2, 95) and histogram.sum(axis=1).tolist() == [50, 10]
    assert np.all(ds.tv_distances() >= 0)


def test_text_window_starts_are_validated():
    with pytest.raises(ValueError, match="window starts must lie in"):
        TextFederatedDataset("s", "shakespeare", 95, torch.zeros(100, dtype=torch.uint8), [torch.tensor([20])],
                             torch.tensor([0]), ["a"], seq_len=80)


def test_digits_are_read_without_importing_scikit_learn_and_equal_its_loader():
    """The embedded digits come straight from the CSV scikit-learn ships (no sklearn import at start-up: issue 29),
    value for value what ``sklearn.datasets.load_digits`` gives."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from hasfl_ray.data.digits import digits_arrays

    pixels, labels = digits_arrays()
    bunch = load_digits()
    assert np.array_equal(pixels, bunch.data) and pixels.dtype == bunch.data.dtype
    assert np.array_equal(labels, bunch.target)
    probe = ("import sys; from hasfl_ray.data.digits import load_digits_federated; "
             "load_digits_federated(4, 0.3, 0); print('sklearn' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
