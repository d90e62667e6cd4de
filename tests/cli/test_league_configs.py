"""The sub-model league's configs (issue 44 item 4): configs/league-cifar10.yaml and league-cifar100.yaml expand to
FedLASE's grid (11 methods x its 8 cells: Table 2's six client allocations at Dir(0.1) and Table 3's IID and Dir(0.3)
at {10,20,30,40}, as ../shared/reviews/field-survey.md section 3b transcribes them; 3 seeds; FedLASE's protocol where
the config can state it, on the device clock), and configs/league-cifar10-sample.yaml, the same protocol scaled down,
runs on the real CIFAR-10 sample and reports.

The grid test plans every cell, so it needs the league's five algorithms (fiarse, scalefl, depthfl, fluid, fedgmr)
registered: until they are, planning refuses the first of them by name and the test fails saying so."""

import collections
import json
import os

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.data.images import MIN_CLIENT_SIZE
from hasfl_ray.data.partition import partition_splits
from hasfl_ray.engine import RunConfig
from hasfl_ray.engine.participants import capacity_tiers
from hasfl_ray.federation import ladder_of
from hasfl_ray.sweep import plan_sweep

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = {dataset: os.path.join(REPO, "configs", f"league-{dataset}.yaml") for dataset in ("cifar10", "cifar100")}
SAMPLE = os.path.join(REPO, "configs", "league-cifar10-sample.yaml")
METHODS = {"heterofl", "fedrolex", "fjord", "fiarse", "scalefl", "depthfl", "fluid", "fedgmr", "hasfl", "uniform",
           "fedavg"}
L4, L5 = (1.0, 0.5, 0.25, 0.125), (1.0, 0.8, 0.6, 0.4, 0.2)  # sizes {1, 1/4, 1/16, 1/64}, {1, 16/25, ..., 1/25}
#: FedLASE's cells (field-survey.md 3b): (partition, alpha or None, widths, clients per level from the largest down).
#: Table 2 (Dir(0.1)): 4 levels {5,10,25,60}, {10,20,30,40}, {25,25,25,25}; 5 levels {5,5,10,20,60},
#: {5,10,15,20,50}, {20,...,20}. Table 3: {1,1/4,1/16,1/64} on {10,20,30,40}, IID / Dir(0.3) / Dir(0.1).
DIR01 = ("dirichlet", 0.1)
CELLS = {(*DIR01, L4, (5, 10, 25, 60)), (*DIR01, L4, (10, 20, 30, 40)), (*DIR01, L4, (25, 25, 25, 25)),
         (*DIR01, L5, (5, 5, 10, 20, 60)), (*DIR01, L5, (5, 10, 15, 20, 50)), (*DIR01, L5, (20, 20, 20, 20, 20)),
         ("dirichlet", 0.3, L4, (10, 20, 30, 40)), ("iid", None, L4, (10, 20, 30, 40))}
#: The keys the sample scales down (the rest is the full grid's protocol); its local work is local_steps in place of
#: the full grid's local_epochs.
SCALED = {"rounds", "clients", "clients_per_round", "eval_every", "local_eval_every"}
LOCAL_WORK = ("local_epochs", "local_steps")


@pytest.mark.parametrize("dataset", sorted(CONFIGS))
def test_the_league_config_expands_to_fedlases_grid(dataset):
    cells = plan_sweep(CONFIGS[dataset], {}).cells
    assert len(cells) == 11 * 8 * 3
    seen = set()
    for cell in cells:
        c = RunConfig.from_dict(cell.values, cell.name, foreign="drop").resolved()
        ladder = tuple(ladder_of(c).widths)
        # the clients each level is dealt, counted from the run's own capacity draw (largest level first)
        dealt = collections.Counter(capacity_tiers(c.effective_data_seed, c.clients, c.tier_counts, ladder_of(c)))
        allocation = tuple(dealt[w] for w in ladder)
        assert sum(allocation) == 100 and c.width_assignment == "fixed"  # fixed for the run: exactly these counts
        key = (c.partition, c.alpha if c.partition != "iid" else None, ladder, allocation)
        assert key in CELLS, key
        seen.add((c.algorithm, key, c.seed))
        method, part, level, counts = cell.algorithm.split("-")  # the variant's name says its cell
        assert c.algorithm == method and c.dataset == dataset
        assert part == {"dirichlet": f"dir{c.alpha:g}", "iid": "iid"}[c.partition]
        assert level == f"l{len(ladder)}" and counts == ".".join(map(str, allocation))
        assert (c.model, c.model_norm, c.model_scaler, c.clients, c.clients_per_round, c.rounds) == \
            ("resnet18", "sbn", "off", 100, 10, 2000)  # FedLASE: ResNet-18 sBN, 100 clients, 10 %, 2,000 rounds
        assert (c.local_epochs, c.local_steps, c.batch_size) == (5, None, 20)  # 5 local epochs of batch 20
        assert (c.lr, c.lr_decay, c.momentum, c.weight_decay, c.clip_norm) == (0.1, 1.0, 0.0, 0.0, 0.0)  # assumed
        assert c.test_every == 1  # every round's global accuracy: FedLASE's mean over the last 20 rounds
        assert c.devices["distribution"] == "lognormal" and c.deadline is None  # on the clock: equal time, bytes
        if c.algorithm == "scalefl" and len(ladder) == 4:  # git-disl/scale-fl args.py: --horizontal_scale_ratios
            # 1 2 3 4, one exit more a level from the narrowest (auto's ceil(v x 4) would give 1, 1, 2, 4 here)
            assert sorted(zip(ladder, c.depths)) == [(0.125, 1), (0.25, 2), (0.5, 3), (1.0, 4)], c.depths
    assert {s[0] for s in seen} == METHODS and {s[1] for s in seen} == CELLS and {s[2] for s in seen} == {42, 43, 44}
    assert len(seen) == len(cells)  # every method, cell and seed once


