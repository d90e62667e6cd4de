"""`hasfl-ray sweep`: every cell runs, random-budget takes its HAS-FL cell's budget, reruns skip, interrupted cells
resume from their checkpoints, cells run as Ray tasks, bad input is one sentence; every config in configs/ parses."""

import glob
import json
import os

import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.algorithms.random_budget import budget_from_run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--rounds", "3", "--clients", "6", "--clients-per-round", "3", "--warmup", "1", "--t-adapt", "1"]
CELLS = ["digits-hasfl-seed42", "digits-hasfl-seed43", "digits-random-budget-seed42", "digits-random-budget-seed43"]


@pytest.fixture
def sweep_yaml(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({
        "sweep": {"reproduces": "a tiny test sweep", "datasets": ["digits"], "algorithms": ["hasfl", "random-budget"],
                  "seeds": [42, 43], "variants": {"hasfl-coverage-off": {"algorithm": "hasfl", "coverage": False}}},
        "alpha": 0.3, "checkpoint_every": 1}))
    return str(path)


def sweep(*args):
    result = CliRunner().invoke(main, ["sweep", *args], catch_exceptions=False)
    return result


def statuses(out):
    with open(os.path.join(out, "sweep.json"), encoding="utf-8") as handle:
        return {c["name"]: c["status"] for c in json.load(handle)["cells"]}


def test_tiny_sweep_runs_every_cell_then_skips_them(sweep_yaml, tmp_path):
    out = str(tmp_path / "out")
    result = sweep(sweep_yaml, *TINY, "--backend", "local", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert sorted(statuses(out)) == CELLS and set(statuses(out).values()) == {"done"}
    for seed in (42, 43):
        hasfl_dir = os.path.join(out, f"digits-hasfl-seed{seed}")
        with open(os.path.join(out, f"digits-random-budget-seed{seed}", "config.yaml")) as handle:
            config = yaml.safe_load(handle)
        assert config["algorithm_options"]["budget_from"] == hasfl_dir
        assert config["algorithm_options"]["budget"] == pytest.approx(budget_from_run(hasfl_dir))
        with open(os.path.join(hasfl_dir, "summary.json")) as handle:
            assert "analysis" in json.load(handle)  # Table 5 written into each HAS-FL cell
    stamps = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(out, "*", "summary.json"))}
    again = sweep(sweep_yaml, *TINY, "--backend", "local", "--out", out, "--quiet")
    assert again.exit_code == 0, again.output
    assert set(statuses(out).values()) == {"skipped"} and "4 skipped" in again.output
    assert stamps == {p: os.path.getmtime(p) for p in stamps}
    # the same folder with other overrides is refused before anything runs
    other = sweep(sweep_yaml, *TINY[:-2], "--backend", "local", "--out", out, "--quiet")
    assert other.exit_code == 2 and "another config" in other.output and "Traceback" not in other.output


def test_interrupted_sweep_resumes(sweep_yaml, tmp_path, monkeypatch):
    from hasfl_ray.engine import Engine

    out = str(tmp_path / "out")
    real = Engine.run_round

    def crash(self, t):
        if self.config.seed == 43 and self.config.algorithm == "hasfl" and t == 2:
            raise RuntimeError("simulated crash")
        return real(self, t)

    monkeypatch.setattr(Engine, "run_round", crash)
    first = sweep(sweep_yaml, *TINY, "--backend", "local", "--out", out, "--quiet")
    assert first.exit_code == 1 and "did not finish" in first.output
    assert statuses(out) == {"digits-hasfl-seed42": "done", "digits-random-budget-seed42": "done",
                             "digits-hasfl-seed43": "failed", "digits-random-budget-seed43": "blocked"}
    assert os.path.exists(os.path.join(out, "digits-hasfl-seed43", "checkpoints", "latest.pt"))
    monkeypatch.setattr(Engine, "run_round", real)

    second = sweep(sweep_yaml, *TINY, "--backend", "local", "--out", out, "--quiet")
    assert second.exit_code == 0, second.output
    assert "digits-hasfl-seed43: resumed" in second.output and "after round 2" in second.output
    assert statuses(out) == {"digits-hasfl-seed42": "skipped", "digits-random-budget-seed42": "skipped",
                             "digits-hasfl-seed43": "resumed", "digits-random-budget-seed43": "done"}
    # the resumed cell is bit-identical to an uninterrupted run of it
    reference = sweep(sweep_yaml, *TINY, "--backend", "local", "--out", str(tmp_path / "ref"), "--quiet",
                      "--algorithms", "hasfl", "--seeds", "43")
    assert reference.exit_code == 0, reference.output
    sha = [json.load(open(os.path.join(d, "digits-hasfl-seed43", "summary.json")))["params_sha256"]
           for d in (out, str(tmp_path / "ref"))]
    assert sha[0] == sha[1]

    # a cell whose summary is gone but whose checkpoint is there resumes too (here: after its last round)
    os.unlink(os.path.join(out, "digits-random-budget-seed42", "summary.json"))
    third = sweep(sweep_yaml, *TINY, "--backend", "local", "--out", out, "--quiet")
    assert third.exit_code == 0, third.output
    assert statuses(out)["digits-random-budget-seed42"] == "resumed"
    assert os.path.exists(os.path.join(out, "digits-random-budget-seed42", "summary.json"))


