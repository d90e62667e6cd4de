"""CIFAR-100 in use (issue 44 item 3): every label partition on 100 classes (and the ones 100 classes rule out, in
one sentence), `data inspect`, the ResNets' and the CNN's 100-class heads, `cost --dataset cifar100`, and a run of
the CLI, on tiny files written here in the official format and on the real sample in ../shared/data."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from dataset_files import make_cifar100_root
from hasfl_ray.cli.main import main
from hasfl_ray.config import RunConfig
from hasfl_ray.data import load_dataset
from hasfl_ray.engine.checkpoint import load_checkpoint
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model, cost_table, resnet_cost_table
from hasfl_ray.models.choice import model_dataset


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_sentence(result, *words):
    message = result.output.strip()
    assert result.exit_code == 2, (result.exit_code, message, result.exception)
    assert message.startswith("Error: ") and len(message.splitlines()) == 1 and "Traceback" not in message, message
    for word in words:
        assert word in message, (word, message)


@pytest.fixture
def root(tmp_path):
    """200 training images (2 a class) and 100 test images (1 a class)."""
    make_cifar100_root(tmp_path / "data")
    return tmp_path / "data"


def held(ds):
    """Every client's training indices, checked to be disjoint."""
    parts = [ds.client_indices[i].numpy() for i in range(ds.num_clients)]
    everything = np.concatenate(parts)
    assert len(np.unique(everything)) == len(everything)
    return parts


def classes_of(ds, part):
    return set(ds.train_y[part].tolist())


def test_dirichlet_and_iid_use_every_sample(root):
    for partition, clients in (("dirichlet", 5), ("iid", 7)):
        ds = load_dataset("cifar100", clients, 0.3, 42, str(root), partition=partition)
        parts = held(ds)
        assert sum(map(len, parts)) == 200 and min(map(len, parts)) >= 10
    sizes = [len(p) for p in held(load_dataset("cifar100", 7, 0.3, 42, str(root), partition="iid"))]
    assert max(sizes) - min(sizes) <= 1


