"""CIFAR-100 (issue 44 item 3): torchvision's cifar-100-python ``train``/``test`` read directly with CIFAR-10's
restricted unpickler, fine labels, every failure in one sentence; on tiny files written here in the official format,
and on the real sample in ../shared/data where it is present."""

import os
import pickle

import numpy as np
import pytest
import torch

from dataset_files import make_cifar100_root
from hasfl_ray.data import load_dataset
from hasfl_ray.data.cifar10 import read_batch
from hasfl_ray.data.cifar100 import REFERENCE_MEAN, REFERENCE_STD
from hasfl_ray.data.images import channel_statistics
from hasfl_ray.errors import DataError


@pytest.mark.parametrize("numpy1_names, bytes_keys", [(False, False), (True, True)])
def test_tiny_files_both_pickle_dialects(tmp_path, numpy1_names, bytes_keys):
    written = make_cifar100_root(tmp_path, numpy1_names=numpy1_names, bytes_keys=bytes_keys)
    key = (lambda s: s.encode()) if bytes_keys else str
    ds = load_dataset("cifar100", 3, 1.0, 0, data_dir=str(tmp_path))
    assert (ds.name, ds.model, ds.num_classes, ds.train_size, ds.test_size) == ("cifar100", "cifar100", 100, 200, 100)
    # The fine labels, not the coarse ones; rows are the R, G, B planes of a 32x32 image, row-major.
    assert ds.train_y.tolist() == written["train"][key("fine_labels")]
    assert ds.test_y.tolist() == written["test"][key("fine_labels")]
    raw = written["test"][key("data")]
    np.testing.assert_array_equal(ds.test_x[:, 2].numpy(), raw[:, 2048:].reshape(-1, 32, 32))
    assert ds.label_histograms().sum(axis=0).tolist() == [2] * 100
    train = torch.cat([ds.client_batch(i, torch.arange(ds.client_size(i)))[0] for i in range(3)])
    # Standardised per channel with the loaded training split's statistics, as CIFAR-10 is.
    assert train.dtype == torch.float32 and train.shape == (200, 3, 32, 32)
    assert torch.allclose(train.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)
    assert torch.allclose(train.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-3)


def test_no_meta_needed_and_no_md5_checked(tmp_path):
    make_cifar100_root(tmp_path)
    (tmp_path / "cifar-100-python" / "meta").unlink()  # the class names are never read
    assert load_dataset("cifar100", 4, 0.5, 1, data_dir=str(tmp_path)).num_classes == 100


def test_malicious_pickle_is_refused_unexecuted(tmp_path):
    make_cifar100_root(tmp_path)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    target = tmp_path / "cifar-100-python" / "train"
    target.write_bytes(pickle.dumps({"data": Exploit(), "fine_labels": []}, protocol=2))
    with pytest.raises(DataError) as caught:
        load_dataset("cifar100", 3, 1.0, 0, data_dir=str(tmp_path))
    message = str(caught.value)
    assert not marker.exists()
    assert str(target) in message and "refused unexecuted" in message and "a CIFAR-100 file never needs" in message
    assert "\n" not in message


IMAGES = np.zeros((2, 3072), np.uint8)


