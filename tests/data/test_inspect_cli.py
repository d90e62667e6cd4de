"""`hasfl-ray data inspect`: the partition without training, as text or one JSON object; errors exit 2."""

import json
import os

import numpy as np
from click.testing import CliRunner

from dataset_files import make_emnist_root
from hasfl_ray.cli.main import main
from hasfl_ray.data import TIERS, assign_tiers
from hasfl_ray.training.seeding import STREAM_TIERS
from hasfl_ray.training.seeding import numpy_rng


def run(args):
    return CliRunner().invoke(main, ["data", "inspect"] + args)


def test_json_digits_default():
    result = run(["--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert {"num_classes", "train_size", "test_size", "clients"} <= set(summary)
    assert summary["num_classes"] == 10 and len(summary["clients"]) == 20
    rows = summary["clients"]
    assert set(rows[0]) == {"client", "name", "num_samples", "p_max", "tv_distance", "label_histogram"}
    assert sum(row["num_samples"] for row in rows) == summary["train_size"]
    assert all(sum(row["label_histogram"]) == row["num_samples"] for row in rows)
    assert all(0 <= row["tv_distance"] <= 1 for row in rows)
    # p_max is the run's: drawn as the engine draws it, 8/5/4/3 clients per tier.
    expected = assign_tiers(20, numpy_rng(42, STREAM_TIERS))
    assert [row["p_max"] for row in rows] == expected.tolist()
    assert sorted(np.unique([row["p_max"] for row in rows]).tolist()) == list(TIERS)


def test_text_table_and_seed_changes_partition(tmp_path):
    make_emnist_root(tmp_path)
    args = ["--dataset", "emnist", "--data-dir", str(tmp_path), "--clients", "4", "--alpha", "1.0"]
    result = run(args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("emnist: 62 classes, 240 train and 62 test samples over 4 clients")
    assert "num_samples" in lines[1] and "tv_distance" in lines[1] and len(lines) == 6
    other = run(args + ["--seed", "7", "--json"])
    sizes = [row["num_samples"] for row in json.loads(other.output)["clients"]]
    first = [row["num_samples"] for row in json.loads(run(args + ["--json"]).output)["clients"]]
    assert sizes != first


def test_missing_data_exits_2_with_one_sentence(tmp_path):
    result = run(["--dataset", "emnist", "--data-dir", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert result.output.startswith("Error: EMNIST files not found under") and result.output.count("\n") == 1
    assert "Traceback" not in result.output


def test_shared_shakespeare_roles(shared_data):
    result = run(["--dataset", "shakespeare", "--data-dir", os.path.join(shared_data, "shakespeare"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["num_classes"] == 95 and summary["clients"][0]["name"] == "hamlet/HAM"
    assert len(summary["clients"][0]["label_histogram"]) == 95
