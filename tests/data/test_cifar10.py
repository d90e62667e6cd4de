"""CIFAR-10: pickled batches through the restricted unpickler, with every failure in one sentence."""

import os
import pickle

import numpy as np
import pytest
import torch

from dataset_files import make_cifar_root
from hasfl_ray.data import load_dataset
from hasfl_ray.data.cifar10 import TEST_BATCH, read_batch
from hasfl_ray.errors import DataError


@pytest.mark.parametrize("numpy1_names, bytes_keys", [(False, False), (True, True)])
def test_tiny_batches_both_pickle_dialects(tmp_path, numpy1_names, bytes_keys):
    batches = make_cifar_root(tmp_path, per_batch=30, numpy1_names=numpy1_names, bytes_keys=bytes_keys)
    key = (lambda s: s.encode()) if bytes_keys else str
    ds = load_dataset("cifar10", 3, 1.0, 0, data_dir=str(tmp_path))
    assert (ds.name, ds.model, ds.num_classes, ds.train_size, ds.test_size) == ("cifar10", "cifar10", 10, 150, 30)
    # Rows are R, G, B planes of a 32x32 image, row-major.
    images, labels = read_batch(tmp_path / "cifar-10-batches-py" / TEST_BATCH)
    raw = batches[TEST_BATCH][key("data")]
    assert images.shape == (30, 3, 32, 32)
    np.testing.assert_array_equal(images[:, 1], raw[:, 1024:2048].reshape(30, 32, 32))
    np.testing.assert_array_equal(labels, batches[TEST_BATCH][key("labels")])
    x, y = next(ds.test_batches(100))
    assert x.dtype == torch.float32 and x.shape == (30, 3, 32, 32)
    train = torch.cat([ds.client_batch(i, torch.arange(ds.client_size(i)))[0] for i in range(3)])
    # Standardised per channel with the training split's statistics.
    assert torch.allclose(train.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)
    assert torch.allclose(train.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-3)


def test_malicious_pickle_is_refused_unexecuted(tmp_path):
    make_cifar_root(tmp_path)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    target = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    target.write_bytes(pickle.dumps({"data": Exploit(), "labels": []}, protocol=2))
    with pytest.raises(DataError) as caught:
        load_dataset("cifar10", 3, 1.0, 0, data_dir=str(tmp_path))
    message = str(caught.value)
    assert not marker.exists()
    assert str(target) in message and "refused unexecuted" in message and "system" in message
    assert "\n" not in message


@pytest.mark.parametrize("payload, needle", [
    (lambda whole: whole[:len(whole) // 2], "is corrupt or truncated"),
    (lambda whole: b"garbage" * 10, "is corrupt or truncated"),
    (lambda whole: pickle.dumps([1, 2, 3], protocol=2), "is not a CIFAR-10 batch"),
    (lambda whole: pickle.dumps({"data": np.zeros((2, 5), np.uint8), "labels": [0, 1]}), "is not a CIFAR-10 batch"),
    (lambda whole: pickle.dumps({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 11]}), "outside 0..9"),
])
def test_damaged_batches_in_one_sentence(tmp_path, payload, needle):
    make_cifar_root(tmp_path)
    target = tmp_path / "cifar-10-batches-py" / "data_batch_2"
    target.write_bytes(payload(target.read_bytes()))
    with pytest.raises(DataError, match=needle) as caught:
        load_dataset("cifar10", 3, 1.0, 0, data_dir=str(tmp_path))
    assert str(target) in str(caught.value) and "\n" not in str(caught.value)


def test_missing_batches_name_files_and_flags(tmp_path):
    make_cifar_root(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(DataError) as caught:
        load_dataset("cifar10", 3, 1.0, 0, data_dir=str(tmp_path))
    message = str(caught.value)
    assert "(test_batch)" in message and "--data-dir" in message and "--download" in message
    assert "\n" not in message


def test_download_offline_fails_in_one_sentence(tmp_path, offline):
    with pytest.raises(DataError) as caught:
        load_dataset("cifar10", 3, 0.3, 0, data_dir=str(tmp_path), download=True)
    message = str(caught.value)
    assert message.startswith("downloading CIFAR-10 from https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz")
    assert "--data-dir" in message and "\n" not in message and offline


def test_shared_sample(shared_data):
    root = os.path.join(shared_data, "torchvision")
    ds = load_dataset("cifar10", 20, 0.3, 42, data_dir=root)
    assert (ds.num_classes, ds.train_size, ds.test_size) == (10, 500, 200)
    assert ds.label_histograms().sum(axis=0).tolist() == [50] * 10
    assert min(ds.client_size(i) for i in range(20)) >= 10
    # The same pixels a plain (trusted) unpickling of the sample gives.
    with open(os.path.join(root, "cifar-10-batches-py", "test_batch"), "rb") as handle:
        reference = pickle.load(handle, encoding="latin1")
    assert torch.equal(ds.test_x, torch.from_numpy(reference["data"].reshape(-1, 3, 32, 32)))
    assert ds.test_y.tolist() == list(reference["labels"])


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("name", ["data_batch_3", "test_batch"])
def test_a_batch_of_zero_images_names_the_file_and_says_so(tmp_path, protocol, name):
    # Protocol 2 pickles the empty array's bytes as bytes() (refused as "may be malicious" before), protocol 4
    # as an ordinary array (accepted before, a training batch silently dropped), protocol 5 with _frombuffer.
    make_cifar_root(tmp_path)
    target = tmp_path / "cifar-10-batches-py" / name
    empty = {"batch_label": "training batch", "data": np.zeros((0, 3072), np.uint8), "labels": []}
    target.write_bytes(pickle.dumps(empty, protocol=protocol))
    with pytest.raises(DataError) as caught:
        load_dataset("cifar10", 3, 1.0, 0, data_dir=str(tmp_path))
    message = str(caught.value)
    assert message.startswith(f"{target} holds no images") and "malicious" not in message and "\n" not in message


def test_protocol_5_batches_load_as_protocol_2_ones(tmp_path):
    batches = make_cifar_root(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    reference = load_dataset("cifar10", 3, 1.0, 0, data_dir=str(tmp_path))
    for name, batch in batches.items():
        (folder / name).write_bytes(pickle.dumps(batch, protocol=5))
    again = load_dataset("cifar10", 3, 1.0, 0, data_dir=str(tmp_path))
    assert torch.equal(reference.test_x, again.test_x) and reference.train_size == again.train_size


def test_bytes_with_arguments_is_not_run(tmp_path):
    make_cifar_root(tmp_path)
    target = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    target.write_bytes(b"\x80\x02c__builtin__\nbytes\nJ\x00\xca\x9a;\x85R.")  # bytes(10**9)
    with pytest.raises(DataError, match="is corrupt or truncated") as caught:
        load_dataset("cifar10", 3, 1.0, 0, data_dir=str(tmp_path))
    assert str(target) in str(caught.value)
