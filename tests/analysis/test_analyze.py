"""`hasfl-ray analyze`: Table 5 (four correlations with p-values and client counts, per run and pooled over seeds),
checked against scipy on hand-made clients.csv files; the verdict; the `analysis` block in summary.json."""

import csv
import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from scipy import stats

from hasfl_ray.cli.main import main

TIERS = [0.25, 0.5, 0.75, 1.0]


def make_run(path, seed, h, p_max, tv, p, algorithm="hasfl", dataset="cifar10"):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"dataset": dataset, "algorithm": algorithm, "coverage": True,
                                                      "seed": seed}))
    (path / "summary.json").write_text(json.dumps({"best_accuracy": 0.8, "final_accuracy": 0.7, "avg_p": 0.5,
                                                   "rounds": 3, "params_sha256": "x", "wall_s": 1.0}))
    with open(path / "clients.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["client", "num_samples", "p_max", "tv_distance", "h_tilde",
                                                    "p_final", "name"])
        writer.writeheader()
        for i in range(len(h)):
            writer.writerow({"client": i, "num_samples": 10, "p_max": p_max[i], "tv_distance": tv[i],
                             "h_tilde": h[i], "p_final": p[i], "name": f"client_{i}"})


def clients(seed, data_weight=0.0, capacity_weight=-1.0, n=20):
    rng = np.random.default_rng(seed)
    p_max = np.array([TIERS[i % 4] for i in range(n)])
    tv = rng.uniform(0.2, 0.8, n)
    h = 1.5 + capacity_weight * p_max + data_weight * tv + 0.15 * rng.normal(size=n)
    p = np.minimum(p_max, 0.4 + 0.25 * h / h.mean())
    return h, p_max, tv, p


def partial(x, y, control):
    """Partial correlation the textbook way: correlate the residuals after regressing on the control."""
    rx = x - np.polyval(np.polyfit(control, x, 1), control)
    ry = y - np.polyval(np.polyfit(control, y, 1), control)
    r = stats.pearsonr(rx, ry)[0]
    dof = len(x) - 3
    return r, 2 * stats.t.sf(abs(r) * np.sqrt(dof / (1 - r * r)), dof)


def analyze(*paths):
    result = CliRunner().invoke(main, ["analyze", *map(str, paths), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_correlations_and_p_values_match_scipy(tmp_path):
    h, p_max, tv, p = clients(1)
    make_run(tmp_path / "run", 42, h, p_max, tv, p)
    row = analyze(tmp_path / "run")["runs"][0]
    assert row["n_clients"] == 20
    expected = {"h_tv": stats.pearsonr(h, tv), "h_pmax": stats.pearsonr(h, p_max),
                "h_tv_given_pmax": partial(h, tv, p_max), "p_tv_given_pmax": partial(p, tv, p_max)}
    for name, (r, pvalue) in expected.items():
        assert row["r_" + name] == pytest.approx(r, abs=1e-9)
        assert row["pvalue_" + name] == pytest.approx(pvalue, rel=1e-6)
    assert set(row) >= {"r_h_tv", "r_h_pmax", "r_h_tv_given_pmax", "r_p_tv_given_pmax", "verdict"}


def test_pooled_over_seeds_takes_every_seeds_clients(tmp_path):
    arrays = [clients(seed) for seed in (1, 2)]
    for seed, (h, p_max, tv, p) in zip((42, 43), arrays):
        make_run(tmp_path / f"cifar10-hasfl-seed{seed}", seed, h, p_max, tv, p)
    make_run(tmp_path / "fedavg", 42, [""] * 20, arrays[0][1], arrays[0][2], [1.0] * 20, algorithm="fedavg")
    result = analyze(tmp_path)
    assert len(result["runs"]) == 2  # the run without estimates is left out
    pooled = result["pooled"][0]
    assert pooled["n_clients"] == 40 and pooled["seeds"] == [42, 43]
    h, p_max, tv, p = (np.concatenate([a[i] for a in arrays]) for i in range(4))
    assert pooled["r_h_pmax"] == pytest.approx(stats.pearsonr(h, p_max)[0], abs=1e-9)
    assert pooled["r_h_tv_given_pmax"] == pytest.approx(partial(h, tv, p_max)[0], abs=1e-9)


def test_verdict_follows_the_numbers(tmp_path):
    make_run(tmp_path / "capacity", 42, *clients(3, data_weight=0.0, capacity_weight=-1.0))
    make_run(tmp_path / "data", 43, *clients(4, data_weight=3.0, capacity_weight=0.0), dataset="emnist")
    result = analyze(tmp_path / "capacity", tmp_path / "data")
    verdicts = {row["dataset"]: row["verdict"] for row in result["runs"]}
    assert verdicts["cifar10"].startswith("estimates track capacity, not data")
    assert verdicts["emnist"].startswith("estimates track data, not capacity")
    text = CliRunner().invoke(main, ["analyze", str(tmp_path / "capacity")])
    assert text.exit_code == 0 and "verdict" in text.output and "estimates track capacity, not data" in text.output


def test_summary_json_gains_the_analysis_block(tmp_path):
    make_run(tmp_path / "run", 42, *clients(5))
    row = analyze(tmp_path / "run")["runs"][0]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["best_accuracy"] == 0.8  # the rest is kept
    assert summary["analysis"]["r_h_pmax"] == pytest.approx(row["r_h_pmax"])
    assert summary["analysis"]["n_clients"] == 20 and summary["analysis"]["verdict"] == row["verdict"]


def test_runs_without_estimates_are_one_sentence(tmp_path):
    make_run(tmp_path / "fedavg", 42, [""] * 8, [0.5] * 8, [0.3] * 8, [1.0] * 8, algorithm="fedavg")
    result = CliRunner().invoke(main, ["analyze", str(tmp_path)])
    assert result.exit_code == 2 and "has H̃ estimates" in result.output and "Traceback" not in result.output


def test_constant_estimates_give_no_verdict_and_valid_json(tmp_path):
    h, p_max, tv, p = clients(6)
    make_run(tmp_path / "run", 42, np.ones(20), p_max, tv, p)
    row = analyze(tmp_path / "run")["runs"][0]
    assert row["r_h_pmax"] is None and row["verdict"].startswith("no verdict")


def test_the_confound_tables_columns_line_up_whatever_the_labels(tmp_path):
    """h60: the label column had a fixed width (a long algorithm name or seed pushed its row's numbers right of the
    header's). Each column is now as wide as its widest cell: every row's n and statistics end where the header's do."""
    for seed, name in ((42, "hasfl"), (43, "hasfl-coverage-off-with-a-long-name")):
        make_run(tmp_path / f"{name}-{seed}", seed, *clients(seed), algorithm=name)
    make_run(tmp_path / "hasfl-1234567", 1234567, *clients(5))
    text = CliRunner().invoke(main, ["analyze", str(tmp_path)])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("confound (Table 5):"))
    header, rows = lines[top], [line for line in lines[top + 1:] if line.startswith("  ")]
    assert len(rows) == 5  # three runs, two pooled (hasfl over seeds 42 and 1234567; the long name's one seed)
    titles = ("n", "r(H, TV)", "r(H, p_max)", "r(p, TV | p_max)")
    ends = [header.index(title, len("confound (Table 5):")) + len(title) for title in titles]
    for row in rows:
        assert all(row[end - 1] != " " and row[end] == " " for end in ends), (header, row)
    labels = [row[2:].split(" ")[0] for row in rows]
    assert "cifar10/hasfl-coverage-off-with-a-long-name/s43" in labels and "cifar10/hasfl/s1234567" in labels
