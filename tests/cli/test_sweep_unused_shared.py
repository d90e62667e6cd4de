"""A sweep config's shared key that no cell of the config uses (an option of an algorithm no cell runs, an option
every cell taking it leaves inert, an alpha no cell's partition reads) is refused in one sentence before any cell,
as a single run refuses a key it leaves without effect; a key some cell uses keeps working, also when the flags
run only the cells that do not read it (a config lists the whole protocol)."""

import os

import pytest

from sentences import invoke, refused
from hasfl_ray.sweep.plan import plan_sweep

TINY = "rounds: 1\nclients: 4\nclients_per_round: 2\n"


def sweep_file(tmp_path, algorithms, shared, datasets="[digits]", variants=""):
    path = tmp_path / "s.yaml"
    path.write_text(f"sweep:\n  datasets: {datasets}\n  algorithms: {algorithms}\n  seeds: [42]\n{variants}"
                    + TINY + shared)
    return path


@pytest.mark.parametrize("algorithms, shared, variants, words", [
    ("[hasfl, uniform]", "fjord_distill_weight: 0.5\n", "",
     ["has fjord_distill_weight 0.5 but no sweep cell uses it",
      "no cell runs an algorithm that takes it (the cells run hasfl, uniform)"]),
    ("[hasfl, uniform]", "algorithm_options: {mu: 0.1}\n", "",
     ["has algorithm_options.mu 0.1 but no sweep cell uses it"]),
    ("[fjord, nokd]", "fjord_kd: false\nfjord_distill_weight: 0.5\n",
     "  variants: {nokd: {algorithm: fjord, fjord_kd: false}}\n",
     ["has fjord_distill_weight 0.5 but no sweep cell uses it: the cells of fjord leave it without effect"]),
    ("[hasfl]", "alpha: 0.1\npartition: iid\n", "",
     ["has alpha 0.1 but no sweep cell uses it: no cell's dataset and partition read it"]),
])
def test_a_shared_key_no_cell_uses_is_refused_before_any_cell(tmp_path, monkeypatch, algorithms, shared, variants,
                                                              words):
    monkeypatch.chdir(tmp_path)
    sweep_file(tmp_path, algorithms, shared, variants=variants)
    message = refused(invoke("sweep", "s.yaml", "--backend", "local", "--quiet", "--out", "sw"), *words)
    assert "config file 's.yaml'" in message and "expected it removed, or a cell that uses it" in message
    assert not os.path.exists(tmp_path / "sw")


def test_a_shared_alpha_on_datasets_with_their_own_clients_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep_file(tmp_path, "[hasfl]", "alpha: 0.1\n", datasets="[synthetic]")
    refused(invoke("sweep", "s.yaml", "--backend", "local", "--quiet", "--out", "sw"), "has alpha 0.1 but no sweep cell")


@pytest.mark.parametrize("algorithms, shared, narrowed", [
    ("[hasfl, fedprox]", "mu: 0.1\n", None),                  # the fedprox cell reads it
    ("[hasfl, fedprox]", "mu: 0.1\n", ["hasfl"]),             # the config's fedprox cell does: running part is fine
    ("[hasfl]", "mu: 0.1\n", ["fedprox"]),                    # the flags add the cell that reads it
    ("[fjord, hasfl]", "fjord_distill_weight: 0.5\n", None),
    ("[hasfl]", "alpha: 0.1\n", None),                        # digits' dirichlet reads it
])
def test_a_shared_key_some_cell_uses_keeps_working(tmp_path, algorithms, shared, narrowed):
    path = sweep_file(tmp_path, algorithms, shared)
    plan = plan_sweep(str(path), {}, algorithms=narrowed, out=str(tmp_path / "sw"))
    assert plan.cells and not os.path.exists(tmp_path / "sw")


def test_a_shared_alpha_over_digits_and_synthetic_keeps_working(tmp_path):
    path = sweep_file(tmp_path, "[hasfl]", "alpha: 0.1\n", datasets="[digits, synthetic]")
    assert len(plan_sweep(str(path), {}, out=str(tmp_path / "sw")).cells) == 2


def test_every_config_in_configs_still_plans():
    folder = os.path.join(os.path.dirname(__file__), "..", "..", "configs")
    for name in sorted(os.listdir(folder)):
        if name.endswith(".yaml"):
            assert plan_sweep(os.path.join(folder, name), {}).cells, name


def test_a_per_dataset_option_or_entry_no_cell_uses_is_refused(tmp_path, monkeypatch):
    """per_dataset's mu in a hasfl-only sweep was dropped, and an entry for a dataset the sweep does not run ignored."""
    monkeypatch.chdir(tmp_path)
    for entry, words in [("digits: {mu: 0.1}", "sweep.per_dataset.digits has mu 0.1 but no sweep cell uses it"),
                         ("cifar10: {lr: 0.1}", "has sweep.per_dataset.cifar10 but no sweep cell runs cifar10 (the "
                                                "cells run digits); expected it removed, or cifar10 in sweep.datasets")]:
        sweep_file(tmp_path, "[hasfl]", "", variants=f"  per_dataset:\n    {entry}\n")
        refused(invoke("sweep", "s.yaml", "--backend", "local", "--quiet", "--out", "sw"), words)
        assert not os.path.exists(tmp_path / "sw")


def test_a_per_dataset_entry_of_a_dataset_some_cell_runs_keeps_working(tmp_path):
    path = sweep_file(tmp_path, "[hasfl, fedprox]", "", datasets="[digits, synthetic]",
                      variants="  per_dataset:\n    synthetic: {lr: 0.1}\n    digits: {mu: 0.1}\n")
    plan = plan_sweep(str(path), {}, datasets=["digits"], algorithms=["hasfl"], out=str(tmp_path / "sw"))
    assert [c.name for c in plan.cells] == ["digits-hasfl-seed42"]


@pytest.mark.parametrize("flags, words", [
    (["--mu", 0.5], "mu is 0.5 (given by --mu) but no sweep cell uses it: no cell runs an algorithm that takes it"),
    (["--algo-opt", "mu=0.3"], "mu is 0.3 (given by --algo-opt) but no sweep cell uses it"),
    (["--algorithms", "uniform", "--no-coverage"], "coverage is False (given by --no-coverage) but no sweep cell uses"),
])
def test_a_flag_no_cell_uses_is_refused(tmp_path, monkeypatch, flags, words):
    """sweep's flags apply to every cell: `--mu 0.5` on a hasfl-only sweep was dropped from each (counted over the
    cells that run: `--no-coverage` with `--algorithms uniform` too, though the config's own cell is hasfl)."""
    monkeypatch.chdir(tmp_path)
    sweep_file(tmp_path, "[hasfl]", "")
    refused(invoke("sweep", "s.yaml", "--backend", "local", "--quiet", "--out", "sw", *flags), words)
    assert not os.path.exists(tmp_path / "sw")
    plan = plan_sweep("s.yaml", {"mu": 0.5}, algorithms=["fedprox"], out="sw")  # a cell that takes it: kept
    assert plan.cells[0].values["mu"] == 0.5
