"""hf: datasets and flwr: partitions (issue 47 item 2): Flower Datasets' partitioners give exactly Flower's split, the
numpy natural-id grouping gives exactly NaturalIdPartitioner's, and a saved Hugging Face image dataset becomes the
N x C x H x W tensors the image models take. Datasets are built with ``datasets`` and ``save_to_disk`` in tmp_path."""

import numpy as np
import pytest
import torch

pytest.importorskip("datasets", reason="the hub extra (datasets) is not installed: pip install '.[hub]'")
pytest.importorskip("flwr_datasets", reason="the hub extra (flwr-datasets) is not installed: pip install '.[hub]'")

import datasets  # noqa: E402
from flwr_datasets import partitioner as flwr  # noqa: E402

from data.hub_files import WRITERS, write_image_dataset  # noqa: E402
from hasfl_ray.data.flower import flwr_partition, natural_id_partition, require_hub  # noqa: E402
from hasfl_ray.data.hub import load_hub  # noqa: E402
from hasfl_ray.errors import ConfigError, DataError  # noqa: E402
from hasfl_ray.federation import normalise_partition  # noqa: E402


def flower_indices(chosen, labels):
    """Per partition the rows flwr-datasets' own partitioner puts in it, read back from a uid column it carries."""
    chosen.dataset = datasets.Dataset.from_dict({"label": list(map(int, labels)),
                                                 "uid": [f"row{i}" for i in range(len(labels))]})
    return [np.sort([int(uid[3:]) for uid in chosen.load_partition(i)["uid"]]) for i in range(chosen.num_partitions)]


@pytest.mark.parametrize("ids", [
    ["b", "a", "c", "a", "b", "b", "zz", "a10", "a2"],  # strings: sorted as Python sorts them ('a10' < 'a2')
    [7, 3, 3, 11, 7, 0, 11, 11],  # integers
    np.random.default_rng(3).integers(0, 50, size=2000).tolist(),
])
def test_natural_id_grouping_is_natural_id_partitioners_partition(ids):
    ours, distinct = natural_id_partition(ids)
    chosen = flwr.NaturalIdPartitioner(partition_by="writer")
    chosen.dataset = datasets.Dataset.from_dict({"writer": ids})
    assert len(ours) == chosen.num_partitions
    for i, part in enumerate(ours):  # same client order, same rows in the same (ascending) order
        chosen.load_partition(i)  # builds Flower's index table
        assert part.tolist() == list(chosen._partition_id_to_indices[i])
        assert distinct[i] == chosen.partition_id_to_natural_id[i]


@pytest.mark.parametrize("spec, make", [
    ("flwr:iid", lambda n, seed: flwr.IidPartitioner(num_partitions=n)),
    ("flwr:dirichlet:0.5", lambda n, seed: flwr.DirichletPartitioner(n, "label", 0.5, seed=seed)),
    ("flwr:pathological:2", lambda n, seed: flwr.PathologicalPartitioner(n, "label", 2, seed=seed)),
    ("flwr:shard:2", lambda n, seed: flwr.ShardPartitioner(n, "label", num_shards_per_partition=2, seed=seed)),
])
def test_flwr_partitions_are_flowers_own_with_the_run_seed(spec, make):
    labels = np.random.default_rng(0).integers(0, 6, size=600)
    ours = flwr_partition(spec, labels, 8, seed=17)
    assert [p.tolist() for p in ours] == [p.tolist() for p in flower_indices(make(8, 17), labels)]
    if spec != "flwr:iid":  # the seed is the run's: another seed, another split
        other = flwr_partition(spec, labels, 8, seed=18)
        assert [p.tolist() for p in other] != [p.tolist() for p in ours]


