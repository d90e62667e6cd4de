"""Data known by their content (issue 45 item 2): a run records the fingerprint of the data it trained on (sizes, a
sha256 of the labels and one of the partition) in config.yaml and summary.json, and --resume, a sweep's reuse and a
report's rows compare it, so another --data-dir behind the same dataset name is noticed; the same files at another
path are the same data."""

import json
import os
import shutil

import pytest
import yaml
from click.testing import CliRunner

from data.dataset_files import make_emnist_root
from hasfl_ray.analysis import read_run
from hasfl_ray.analysis.rows import run_groups
from hasfl_ray.cli.main import main
from hasfl_ray.config import RunConfig
from hasfl_ray.data.fingerprint import KEYS, config_fingerprint
from hasfl_ray.errors import DataError

TINY = ["--backend", "local", "--rounds", "1", "--clients", "6", "--clients-per-round", "3", "--quiet"]
EMNIST = ["--dataset", "emnist", "--eval-every", "1"]


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """data-a and data-b: two EMNIST roots of the same sizes and other labels; data-c a copy of data-a."""
    monkeypatch.chdir(tmp_path)
    make_emnist_root(tmp_path / "data-a", seed=0)
    make_emnist_root(tmp_path / "data-b", seed=1)
    shutil.copytree(tmp_path / "data-a", tmp_path / "data-c")
    return tmp_path


def simulate(*args):
    return CliRunner().invoke(main, ["simulate", *TINY, *EMNIST, *args])


def stored(folder, name):
    with open(os.path.join(folder, name), encoding="utf-8") as handle:
        return yaml.safe_load(handle) if name.endswith(".yaml") else json.load(handle)


def test_the_fingerprint_is_written_and_is_of_the_content(roots):
    assert simulate("--data-dir", "data-a", "--out", "runs/a").exit_code == 0
    recorded = stored("runs/a", "config.yaml")["data_fingerprint"]
    assert list(recorded) == list(KEYS) and recorded["train_size"] == 240 and recorded["test_size"] == 62
    assert stored("runs/a", "summary.json")["data_fingerprint"] == recorded
    config = RunConfig(dataset="emnist", clients=6, clients_per_round=3, rounds=1, backend="local")
    same = config_fingerprint(RunConfig.from_dict({**config.to_dict(), "data_dir": "data-c"}).resolved())
    other = config_fingerprint(RunConfig.from_dict({**config.to_dict(), "data_dir": "data-b"}).resolved())
    assert same == recorded
    assert other["labels_sha256"] != recorded["labels_sha256"] and other["train_size"] == 240
    reseeded = config_fingerprint(RunConfig.from_dict({**config.to_dict(), "data_dir": "data-a",
                                                       "data_seed": 7}).resolved())
    assert reseeded["labels_sha256"] == recorded["labels_sha256"]  # the same data, split another way
    assert reseeded["partition_sha256"] != recorded["partition_sha256"]


def test_resume_on_other_data_is_one_sentence_naming_both_fingerprints(roots):
    assert simulate("--data-dir", "data-a", "--out", "runs/a", "--checkpoint-every", "1").exit_code == 0
    before = {name: (roots / "runs" / "a" / name).read_bytes() for name in ("config.yaml", "metrics.jsonl")}
    recorded = stored("runs/a", "config.yaml")["data_fingerprint"]["labels_sha256"]
    result = simulate("--data-dir", "data-b", "--out", "runs/a", "--resume")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1
    assert "data_dir 'data-a' -> 'data-b'" in result.output
    assert f"labels_sha256 {recorded[:12]} -> " in result.output and "train_size" not in result.output
    assert {name: (roots / "runs" / "a" / name).read_bytes() for name in before} == before
    again = simulate("--data-dir", "data-c", "--out", "runs/a", "--resume")  # a copy of the same files
    assert again.exit_code == 0, again.output


def test_a_sweep_never_reuses_a_run_trained_on_other_data(roots):
    (roots / "S.yaml").write_text(yaml.safe_dump({"sweep": {"datasets": ["emnist"], "algorithms": ["fedavg"],
                                                            "seeds": [42]}, "rounds": 1, "clients": 6,
                                                  "clients_per_round": 3, "eval_every": 1}))

    def sweep(data, out):
        result = CliRunner().invoke(main, ["sweep", "S.yaml", "--data-dir", data, "--out", out, "--backend", "local",
                                           "--quiet"])
        assert result.exit_code == 0, result.output
        with open(os.path.join(out, "sweep.json"), encoding="utf-8") as handle:
            return [cell["status"] for cell in json.load(handle)["cells"]]

    assert sweep("data-a", "runs/theirs") == ["done"]
    assert sweep("data-b", "runs/mine") == ["done"]  # was: reused from runs/theirs, trained on data-a
    assert sweep("data-c", "runs/copy") == ["reused"]  # the same files elsewhere: the same data
    assert sweep("data-c", "runs/theirs") == ["skipped"]  # its own finished cell, the same data at another path
    again = CliRunner().invoke(main, ["sweep", "S.yaml", "--data-dir", "data-b", "--out", "runs/theirs", "--backend",
                                      "local", "--quiet"])  # was: skipped as finished, though trained on data-a
    assert again.exit_code == 2 and "already holds a run with another config (the data of dataset 'emnist'" in \
        again.output and "labels_sha256" in again.output, again.output


def test_a_report_never_pools_seeds_trained_on_other_data(roots):
    for seed, data in ((1, "data-a"), (2, "data-b"), (3, "data-c")):
        assert simulate("--seed", str(seed), "--data-dir", data, "--out", f"runs/s{seed}").exit_code == 0
    same = [read_run(f"runs/s{seed}") for seed in (1, 3)]
    assert len(run_groups(same)) == 1  # data-a and its copy: one row of two seeds
    with pytest.raises(DataError, match=r"trained on other data of dataset 'emnist' \(labels_sha256 \w{12} -> "):
        run_groups([read_run(f"runs/s{seed}") for seed in (1, 2)])


def test_a_dataset_without_held_labels_is_known_by_its_clients_sizes():
    """The synthetic data (generated per client, from the config) are never generated whole to be fingerprinted."""
    from hasfl_ray.data.fingerprint import dataset_fingerprint
    from hasfl_ray.data.synthetic import load_synthetic

    first, again, other = (dataset_fingerprint(load_synthetic(50, seed)) for seed in (1, 1, 2))
    assert first == again and first["labels_sha256"] is None and first["train_size"] > 0
    assert first["partition_sha256"] != other["partition_sha256"]