def test_balanced_dirichlet_gives_equal_clients(root):
    ds = load_dataset("cifar100", 6, 0.3, 42, str(root), partition="balanced-dirichlet")
    assert [len(p) for p in held(ds)] == [200 // 6] * 6  # the 200 mod 6 left over are held by no one


def test_classes_k_is_the_sources_label_split_on_100_classes(root):
    # HeteroFL's non-IID-K: shard_per_class = K x N / C = 10 x 10 / 100 = 1, so every class goes to one client
    ds = load_dataset("cifar100", 10, 0.3, 42, str(root), partition="classes:10")
    parts = held(ds)
    assert all(classes_of(ds, p) == set(labels) and len(labels) <= 10 for p, labels in zip(parts, ds.label_split))
    assert sorted(c for labels in ds.label_split for c in labels) == list(range(100))  # no label repeats at 1 shard
    tests = [ds.test_y[ix].tolist() for ix in ds.client_test_indices]
    assert all(set(t) == set(labels) for t, labels in zip(tests, ds.label_split))  # each client's own test shard


def test_classes_even_and_shards(root):
    ds = load_dataset("cifar100", 5, 0.3, 42, str(root), partition="classes-even:20")
    parts = held(ds)
    assert [len(classes_of(ds, p)) for p in parts] == [20] * 5 and sum(map(len, parts)) == 200
    # 50 clients x 2 shards: 100 label-sorted shards of 2 samples, each one class, so a client sees at most 2
    ds = load_dataset("cifar100", 50, 0.3, 42, str(root), partition="shards:2")
    parts = held(ds)
    assert sum(map(len, parts)) == 200 and all(1 <= len(classes_of(ds, p)) <= 2 for p in parts)


@pytest.mark.parametrize("partition, clients, words", [
    ("classes:101", 10, ["partition is 'classes:101' but the training split has 100 classes", "K at most 100"]),
    ("classes-even:101", 10, ["partition is 'classes-even:101' but the training split has 100 classes"]),
    ("classes:3", 10, ["3 x 10 label slots do not divide evenly over the 100 classes", "multiple of 100"]),
    ("classes:20", 10, ["2 shards of each class, but class 0 has 1 test samples; expected at least 2"]),
    ("classes-even:5", 10, ["50 class slots for the 100 classes; expected at least 20 clients"]),
    ("shards:30", 10, ["300 shards of the 200 training samples; expected at most 200 shards"]),
])
def test_partitions_100_classes_rule_out_are_one_sentence(root, partition, clients, words):
    with pytest.raises(ConfigError) as caught:
        load_dataset("cifar100", clients, 0.3, 42, str(root), partition=partition)
    assert all(word in str(caught.value) for word in words) and "\n" not in str(caught.value)
    one_sentence(invoke("data", "inspect", "--dataset", "cifar100", "--data-dir", root, "--clients", clients,
                        "--partition", partition), *words)


def test_data_inspect(root):
    result = invoke("data", "inspect", "--dataset", "cifar100", "--data-dir", root, "--clients", 4, "--alpha", 1)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("cifar100: 100 classes, 200 train and 100 test samples over 4 "
                                                   "clients (seed 42); partition dirichlet")
    assert "width 1 (share 15%) of the default tiers gets 0 of the 4 clients" in result.stderr  # on stderr only
    summary = json.loads(invoke("data", "inspect", "--dataset", "cifar100", "--data-dir", root, "--clients", 10,
                                "--partition", "classes:10", "--json").output)
    assert summary["num_classes"] == 100 and summary["train_size"] == 200
    rows = summary["clients"]
    assert all(len(row["label_histogram"]) == 100 and sum(row["label_histogram"]) == row["num_samples"] for row in rows)
    assert all([c for c, n in enumerate(row["label_histogram"]) if n] == row["label_split"] for row in rows)


def test_data_inspect_bad_input(tmp_path, root):
    (tmp_path / "empty").mkdir()
    one_sentence(invoke("data", "inspect", "--dataset", "cifar100", "--data-dir", tmp_path / "empty"),
                 "CIFAR-100 files not found under", "cifar-100-python (train and 1 more)", "--data-dir", "--download")
    (root / "cifar-100-python" / "test").write_bytes(b"not a pickle")
    one_sentence(invoke("data", "inspect", "--dataset", "cifar100", "--data-dir", root), "test is corrupt or truncated")


@pytest.mark.parametrize("arch", ["preresnet18", "resnet18"])
def test_the_resnets_and_the_cnn_have_100_class_heads(root, arch):
    ds = load_dataset("cifar100", 3, 1.0, 0, str(root))
    x, _ = next(ds.test_batches(2))
    assert build_model(ds.model)(x).shape == (2, 100)  # the dataset's own CNN
    config = RunConfig(dataset="cifar100", model=arch, model_norm="sbn")
    adopted = model_dataset(ds, config, "cifar100")
    network = build_model(adopted.model)
    assert network(x).shape == (2, 100) and adopted.view_keeps_train  # sBN keeps the data
    # one more class costs the head one row: 90 x (512 + 1) parameters over CIFAR-10's at width 1
    assert resnet_cost_table(arch, "cifar100", (1.0,))[0]["params"] == \
        resnet_cost_table(arch, "cifar10", (1.0,))[0]["params"] + 90 * 513
    assert cost_table("cifar100", (1.0,))[0]["params"] == cost_table("cifar10", (1.0,))[0]["params"] + 90 * 513


def test_cost_cli_takes_cifar100():
    rows = json.loads(invoke("cost", "--model", "preresnet18", "--dataset", "cifar100", "--json").output)
    assert [row["p"] for row in rows] == [1.0, 0.5, 0.25, 0.125, 0.0625]
    assert rows == resnet_cost_table("preresnet18", "cifar100")
    assert json.loads(invoke("cost", "--model", "cifar100", "--json").output) == cost_table("cifar100")


def test_a_run_on_tiny_files(tmp_path, root):
    out = tmp_path / "run"
    result = invoke("simulate", "--dataset", "cifar100", "--data-dir", root, "--rounds", 1, "--clients", 4,
                    "--clients-per-round", 2, "--local-epochs", 1, "--eval-widths", 1, "--backend", "local",
                    "--partition", "iid", "--quiet", "--out", out)
    assert result.exit_code == 0, result.output
    params = load_checkpoint(str(out)).params
    head = [name for name in params if params[name].dim() == 2][-1]
    assert params[head].shape[0] == 100
    assert json.loads((out / "summary.json").read_text())["rounds"] == 1


def test_bad_files_stop_a_run_before_its_folder(tmp_path, root):
    (root / "cifar-100-python" / "train").write_bytes(b"")
    out = tmp_path / "run"
    one_sentence(invoke("simulate", "--dataset", "cifar100", "--data-dir", root, "--rounds", 1, "--clients", 3,
                        "--clients-per-round", 2, "--backend", "local", "--quiet", "--out", out), "train", "corrupt")
    assert not out.exists()


def test_preresnet18_on_the_shared_sample(shared_data, tmp_path):
    # issue 44 item 3's end to end: the real sample, preresnet18 (sBN) with its 100-class head, 1 round, 10 clients
    out = tmp_path / "run"
    result = invoke("simulate", "--dataset", "cifar100", "--data-dir", os.path.join(shared_data, "torchvision"),
                    "--model", "preresnet18", "--rounds", 1, "--clients", 10, "--clients-per-round", 2,
                    "--local-epochs", 1, "--eval-widths", 1, "--eval-samples", 100, "--backend", "local", "--quiet",
                    "--out", out)
    assert result.exit_code == 0, result.output
    params = load_checkpoint(str(out)).params
    linear = [name for name in params if params[name].dim() == 2]
    assert [tuple(params[name].shape) for name in linear] == [(100, 512)]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 1 and 0 <= summary["final_accuracy"] <= 1
    assert 0 <= summary["local_accuracy"]["mean"] <= 1  # every client scored on the test samples of its own labels


def test_a_fifo_or_a_file_where_the_data_go_is_refused(tmp_path, root):
    fifo = root / "cifar-100-python" / "train"
    fifo.unlink()
    os.mkfifo(fifo)  # refused before it is opened, not read (which would block) nor reported missing
    one_sentence(invoke("data", "inspect", "--dataset", "cifar100", "--data-dir", root), "train", "is a FIFO")
    (tmp_path / "afile.txt").write_text("x")
    one_sentence(invoke("data", "inspect", "--dataset", "cifar100", "--data-dir", tmp_path / "afile.txt"),
                 "afile.txt", "is a file", "cifar100")
