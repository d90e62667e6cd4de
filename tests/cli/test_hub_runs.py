"""--dataset hf:... and --partition flwr:... at the command line (issue 47 item 2): a run end to end with each Flower
partitioner on a dataset saved by ``datasets``' save_to_disk, ``data inspect`` showing the split, and bad input
refused in one sentence with exit status 2."""

import json
import os

import pytest

pytest.importorskip("datasets", reason="the hub extra (datasets) is not installed: pip install '.[hub]'")
pytest.importorskip("flwr_datasets", reason="the hub extra (flwr-datasets) is not installed: pip install '.[hub]'")

from data.hub_files import WRITERS, write_image_dataset  # noqa: E402
from sentences import invoke, refused  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return write_image_dataset(tmp_path_factory.mktemp("hub") / "ds")


def spec(path):
    return f"hf:{path}?image=img&label=y"


@pytest.mark.parametrize("partition, clients", [
    ("flwr:iid", 4), ("flwr:dirichlet:1.0", 4), ("flwr:pathological:2", 4), ("flwr:shard:2", 4),
    ("flwr:natural_id:writer", len(WRITERS)), ("dirichlet", 4),
])
def test_a_run_with_each_flower_partitioner(saved, tmp_path, partition, clients):
    out = tmp_path / "run"
    result = invoke("simulate", "--dataset", spec(saved), "--partition", partition, "--clients", clients,
                    "--clients-per-round", 2, "--rounds", 1, "--backend", "local", "--out", out)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 1 and 0 <= summary["final_accuracy"] <= 1
    rows = (out / "clients.csv").read_text().splitlines()
    assert len(rows) == 1 + clients
    config = (out / "config.yaml").read_text()
    assert f"partition: {partition.replace(':1.0', ':1')}" in config  # (written as normalised)
    assert "dataset data" in config  # the saved folder is hashed into input_sha256
    if partition.startswith("flwr:natural_id"):
        names = [row.split(",")[rows[0].split(",").index("name")] for row in rows[1:]]
        assert names == sorted(WRITERS)


def test_data_inspect_shows_the_flower_split(saved):
    result = invoke("data", "inspect", "--dataset", spec(saved), "--partition", "flwr:natural_id:writer",
                    "--clients", len(WRITERS), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["partition"] == "flwr:natural_id:writer"
    assert "NaturalIdPartitioner on column 'writer'" in summary["partition_rule"]
    assert [row["name"] for row in summary["clients"]] == sorted(WRITERS)
    assert sum(row["num_samples"] for row in summary["clients"]) == summary["train_size"]
    text = invoke("data", "inspect", "--dataset", spec(saved), "--partition", "flwr:dirichlet:0.5", "--clients", 3)
    assert text.exit_code == 0 and "Flower Datasets' DirichletPartitioner (alpha 0.5" in text.output


def test_a_flower_partitioner_on_a_built_in_image_set(tmp_path):
    result = invoke("data", "inspect", "--partition", "flwr:shard:2", "--clients", 5, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["partition"] == "flwr:shard:2" and len(summary["clients"]) == 5


@pytest.mark.parametrize("args, words", [
    (("--partition", "flwr:foo"), ("partition is 'flwr:foo'", "flwr:dirichlet:ALPHA")),
    (("--partition", "flwr:dirichlet:-2"), ("flwr:dirichlet:-2", "above 0")),
    (("--partition", "flwr:shard:two"), ("flwr:shard:two", "positive integer")),
    (("--partition", "flwr:natural_id:city"), ("no column 'city'",)),
    (("--partition", "flwr:natural_id:writer"), ("clients is 3", "--clients 5")),
    (("--partition", "flwr:shard:500"), ("flwr:shard:500", "3 clients x 500 shards = 1500 shards", "expected S x clients <=")),
])
def test_bad_partitions_are_one_sentence(saved, tmp_path, args, words):
    result = invoke("simulate", "--dataset", spec(saved), "--clients", 3, "--clients-per-round", 2, "--rounds", 1,
                    "--backend", "local", "--out", tmp_path / "run", *args)
    refused(result, *words)
    assert not os.path.exists(tmp_path / "run" / "summary.json")


@pytest.mark.parametrize("query, words", [
    ("?image=nope&label=y", ("no column 'nope'",)),
    ("?image=caption&label=y", ("holds text", "?text=caption")),
    ("?label=y&image=img&colour=red", ("colour='red' is not a column choice",)),
])
def test_bad_columns_are_one_sentence(saved, tmp_path, monkeypatch, query, words):
    monkeypatch.chdir(os.path.dirname(saved))  # the dataset by a relative path: the sentence's length does not hang on tmp_path's
    result = invoke("simulate", "--dataset", f"hf:{os.path.basename(saved)}{query}", "--clients", 3, "--clients-per-round", 2,
                    "--rounds", 1, "--backend", "local", "--out", tmp_path / "run")
    refused(result, *words)


def test_a_folder_that_is_no_dataset_and_a_name_not_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.txt").write_text("not a dataset")
    monkeypatch.chdir(tmp_path)  # the folder by a relative path: the sentence's length does not hang on tmp_path's
    refused(invoke("data", "inspect", "--dataset", "hf:junk"), "'hf:junk' is not a dataset saved by save_to_disk")
    refused(invoke("data", "inspect", "--dataset", "hf:nobody/no-such-set"), "neither a folder nor a dataset in the "
            "hub cache")


@pytest.mark.parametrize("args", [("--dataset", "hf:some/folder"), ("--partition", "flwr:iid")])
def test_without_the_hub_extra_the_option_names_it(tmp_path, monkeypatch, args):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "datasets" else real(name, *a))
    result = invoke("simulate", *args, "--clients", 3, "--clients-per-round", 2, "--rounds", 1, "--backend", "local",
                    "--out", tmp_path / "run")
    refused(result, "needs the datasets package", 'pip install ".[hub]"')


def test_a_text_run_by_author(tmp_path):
    import datasets

    lines = [f"line {i} of the play, spoken with some words to fill a window." for i in range(60)]
    datasets.Dataset.from_dict({"line": lines, "who": ["A", "B"] * 30}).save_to_disk(str(tmp_path / "txt"))
    out = tmp_path / "run"
    result = invoke("simulate", "--dataset", f"hf:{tmp_path / 'txt'}?text=line", "--partition", "flwr:natural_id:who",
                    "--clients", 2, "--clients-per-round", 2, "--rounds", 1, "--backend", "local", "--out", out)
    assert result.exit_code == 0, result.output
    assert "lr: 0.1" in (out / "config.yaml").read_text()  # Shakespeare's protocol defaults