def _yaml(path):
    return yaml.safe_load(open(path, encoding="utf-8"))


def test_the_sample_is_the_full_protocol_scaled_down():
    """The sample's shared keys are the full CIFAR-10 grid's but for its scale, and each of its variants is the full
    grid's variant of the same name (read as YAML: this holds before the league's algorithms are registered)."""
    sample, full = _yaml(SAMPLE), _yaml(CONFIGS["cifar10"])
    shared = {k: v for k, v in sample.items() if k != "sweep"}
    full_work, sample_work = LOCAL_WORK
    assert full[full_work] == 5 and full_work not in shared and sample_work not in full  # 5 epochs, scaled to steps
    assert {k for k in shared if shared[k] != full.get(k)} == SCALED | {sample_work}
    assert set(shared) - {sample_work} == set(full) - {"sweep", full_work}
    for name, keys in sample["sweep"]["variants"].items():
        assert full["sweep"]["variants"][name] == keys
    assert {v["algorithm"] for v in sample["sweep"]["variants"].values()} == \
        {"heterofl", "fedrolex", "fjord", "hasfl", "uniform", "fedavg"}  # the six it was written with


def test_the_samples_comment_names_its_methods_as_league_md_does():
    """The sample's first comment said its six methods were "the methods that exist today" after the league's five
    were registered beside them; it now names its six as league.md's sample section does ("the six methods that
    existed when it was written") and names the five it leaves out, each by the report's name."""
    from hasfl_ray.analysis.tables.layout import display_name

    with open(SAMPLE, encoding="utf-8") as file:
        comment = " ".join(line[1:].strip() for line in iter(file.readline, "") if line.startswith("#"))
    page = " ".join(open(os.path.join(REPO, "docs", "reproduction", "league.md"), encoding="utf-8").read().split())
    written = "the six methods that existed when it was written"
    assert written in comment and written in page and "exist today" not in comment
    ran = [display_name(v["algorithm"]) for v in _yaml(SAMPLE)["sweep"]["variants"].values()]
    listed, _, after = comment.partition(written + ": ")[2].partition(" (")
    assert [name.strip() for name in listed.replace(" and ", ", ").split(", ")] == list(dict.fromkeys(ran))
    assert all(display_name(method) in after for method in METHODS if display_name(method) not in ran)


def test_the_sample_runs_on_the_real_cifar10_sample_and_reports_its_league(shared_data, tmp_path):
    out = tmp_path / "league"
    methods = ["heterofl-dir0.3-l4-10.20.30.40", "fedrolex-dir0.3-l4-10.20.30.40", "hasfl-dir0.3-l4-10.20.30.40"]
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
        run = out / f"cifar10-{method}-dir0.3-l4-10.20.30.40-seed42"
        summary = json.loads((run / "summary.json").read_text())
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert (row["partition"], row["ladder"], row["clocked"]) == \
            ("Dir(0.3)", "widths 1, 0.5, 0.25, 0.125 (mix 10:20:30:40)", True)
        assert row["widths"] == ["1", "0.5", "0.25", "0.125"] and len(lines) == 2
        assert row["cells"]["global"]["mean"] == pytest.approx(100 * summary["final_accuracy"])
        hit = next((line["sim_time_s"] for line in lines if line["test_accuracy"] >= 0.5), "not reached")
        cell = row["cells"]["time_to_0.5_s"]
        assert cell == hit if isinstance(hit, str) else cell["mean"] == pytest.approx(hit)
    budget = league["budgets"]["cifar10"]["time"]
    assert budget == pytest.approx(min(json.loads((out / f"cifar10-{m}-seed42" / "metrics.jsonl").read_text()
                                                  .splitlines()[-1])["sim_time_s"] for m in methods))


@pytest.mark.parametrize("dataset, classes", [("cifar10", 10), ("cifar100", 100)])
def test_every_dirichlet_cell_of_the_grid_can_be_drawn_at_full_scale(dataset, classes):
    """Each Dirichlet cell's partition over the 100 clients, drawn as the loader draws it (partition_splits with the
    run's data seed) from labels with the real set's class counts (50,000 training images, equal per class): every
    client gets samples. (FIARSE's balanced Dirichlet, the league's former choice, is refused at Dir(0.1) for each of
    the seeds 42-44 on both sets: docs/reproduction/league.md, "Assumptions".)"""
    labels = np.repeat(np.arange(classes), 50_000 // classes)
    drawn = set()
    for cell in plan_sweep(CONFIGS[dataset], {}).cells:
        c = RunConfig.from_dict(cell.values, cell.name, foreign="drop").resolved()
        key = (c.partition, c.alpha, c.effective_data_seed)
        if c.partition == "iid" or key in drawn:
            continue
        drawn.add(key)
        parts = partition_splits(labels, None, c.clients, c.partition, c.alpha,
                                 np.random.default_rng(c.effective_data_seed), min_size=MIN_CLIENT_SIZE)[0]
        assert len(parts) == 100 and min(map(len, parts)) >= MIN_CLIENT_SIZE
        assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))  # every image dealt once
    assert drawn == {("dirichlet", alpha, seed) for alpha in (0.1, 0.3) for seed in (42, 43, 44)}
