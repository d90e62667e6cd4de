"""EMNIST byclass: idx parsing, orientation, normalisation, partition, and failures in one sentence."""

import os
import time

import numpy as np
import pytest
import torch

from dataset_files import make_emnist_root, write_idx
from hasfl_ray.data import load_dataset
from hasfl_ray.data.emnist import EMNIST_FILES, read_idx
from hasfl_ray.data.images import MIN_CLIENT_SIZE
from hasfl_ray.errors import DataError


def test_read_idx_round_trip_plain_and_gzip(tmp_path):
    import gzip

    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a", array)
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), array)
    (tmp_path / "b.gz").write_bytes(gzip.compress((tmp_path / "a").read_bytes()))
    np.testing.assert_array_equal(read_idx(tmp_path / "b"), array)  # only the .gz exists


def test_tiny_root_is_upright_standardised_and_partitioned(tmp_path):
    train_images, train_labels, test_images, test_labels = make_emnist_root(tmp_path)
    ds = load_dataset("emnist", 4, 1.0, 0, data_dir=str(tmp_path))
    assert (ds.name, ds.model, ds.num_classes) == ("emnist", "emnist", 62)
    assert ds.train_size == len(train_labels) and ds.test_size == len(test_labels)
    x, y = next(ds.test_batches(1000))
    assert x.shape == (len(test_labels), 1, 28, 28) and x.dtype == torch.float32
    np.testing.assert_array_equal(y.numpy(), test_labels)
    # The stored files are transposed; the loader must give back the upright image (bright pixel at row 2, col 20).
    flat = x[:, 0].reshape(len(x), -1).argmax(dim=1)
    assert set(flat.tolist()) == {2 * 28 + 20}
    # Standardised with the training split's mean and std.
    pixels = torch.from_numpy(train_images).float() / 255
    mean, std = pixels.mean(), pixels.std()
    expected = (torch.from_numpy(test_images[:, None]).float() / 255 - mean) / std
    torch.testing.assert_close(x, expected, atol=1e-4, rtol=1e-4)
    # Client batches index the partition; every client holds at least MIN_CLIENT_SIZE samples.
    seen = []
    for client in range(ds.num_clients):
        n = ds.client_size(client)
        assert n >= MIN_CLIENT_SIZE
        xb, yb = ds.client_batch(client, torch.arange(n))
        assert xb.shape == (n, 1, 28, 28) and yb.dtype == torch.int64
        seen.append(ds.client_indices[client])
    assert sorted(torch.cat(seen).tolist()) == list(range(len(train_labels)))
    assert ds.label_histograms().sum() == len(train_labels)


def test_nothing_is_written_under_the_data_dir(tmp_path):
    make_emnist_root(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    load_dataset("emnist", 4, 1.0, 0, data_dir=str(tmp_path))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_missing_files_name_the_files_and_flags(tmp_path):
    with pytest.raises(DataError) as caught:
        load_dataset("emnist", 4, 0.3, 0, data_dir=str(tmp_path))
    message = str(caught.value)
    assert "\n" not in message
    assert str(tmp_path / "EMNIST" / "raw") in message
    assert EMNIST_FILES["train_images"] in message and "--data-dir" in message and "--download" in message


def test_truncated_and_corrupt_idx(tmp_path):
    make_emnist_root(tmp_path)
    images = tmp_path / "EMNIST" / "raw" / EMNIST_FILES["train_images"]
    whole = images.read_bytes()
    images.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(DataError, match="is truncated: its header announces") as caught:
        load_dataset("emnist", 4, 1.0, 0, data_dir=str(tmp_path))
    assert str(images) in str(caught.value) and "\n" not in str(caught.value)
    images.write_bytes(whole[:10])
    with pytest.raises(DataError, match="ends inside its 16-byte header"):
        load_dataset("emnist", 4, 1.0, 0, data_dir=str(tmp_path))
    images.write_bytes(b"PK\x03\x04" + whole[4:])
    with pytest.raises(DataError, match="bad magic number"):
        load_dataset("emnist", 4, 1.0, 0, data_dir=str(tmp_path))
    images.write_bytes(whole + b"\0")
    with pytest.raises(DataError, match="is corrupt"):
        load_dataset("emnist", 4, 1.0, 0, data_dir=str(tmp_path))


def test_download_offline_fails_in_one_sentence(tmp_path, offline):
    with pytest.raises(DataError) as caught:
        load_dataset("emnist", 4, 0.3, 0, data_dir=str(tmp_path), download=True)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("downloading EMNIST from https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip")
    assert "--data-dir" in message and offline


def test_no_download_without_the_flag(tmp_path, offline):
    with pytest.raises(DataError, match="not found"):
        load_dataset("emnist", 4, 0.3, 0, data_dir=str(tmp_path))
    assert offline == []


def test_shared_sample_matches_torchvision_transposed_and_loads_fast(shared_data):
    root = os.path.join(shared_data, "torchvision")
    start = time.perf_counter()
    ds = load_dataset("emnist", 20, 0.3, 42, data_dir=root)
    assert time.perf_counter() - start < 10
    assert (ds.num_classes, ds.train_size, ds.test_size, ds.num_clients) == (62, 16129, 3420, 20)
    assert min(ds.client_size(i) for i in range(20)) >= MIN_CLIENT_SIZE
    assert (ds.label_histograms().sum(axis=0) > 0).sum() == 62
    from torchvision.datasets import EMNIST

    reference = EMNIST(root, split="byclass", train=False, download=False)
    assert torch.equal(ds.test_x[:, 0], reference.data.transpose(1, 2))
    assert torch.equal(ds.test_y, reference.targets)
    # Upright: the mean 'L' (label 21) has its stroke on the left and bottom, the mean '7' its bar on top.
    images = ds.train_x[:, 0].float()
    letter_l = images[ds.train_y == 21].mean(0)
    assert letter_l[:, 4:10].sum() > letter_l[:, 18:24].sum() and letter_l[18:24].sum() > letter_l[4:10].sum()
    seven = images[ds.train_y == 7].mean(0)
    assert seven[4:10].sum() > seven[18:24].sum()
    # The whole training split is standardised to mean 0, std 1.
    everything = torch.cat([ds.client_batch(i, torch.arange(ds.client_size(i)))[0] for i in range(20)])
    assert abs(float(everything.mean())) < 1e-3 and abs(float(everything.std()) - 1) < 1e-3
