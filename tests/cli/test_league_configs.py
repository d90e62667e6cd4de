"""The sub-model league's configs (issue 44 item 4): configs/league-cifar10.yaml and league-cifar100.yaml expand to
FedLASE's grid (11 methods x 3 partitions x 2 ladders x 3 seeds on the FIARSE protocol, on the device clock), and
configs/league-cifar10-sample.yaml, the same protocol scaled down, runs on the real CIFAR-10 sample and reports.

The grid test plans every cell, so it needs the league's five algorithms (fiarse, scalefl, depthfl, fluid, fedgmr)
registered: until they are, planning refuses the first of them by name and the test fails saying so."""

import json
import os

import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import RunConfig
from hasfl_ray.federation import ladder_of
from hasfl_ray.sweep import plan_sweep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {dataset: os.path.join(REPO, "configs", f"league-{dataset}.yaml") for dataset in ("cifar10", "cifar100")}
SAMPLE = os.path.join(REPO, "configs", "league-cifar10-sample.yaml")
METHODS = {"heterofl", "fedrolex", "fjord", "fiarse", "scalefl", "depthfl", "fluid", "fedgmr", "hasfl", "uniform",
           "fedavg"}
PARTITIONS = {("balanced-dirichlet", 0.1), ("balanced-dirichlet", 0.3), ("iid", None)}
LADDERS = {(1.0, 0.5, 0.25, 0.125), (1.0, 0.8, 0.6, 0.4, 0.2)}  # sizes {1, 1/4, 1/16, 1/64}, {1, 16/25, ..., 1/25}
#: The keys the sample scales down (the rest is the full grid's protocol).
SCALED = {"rounds", "clients", "clients_per_round", "local_steps", "eval_every", "local_eval_every"}


@pytest.mark.parametrize("dataset", sorted(CONFIGS))
def test_the_league_config_expands_to_the_grid(dataset):
    cells = plan_sweep(CONFIGS[dataset], {}).cells
    assert len(cells) == 11 * 3 * 2 * 3
    seen = set()
    for cell in cells:
        c = RunConfig.from_dict(cell.values, cell.name, foreign="drop").resolved()
        partition = (c.partition, c.alpha if c.partition != "iid" else None)
        ladder = tuple(ladder_of(c).widths)
        seen.add((c.algorithm, partition, ladder, c.seed))
        method, part, level = cell.algorithm.split("-")  # the variant's name says its cell
        assert c.algorithm == method and c.dataset == dataset
        assert part == {"balanced-dirichlet": f"dir{c.alpha:g}", "iid": "iid"}[c.partition]
        assert level == f"l{len(ladder)}" and c.width_mix == [1.0] * len(ladder)  # equal shares per level
        assert (c.model, c.model_norm, c.clients, c.clients_per_round, c.rounds) == ("resnet18", "sbn", 100, 10, 800)
        assert (c.local_steps, c.batch_size, c.lr, c.lr_decay, c.momentum, c.weight_decay, c.clip_norm) == \
            (100, 20, 0.1, 1.0, 0.0, 0.0, 0.0)  # the FIARSE protocol's plain SGD
        assert c.devices["distribution"] == "lognormal" and c.deadline is None  # on the clock: equal time, bytes
    assert {s[0] for s in seen} == METHODS and {s[1] for s in seen} == PARTITIONS
    assert {s[2] for s in seen} == LADDERS and {s[3] for s in seen} == {42, 43, 44}
    assert len(seen) == len(cells)  # every method, partition, ladder and seed once


def _yaml(path):
    return yaml.safe_load(open(path, encoding="utf-8"))


def test_the_sample_is_the_full_protocol_scaled_down():
    """The sample's shared keys are the full CIFAR-10 grid's but for its scale, and each of its variants is the full
    grid's variant of the same name (read as YAML: this holds before the league's algorithms are registered)."""
    sample, full = _yaml(SAMPLE), _yaml(CONFIGS["cifar10"])
    shared = {k: v for k, v in sample.items() if k != "sweep"}
    assert {k for k in shared if shared[k] != full.get(k)} == SCALED and set(shared) == set(full) - {"sweep"}
    for name, keys in sample["sweep"]["variants"].items():
        assert full["sweep"]["variants"][name] == keys
    assert {v["algorithm"] for v in sample["sweep"]["variants"].values()} == \
        {"heterofl", "fedrolex", "fjord", "hasfl", "uniform", "fedavg"}  # the methods that exist today


def test_the_sample_runs_on_the_real_cifar10_sample_and_reports_its_league(shared_data, tmp_path):
    out = tmp_path / "league"
    methods = ["heterofl-dir0.3-l4", "fedrolex-dir0.3-l4", "hasfl-dir0.3-l4"]
    result = CliRunner().invoke(main, [
        "sweep", SAMPLE, "--data-dir", os.path.join(shared_data, "torchvision"), "--algorithms", ",".join(methods),
        "--clients", "4", "--clients-per-round", "2", "--local-steps", "1", "--eval-samples", "40",
        "--backend", "local", "--out", str(out), "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["report", str(out), "--json"])
    assert result.exit_code == 0, result.output
    league = json.loads(result.output)["league"]
    rows = {row["algorithm"]: row for row in league["rows"]}
    assert set(rows) == {"heterofl", "fedrolex", "hasfl"}
    for method, row in rows.items():
        run = out / f"cifar10-{method}-dir0.3-l4-seed42"
        summary = json.loads((run / "summary.json").read_text())
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert (row["partition"], row["ladder"], row["clocked"]) == \
            ("balanced Dir(0.3)", "widths 1, 0.5, 0.25, 0.125", True)
        assert row["widths"] == ["1", "0.5", "0.25", "0.125"] and len(lines) == 2
        assert row["cells"]["global"]["mean"] == pytest.approx(100 * summary["final_accuracy"])
        hit = next((line["sim_time_s"] for line in lines if line["test_accuracy"] >= 0.5), "not reached")
        cell = row["cells"]["time_to_0.5_s"]
        assert cell == hit if isinstance(hit, str) else cell["mean"] == pytest.approx(hit)
    budget = league["budgets"]["cifar10"]["time"]
    assert budget == pytest.approx(min(json.loads((out / f"cifar10-{m}-seed42" / "metrics.jsonl").read_text()
                                                  .splitlines()[-1])["sim_time_s"] for m in methods))