def test_flwr_specs_are_normalised_and_bad_ones_refused_in_one_sentence():
    assert normalise_partition(" flwr:dirichlet:0.50") == "flwr:dirichlet:0.5"
    assert normalise_partition("flwr:natural_id:writer") == "flwr:natural_id:writer"
    for bad, word in (("flwr:foo", "flwr:iid"), ("flwr:dirichlet:-1", "above 0"), ("flwr:dirichlet", "ALPHA"),
                      ("flwr:shard:x", "positive integer"), ("flwr:pathological:0", "positive integer"),
                      ("flwr:iid:3", "no parameter")):
        with pytest.raises(ConfigError, match=word) as caught:
            normalise_partition(bad)
        assert "\n" not in str(caught.value)


def test_a_missing_extra_names_it_in_one_sentence(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flwr_datasets" else
                        real(name, *a))
    with pytest.raises(ConfigError, match=r'flwr-datasets package, which is not installed; expected the hub extra: '
                                          r'pip install "\.\[hub\]"'):
        require_hub("partition 'flwr:iid'")


def test_a_saved_image_dataset_becomes_standardised_nchw_tensors(tmp_path):
    path = write_image_dataset(tmp_path / "ds")
    data = load_hub(f"hf:{path}?image=img&label=y", 4, 0.5, 42, "dirichlet")
    assert tuple(data.train_x.shape[1:]) == (3, 12, 12) and data.train_x.dtype == torch.uint8
    assert data.train_size == 192 and data.test_size == 48  # 20 % held out by a fixed permutation
    x, y = data.client_batch(0, torch.arange(data.client_size(0)))
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    everything = torch.cat([data.client_batch(i, torch.arange(data.client_size(i)))[0] for i in range(4)])
    assert everything.mean(dim=(0, 2, 3)).abs().max() < 1e-4  # standardised with the training split's statistics
    assert (everything.std(dim=(0, 2, 3)) - 1).abs().max() < 1e-2
    assert data.model_config["in_channels"] == 3 and data.model_config["image_size"] == 12
    assert data.num_classes == 4


def test_train_and_test_splits_and_natural_clients_by_writer(tmp_path):
    path = write_image_dataset(tmp_path / "ds", splits=True, channels=1)
    data = load_hub(f"hf:{path}?image=img&label=y", len(WRITERS), 0.5, 42, "flwr:natural_id:writer")
    assert data.test_size == 40 and tuple(data.train_x.shape[1:]) == (1, 12, 12)
    assert data.client_names == sorted(WRITERS)  # NaturalIdPartitioner's order: the sorted ids
    writers = np.asarray(datasets.load_from_disk(path)["train"]["writer"])
    for name, rows in zip(data.client_names, data.client_indices):
        assert rows.tolist() == np.flatnonzero(writers == name).tolist()


def test_a_pil_image_column_is_found_without_being_named(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    table = datasets.Dataset.from_dict({"picture": [Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8))
                                                    for _ in range(60)], "label": rng.integers(0, 3, 60).tolist()},
                                       features=datasets.Features({"picture": datasets.Image(),
                                                                   "label": datasets.ClassLabel(num_classes=5)}))
    table.save_to_disk(str(tmp_path / "pil"))
    data = load_hub(f"hf:{tmp_path / 'pil'}", 2, 0.5, 0, "flwr:iid")
    assert tuple(data.train_x.shape[1:]) == (1, 8, 8) and data.num_classes == 5  # ClassLabel's count