@pytest.mark.parametrize("payload, needle", [
    (lambda whole: whole[:len(whole) // 2], "is corrupt or truncated"),
    (lambda whole: b"garbage" * 10, "is corrupt or truncated"),
    (lambda whole: pickle.dumps([1, 2, 3], protocol=2), "is not a CIFAR-100 file: its data is a NoneType"),
    (lambda whole: pickle.dumps({"data": np.zeros((2, 5), np.uint8), "fine_labels": [0, 1]}),
     "its data is a uint8 array of shape (2, 5), expected uint8 N x 3072"),
    (lambda whole: pickle.dumps({"data": IMAGES.astype(np.float32), "fine_labels": [0, 1]}),
     "its data is a float32 array of shape (2, 3072)"),
    (lambda whole: pickle.dumps({"data": IMAGES, "fine_labels": [0, 100]}), "its fine_labels include 100, outside 0..99"),
    (lambda whole: pickle.dumps({"data": IMAGES, "fine_labels": [-1, 3]}), "its fine_labels include -1, outside 0..99"),
    (lambda whole: pickle.dumps({"data": IMAGES, "fine_labels": [0, 1, 2]}), "3 fine_labels for 2 images"),
    (lambda whole: pickle.dumps({"data": IMAGES, "fine_labels": ["a", "b"]}), "its fine_labels are not integers"),
    # a CIFAR-10 batch (labels) where CIFAR-100's file (fine_labels) belongs
    (lambda whole: pickle.dumps({"data": IMAGES, "labels": [0, 1]}), "it holds no fine_labels"),
    # zero images, as Python 3 pickles them at protocol 2 (bytes()): not "may be malicious"
    (lambda whole: pickle.dumps({"data": IMAGES[:0], "fine_labels": []}, protocol=2),
     "holds no images (its data is 0 x 3072); expected a CIFAR-100 file with at least one image"),
])
@pytest.mark.parametrize("split", ["train", "test"])
def test_damaged_files_in_one_sentence(tmp_path, payload, needle, split):
    make_cifar100_root(tmp_path)
    target = tmp_path / "cifar-100-python" / split
    target.write_bytes(payload(target.read_bytes()))
    with pytest.raises(DataError) as caught:
        load_dataset("cifar100", 3, 1.0, 0, data_dir=str(tmp_path))
    message = str(caught.value)
    assert needle in message and str(target) in message and "\n" not in message
    assert "--data-dir" in message and "--download" in message


@pytest.mark.parametrize("removed, shown", [(("test",), "(test)"), (("train", "test"), "(train and 1 more)")])
def test_missing_files_name_files_and_flags(tmp_path, removed, shown):
    make_cifar100_root(tmp_path)
    for name in removed:
        (tmp_path / "cifar-100-python" / name).unlink()
    with pytest.raises(DataError) as caught:
        load_dataset("cifar100", 3, 1.0, 0, data_dir=str(tmp_path))
    message = str(caught.value)
    assert message.startswith(f"CIFAR-100 files not found under {tmp_path / 'cifar-100-python'} {shown}")
    assert "--data-dir" in message and "--download" in message and "\n" not in message


def test_download_offline_fails_in_one_sentence(tmp_path, offline):
    with pytest.raises(DataError) as caught:
        load_dataset("cifar100", 3, 0.3, 0, data_dir=str(tmp_path), download=True)
    message = str(caught.value)
    assert message.startswith("downloading CIFAR-100 from https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz")
    assert "--data-dir" in message and "\n" not in message and offline


def test_the_cifar10_reader_is_unchanged_for_its_batches(tmp_path):
    # read_batch's defaults stay CIFAR-10's: labels, 10 classes, "CIFAR-10 batch" in its sentences
    path = tmp_path / "batch"
    path.write_bytes(pickle.dumps({"data": IMAGES, "labels": [0, 10]}, protocol=2))
    with pytest.raises(DataError, match=r"is not a CIFAR-10 batch: its labels include 10, outside 0\.\.9"):
        read_batch(path)
    path.write_bytes(pickle.dumps({"data": IMAGES, "fine_labels": [0, 10]}, protocol=2))
    assert read_batch(path, "fine_labels", 100, "CIFAR-100 file")[1].tolist() == [0, 10]


def test_shared_sample(shared_data):
    root = os.path.join(shared_data, "torchvision")
    ds = load_dataset("cifar100", 10, 0.3, 42, data_dir=root)
    assert (ds.num_classes, ds.train_size, ds.test_size) == (100, 1000, 400)
    assert ds.label_histograms().sum(axis=0).tolist() == [10] * 100
    assert min(ds.client_size(i) for i in range(10)) >= 10
    # The same pixels and fine labels a plain (trusted) unpickling of the sample gives.
    with open(os.path.join(root, "cifar-100-python", "test"), "rb") as handle:
        reference = pickle.load(handle, encoding="latin1")
    assert torch.equal(ds.test_x, torch.from_numpy(reference["data"].reshape(-1, 3, 32, 32)))
    assert ds.test_y.tolist() == list(reference["fine_labels"])
    # The statistics the sample is standardised with lie near the full training split's (R, G, B read in order).
    mean, std = channel_statistics(ds.train_x.numpy())
    assert np.allclose(mean, REFERENCE_MEAN, atol=0.02) and np.allclose(std, REFERENCE_STD, atol=0.02)
    assert not np.allclose(mean[::-1], REFERENCE_MEAN, atol=0.02)
