"""`hasfl-ray data inspect`: the partition without training, as text or one JSON object; errors exit 2."""

import json
import os

import numpy as np
import pytest
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
    lines = result.stdout.splitlines()  # (stderr: the default tiers' width 1 gets none of 4 clients, said once)
    assert result.stderr.startswith("warning: width 1 (share 15%) of the default tiers gets 0 of the 4 clients")
    assert lines[0].startswith("emnist: 62 classes, 240 train and 62 test samples over 4 clients")
    assert "num_samples" in lines[1] and "tv_distance" in lines[1] and len(lines) == 6
    other = run(args + ["--seed", "7", "--json"])
    sizes = [row["num_samples"] for row in json.loads(other.stdout)["clients"]]
    first = [row["num_samples"] for row in json.loads(run(args + ["--json"]).stdout)["clients"]]
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


def test_tier_counts_deal_p_max_as_the_run_does(tmp_path):
    """h56: a run with tier_counts (configs/avg-p-paper-tier-mix.yaml's 4,10,3,3) could not be inspected: data
    inspect dealt p^max from the mix alone. --tier-counts gives the p^max of the run's clients.csv, and counts that do
    not fit are simulate's sentence."""
    import csv

    out = str(tmp_path / "run")
    simulate = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "1", "--clients", "20",
                                         "--clients-per-round", "3", "--tier-counts", "4,10,3,3", "--quiet",
                                         "--local-eval-clients", "off", "--out", out])
    assert simulate.exit_code == 0, simulate.output
    with open(os.path.join(out, "clients.csv"), encoding="utf-8") as handle:
        ran = [float(row["p_max"]) for row in csv.DictReader(handle)]
    result = run(["--clients", "20", "--tier-counts", "4,10,3,3", "--json"])
    assert result.exit_code == 0, result.output
    assert [row["p_max"] for row in json.loads(result.output)["clients"]] == ran
    assert sorted(ran).count(0.5) == 10  # not the default mix's 5
    bad = run(["--clients", "6", "--tier-counts", "1,2,3"])
    assert bad.exit_code == 2 and bad.output.startswith("Error: tier_counts is [1, 2, 3]; expected 4 non-negative")
    assert "Traceback" not in bad.output


@pytest.mark.parametrize("alpha", ["nan", "inf"])
@pytest.mark.parametrize("partition", ["dirichlet", "balanced-dirichlet"])
def test_non_finite_alpha_is_one_sentence(alpha, partition):
    """click's FloatRange lets NaN and infinity through: they reached the Dirichlet draw, which warned ("invalid value
    encountered in cast") and after 1,000 tries asked for "a larger --alpha" (of infinity)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning from the draw fails the test
        result = run(["--clients", "4", "--alpha", alpha, "--partition", partition])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines == [f"Error: alpha is {float(alpha)!r}; expected a finite number > 0 (the Dirichlet concentration: "
                     "not NaN or infinity)"], result.output