@pytest.mark.parametrize("query, partition, clients, words", [
    ("?image=nope&label=y", "dirichlet", 3, ("no column 'nope'", "img, y, writer, caption")),
    ("?image=caption&label=y", "dirichlet", 3, ("holds text",)),
    ("?image=img&label=writer", "dirichlet", 3, ("label column 'writer'",)),
    ("?image=img&label=y", "flwr:natural_id:city", 3, ("no column 'city'",)),
    ("?image=img&label=y", "flwr:natural_id:writer", 3, ("--clients 5",)),
    ("?colour=img", "dirichlet", 3, ("colour='img' is not a column choice",)),
])
def test_bad_columns_are_one_sentence(tmp_path, query, partition, clients, words):
    path = write_image_dataset(tmp_path / "ds")
    with pytest.raises((ConfigError, DataError)) as caught:
        load_hub(f"hf:{path}{query}", clients, 0.5, 0, partition)
    for word in words:
        assert word in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_column_read_at_once_keeps_a_selected_views_rows():
    from hasfl_ray.data.flower import column_array

    table = datasets.Dataset.from_dict({"writer": ["c", "a", "b", "a", "c"], "n": [5, 1, 2, 1, 5]})
    view = table.select([4, 3, 0])  # an indices mapping over the Arrow table
    assert column_array(view, "writer").to_pylist() == ["c", "a", "c"]
    assert column_array(view, "n").tolist() == [5, 1, 5]
    parts, distinct = natural_id_partition(column_array(table, "writer"))
    assert distinct.tolist() == ["a", "b", "c"] and [p.tolist() for p in parts] == [[1, 3], [2], [0, 4]]


def test_ragged_or_non_square_images_are_one_sentence(tmp_path):
    ragged = {"img": [np.zeros((4, 4), np.uint8)] * 30 + [np.zeros((5, 5), np.uint8)] * 30, "label": [0, 1] * 30}
    datasets.Dataset.from_dict(ragged).save_to_disk(str(tmp_path / "ragged"))
    with pytest.raises(DataError, match="differ in shape"):
        load_hub(f"hf:{tmp_path / 'ragged'}", 2, 0.5, 0, "iid")
    wide = {"img": [np.zeros((4, 6), np.uint8)] * 60, "label": [0, 1] * 30}
    datasets.Dataset.from_dict(wide).save_to_disk(str(tmp_path / "wide"))
    with pytest.raises(DataError, match="expected square images"):
        load_hub(f"hf:{tmp_path / 'wide'}", 2, 0.5, 0, "iid")


def write_text_dataset(path, rows=90, words=12):
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(["love", "night", "thou", "art", "fair", "O"], size=words)) + "." for _ in range(rows)]
    who = [("ROMEO", "JULIET", "NURSE")[i % 3] for i in range(rows)]
    datasets.Dataset.from_dict({"line": lines, "character": who, "n": list(range(rows))}).save_to_disk(str(path))
    return lines, who


def test_a_text_column_is_read_character_by_character_one_client_per_author(tmp_path):
    from hasfl_ray.data.base import TextFederatedDataset
    from hasfl_ray.data.shakespeare import SEQ_LEN, decode

    lines, who = write_text_dataset(tmp_path / "txt")
    data = load_hub(f"hf:{tmp_path / 'txt'}?text=line", 3, 0.5, 0, "flwr:natural_id:character")
    assert isinstance(data, TextFederatedDataset) and data.model == "shakespeare"
    assert data.client_names == ["JULIET", "NURSE", "ROMEO"]  # NaturalIdPartitioner's sorted order
    stream = decode(data.stream)
    for client, name in enumerate(data.client_names):
        text = " ".join(line for line, author in zip(lines, who) if author == name)
        x, y = data.client_batch(client, torch.tensor([0]))
        assert text.startswith(decode(x[0])) and decode(y) == text[SEQ_LEN]  # its own text, window by window
        assert text in stream
    assert data.test_size > 0


@pytest.mark.parametrize("partition, rows, words", [
    ("dirichlet", 90, "expected --partition flwr:natural_id:COLUMN"),
    ("flwr:natural_id:character", 3, "characters; expected enough"),
])
def test_text_needs_natural_clients_with_enough_text(tmp_path, partition, rows, words):
    write_text_dataset(tmp_path / "txt", rows=rows)
    with pytest.raises(DataError, match=words):
        load_hub(f"hf:{tmp_path / 'txt'}?text=line", 3, 0.5, 0, partition)
    with pytest.raises(DataError, match="is not text"):
        load_hub(f"hf:{tmp_path / 'txt'}?text=n", 3, 0.5, 0, "flwr:natural_id:character")