def test_random_budget_alone_brings_its_hasfl_cell(sweep_yaml, tmp_path):
    out = str(tmp_path / "out")
    result = sweep(sweep_yaml, *TINY, "--algorithms", "random-budget", "--seeds", "42", "--backend", "local",
                   "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert statuses(out) == {"digits-hasfl-seed42": "done", "digits-random-budget-seed42": "done"}


@pytest.mark.parametrize("args, words", [
    (["--algorithms", "hasfl,nope"], "algorithm 'nope' is not known"),
    (["--seeds", "42,x"], "--seeds is '42,x'"),
    (["--seeds", ","], "--seeds is ','"),
    (["--datasets", "mnist"], "dataset 'mnist' is not known"),
    (["--rounds", "0"], "rounds is 0"),
    (["--seed", "1", "--seeds", "2"], "both given"),
])
def test_bad_input_is_one_sentence(sweep_yaml, tmp_path, args, words):
    result = sweep(sweep_yaml, "--backend", "local", "--out", str(tmp_path / "o"), *args)
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "o")


def test_missing_or_malformed_config_is_one_sentence(tmp_path):
    result = sweep(str(tmp_path / "nope.yaml"), "--backend", "local")
    assert result.exit_code == 2 and "does not exist" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("sweep: {seedz: [1]}\n")
    result = sweep(str(bad), "--backend", "local")
    assert result.exit_code == 2 and "unknown sweep key 'seedz'" in result.output


def test_simulate_takes_one_cell_of_a_sweep_config(sweep_yaml, tmp_path):
    out = tmp_path / "one"
    result = CliRunner().invoke(main, ["simulate", "--config", sweep_yaml, "--algorithm", "hasfl-coverage-off",
                                       "--rounds", "2", "--clients", "6", "--clients-per-round", "3",
                                       "--backend", "local", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["algorithm"] == "hasfl" and config["algorithm_options"]["coverage"] is False and config["seed"] == 42


def test_without_ray_cells_run_in_process_and_ray_asks_for_the_install(sweep_yaml, tmp_path, monkeypatch):
    import sys

    from hasfl_ray.simulation import RAY_INSTALL

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    refused = sweep(sweep_yaml, "--backend", "ray", "--out", str(tmp_path / "r"))
    assert refused.exit_code == 2 and RAY_INSTALL in refused.output and not os.path.exists(tmp_path / "r")
    out = str(tmp_path / "out")
    result = sweep(sweep_yaml, *TINY, "--algorithms", "hasfl", "--seeds", "42", "--out", out, "--quiet")
    assert result.exit_code == 0, result.output
    assert "one cell after another" in result.output and statuses(out) == {"digits-hasfl-seed42": "done"}


CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*.yaml")))


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p) for p in CONFIGS])
def test_every_config_parses(path):
    from hasfl_ray.cli.simulate import build_config
    from hasfl_ray.sweep import plan_sweep

    plan = plan_sweep(path, {})  # every cell's RunConfig is built and validated
    assert plan.cells
    build_config(path, {"backend": "local"})  # and simulate --config takes it
    name = os.path.basename(path)
    if name.startswith(("table", "figure")):
        text = open(path, encoding="utf-8").read()
        number = name.split("-")[0].replace("table", "Table ").replace("figure", "Figure ")
        assert text.startswith(f"# {number} of the paper"), "a comment cites what it reproduces"
        assert plan.seeds == [42, 43, 44] and len(plan.algorithms) >= 1 and plan.datasets
        assert plan.cells[0].values["rounds"] == 200 and plan.cells[0].values["clients"] == 20


