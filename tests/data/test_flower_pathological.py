"""flwr:pathological:K where K x clients < classes (CIFAR-100, 10 clients, K = 2): Flower's PathologicalPartitioner
deals each client K classes and drops every sample of a class no client holds, 80+ of the 100 classes for every seed.
Refused in one sentence naming the numbers; a draw that leaves classes out by chance (Flower's random rule, kept) is
one warning line naming them, in place of Flower's multi-line UserWarning."""

import logging
import os

import numpy as np
import pytest

pytest.importorskip("datasets", reason="the hub extra (datasets) is not installed: pip install '.[hub]'")
pytest.importorskip("flwr_datasets", reason="the hub extra (flwr-datasets) is not installed: pip install '.[hub]'")

from click.testing import CliRunner  # noqa: E402

from dataset_files import make_cifar100_root  # noqa: E402
from hasfl_ray.cli.main import main  # noqa: E402
from hasfl_ray.data.flower import flwr_partition  # noqa: E402
from hasfl_ray.errors import ConfigError  # noqa: E402


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("clients, k", [(10, 2), (49, 2), (1, 99)])
def test_too_few_class_slots_is_refused_naming_the_numbers(clients, k):
    labels = np.repeat(np.arange(100), 3)
    with pytest.raises(ConfigError) as caught:
        flwr_partition(f"flwr:pathological:{k}", labels, clients, seed=42)
    message = str(caught.value)
    assert f"{clients} clients x {k} classes = {clients * k} slots for 100 classes" in message, message
    assert f"{100 - clients * k}+ classes have no holder" in message and "K x clients >= 100" in message
    assert "\n" not in message and len(message) < 200


def test_cifar100_data_inspect_and_simulate_refuse_it_before_any_folder(tmp_path):
    make_cifar100_root(tmp_path)
    inspect = invoke("data", "inspect", "--dataset", "cifar100", "--data-dir", tmp_path, "--clients", 10,
                     "--partition", "flwr:pathological:2")
    run = invoke("simulate", "--dataset", "cifar100", "--data-dir", tmp_path, "--clients", 10, "--clients-per-round",
                 2, "--rounds", 1, "--backend", "local", "--partition", "flwr:pathological:2", "--out", tmp_path / "run")
    for result in (inspect, run):
        message = result.output.strip()
        assert result.exit_code == 2 and message.startswith("Error: ") and len(message.splitlines()) == 1, message
        assert "10 clients x 2 classes = 20 slots for 100 classes" in message
    assert not os.path.exists(tmp_path / "run")


def test_enough_slots_keep_flowers_split_and_name_any_class_left_out(caplog):
    labels = np.repeat(np.arange(100), 10)
    with caplog.at_level(logging.WARNING, logger="hasfl_ray.data.flower"):
        parts = flwr_partition("flwr:pathological:2", labels, 50, seed=42)
    unheld = np.setdiff1d(np.arange(100), np.unique(labels[np.concatenate(parts)]))
    notes = [r.getMessage() for r in caplog.records if r.name == "hasfl_ray.data.flower"]
    if len(unheld):  # Flower's random rule: some classes by chance (37 at seed 42)
        assert len(notes) == 1 and f"dealt {len(unheld)} of the 100 classes" in notes[0], notes
        assert f"their {10 * len(unheld)} training samples are unused" in notes[0]
    else:
        assert not notes
    assert len(parts) == 50 and all(len(p) for p in parts)


def test_every_class_held_gives_no_note(caplog):
    labels = np.repeat(np.arange(10), 5)
    with caplog.at_level(logging.WARNING, logger="hasfl_ray.data.flower"):
        parts = flwr_partition("flwr:pathological:10", labels, 3, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(50))
    assert not [r for r in caplog.records if r.name == "hasfl_ray.data.flower"]


def test_flowers_other_refusals_say_what_would_work():
    """More shards than samples was "ZeroDivisionError: division by zero; expected settings its partitioner accepts";
    a Dirichlet draw Flower gives up on ended in its message cut mid-word ("Please update t")."""
    labels = np.repeat(np.arange(10), 50)
    with pytest.raises(ConfigError) as caught:
        flwr_partition("flwr:shard:100", labels, 10, seed=42)
    assert str(caught.value) == ("partition 'flwr:shard:100': 10 clients x 100 shards = 1000 shards of 500 training "
                                 "samples; expected S x clients <= 500")
    with pytest.raises(ConfigError) as caught:
        flwr_partition("flwr:dirichlet:1e-09", labels, 10, seed=42)
    message = str(caught.value)
    assert message.endswith("...); expected a larger ALPHA or fewer --clients") and "Please update the" in message
    assert "\n" not in message and len(message) < 250