def test_every_table_and_figure_has_a_config():
    names = {os.path.basename(p).split("-")[0] for p in CONFIGS}
    assert {f"table{i}" for i in range(3, 8)} | {f"figure{i}" for i in range(3, 9)} <= names


def test_cells_run_as_ray_tasks(tmp_path):
    ray = pytest.importorskip("ray", reason="needs Ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 ** 2,
             logging_level="warning")
    try:
        config = tmp_path / "two.yaml"
        config.write_text(yaml.safe_dump({"sweep": {"datasets": ["digits"], "algorithms": ["hasfl"],
                                                    "seeds": [42, 43]}}))
        out = str(tmp_path / "out")
        result = sweep(str(config), "--rounds", "2", "--clients", "6", "--clients-per-round", "3",
                       "--backend", "ray", "--out", out, "--quiet")
        assert result.exit_code == 0, result.output
        assert "one Ray task per cell" in result.output
        assert statuses(out) == {"digits-hasfl-seed42": "done", "digits-hasfl-seed43": "done"}
        # the same as the local path, bit for bit
        local = sweep(str(config), "--rounds", "2", "--clients", "6", "--clients-per-round", "3",
                      "--backend", "local", "--out", str(tmp_path / "local"), "--quiet", "--seeds", "42")
        assert local.exit_code == 0, local.output
        sha = [json.load(open(os.path.join(d, "digits-hasfl-seed42", "summary.json")))["params_sha256"]
               for d in (out, str(tmp_path / "local"))]
        assert sha[0] == sha[1]
    finally:
        ray.shutdown()


def test_a_cell_with_the_config_of_another_sweeps_finished_cell_is_reused_not_rerun(sweep_yaml, tmp_path):
    first = str(tmp_path / "runs" / "table")
    assert sweep(sweep_yaml, "--backend", "local", "--quiet", *TINY, "--out", first).exit_code == 0
    other = tmp_path / "figure.yaml"
    other.write_text(yaml.safe_dump({
        "sweep": {"reproduces": "a figure drawn from the table's runs", "datasets": ["digits"],
                  "algorithms": ["hasfl", "random-budget", "fedavg"], "seeds": [42]},
        "alpha": 0.3, "checkpoint_every": 1}))
    second = str(tmp_path / "runs" / "figure")
    result = sweep(str(other), "--backend", "local", "--quiet", *TINY, "--out", second)
    assert result.exit_code == 0, result.output
    assert statuses(second) == {"digits-hasfl-seed42": "reused", "digits-random-budget-seed42": "reused",
                                "digits-fedavg-seed42": "done"}
    for cell in ("digits-hasfl-seed42", "digits-random-budget-seed42"):
        mine = json.load(open(os.path.join(second, cell, "summary.json")))
        theirs = json.load(open(os.path.join(first, cell, "summary.json")))
        assert mine["params_sha256"] == theirs["params_sha256"] and mine["reused_from"].endswith(cell)
        assert not os.path.exists(os.path.join(second, cell, "checkpoints"))
    assert "reused the finished run" in result.output
    again = sweep(str(other), "--backend", "local", "--quiet", *TINY, "--out", second)  # now its own: skipped
    assert set(statuses(second).values()) == {"skipped"}, again.output
    changed = sweep(str(other), "--backend", "local", "--quiet", *TINY, "--lr", "0.02", "--out",
                    str(tmp_path / "runs" / "other-lr"))
    assert set(statuses(str(tmp_path / "runs" / "other-lr")).values()) == {"done"}, changed.output
