"""The plug-in API (docs/plugins.md): examples/loss_policy.py run three ways with no edit to the
package, its options from --algo-opt and YAML (bad ones refused in one sentence), bad specs refused in one sentence,
examples/my_dataset.py as --dataset, random-budget matched to a plug-in run, and a sweep of a plug-in."""

import json
import os
import shutil

import pytest
import yaml
from click.testing import CliRunner

import hasfl_ray
from hasfl_ray.cli.main import main
from hasfl_ray.config import RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import lookup

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLICY = os.path.join(REPO, "examples", "loss_policy.py")
DATASET = os.path.join(REPO, "examples", "my_dataset.py")
TINY = ["--backend", "local", "--rounds", "3", "--clients", "6", "--clients-per-round", "3", "--quiet"]


def simulate(*args):
    return CliRunner().invoke(main, ["simulate", *TINY, *args])


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


def stored_config(run_dir):
    with open(os.path.join(run_dir, "config.yaml"), encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture
def package(tmp_path, monkeypatch):
    """examples/loss_policy.py as an importable module my_package.module."""
    root = tmp_path / "site"
    (root / "my_package").mkdir(parents=True)
    (root / "my_package" / "__init__.py").write_text("")
    shutil.copy(POLICY, root / "my_package" / "module.py")
    monkeypatch.syspath_prepend(str(root))
    return "my_package.module:LossPolicy"


def test_loss_policy_runs_three_ways_with_the_same_result(tmp_path, package):
    by_file = tmp_path / "file"
    result = simulate("--algorithm", f"{POLICY}:LossPolicy", "--algo-opt", "warmup=1", "--out", str(by_file))
    assert result.exit_code == 0, result.output
    by_module = tmp_path / "module"
    result = simulate("--algorithm", package, "--algo-opt", "warmup=1", "--out", str(by_module))
    assert result.exit_code == 0, result.output
    assert stored_config(by_module)["algorithm"] == package
    # from Python, with the class itself: the summary comes back
    policy = lookup("algorithm", package)
    config = RunConfig(backend="local", rounds=3, clients=6, clients_per_round=3)
    from_python = hasfl_ray.simulate(config, algorithm=policy, algorithm_options={"warmup": 1},
                                     out_dir=str(tmp_path / "python"))
    assert from_python["rounds"] == 3 and 0 < from_python["avg_p"] <= 1
    assert summary(by_file)["params_sha256"] == summary(by_module)["params_sha256"] == from_python["params_sha256"]
    # the policy adapted: widths differ from p_max (HeteroFL) after its warm-up
    heterofl = hasfl_ray.simulate(config, algorithm="heterofl")
    assert heterofl["params_sha256"] != from_python["params_sha256"]
    assert issubclass(policy, hasfl_ray.Algorithm)


def test_a_module_in_the_current_directory_is_found(tmp_path, monkeypatch):
    (tmp_path / "policies_here").mkdir()
    (tmp_path / "policies_here" / "__init__.py").write_text("")
    shutil.copy(POLICY, tmp_path / "policies_here" / "loss.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    result = simulate("--algorithm", "policies_here.loss:LossPolicy", "--rounds", "1", "--out", str(tmp_path / "r"))
    assert result.exit_code == 0, result.output


def test_options_come_from_the_command_line_and_yaml(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"algorithm": f"{POLICY}:LossPolicy",
                                      "algorithm_options": {"gain": 0.25, "min_width": 0.35}}))
    out = tmp_path / "run"
    result = simulate("--config", str(config), "--algo-opt", "gain=0.5", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert stored_config(out)["algorithm_options"] == {"min_width": 0.35, "gain": 0.5, "warmup": 2}  # flag wins
    assert summary(out)["avg_p_post_warmup"] is None or summary(out)["avg_p_post_warmup"] > 0


@pytest.mark.parametrize("options, needle", [
    (["--algo-opt", "gian=0.5"], "did you mean 'gain'?"),
    (["--algo-opt", "gain=abc"], "gain is 'abc'; expected a number"),
    (["--algo-opt", "warmup=1.5"], "warmup is 1.5; expected an integer"),
    (["--algo-opt", "min_width=2"], "min_width is 2.0; expected a width in (0, 1]"),
    (["--algo-opt", "gain"], "--algo-opt is 'gain'; expected KEY=VALUE"),
])
def test_bad_options_are_one_sentence(tmp_path, options, needle):
    result = simulate("--algorithm", f"{POLICY}:LossPolicy", *options, "--out", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0
    assert not (tmp_path / "run").exists()


def test_yaml_options_are_checked_too(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"algorithm": f"{POLICY}:LossPolicy", "algorithm_options": {"gian": 1}}))
    result = simulate("--config", str(config), "--out", str(tmp_path / "run"))
    assert result.exit_code == 2 and "did you mean 'gain'?" in result.output
    result = simulate("--algorithm", "hasfl", "--algo-opt", "gain=1", "--out", str(tmp_path / "run"))
    assert result.exit_code == 2 and "algorithm option 'gain' is unknown to 'hasfl'" in result.output


@pytest.mark.parametrize("spec, needle", [
    ("examples/nowhere.py:LossPolicy", "does not exist"),
    (f"{POLICY}:LossPolicyy", "has no class 'LossPolicyy'; did you mean 'LossPolicy'?"),
    (f"{POLICY}:LossPolicyOptions", "is not a subclass of hasfl_ray.Algorithm"),
    ("no_such_module_here:Policy", "no module 'no_such_module_here'"),
    ("hasfl_ray.errors:ConfigError", "is not a subclass of hasfl_ray.Algorithm"),
])
def test_bad_specs_are_one_sentence(tmp_path, spec, needle):
    result = simulate("--algorithm", spec, "--out", str(tmp_path / "run"))
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0
    with pytest.raises(ConfigError):
        hasfl_ray.simulate({"rounds": 1}, algorithm=spec)


def test_dataset_plugin_declares_model_defaults_and_ground_truth(tmp_path):
    out = tmp_path / "run"
    result = simulate("--dataset", f"{DATASET}:MyDataset", "--algorithm", "hasfl", "--out", str(out))
    assert result.exit_code == 0, result.output
    config = stored_config(out)
    assert config["dataset"] == f"{DATASET}:MyDataset"
    assert config["lr"] == 0.05 and config["batch_size"] == 16 and config["local_epochs"] == 1  # its defaults
    with open(out / "clients.csv", encoding="utf-8") as handle:
        rows = handle.read().splitlines()
    assert len(rows) == 7 and all(0 <= float(r.split(",")[3]) <= 1 for r in rows[1:])  # tv_distance
    assert 0 <= summary(out)["final_accuracy"] <= 1
    from hasfl_ray.models import MODEL_CONFIGS

    assert MODEL_CONFIGS["csv-mlp"]["kind"] == "mlp"


def test_random_budget_matches_a_plugin_run(tmp_path):
    plugin = tmp_path / "plugin"
    result = simulate("--algorithm", f"{POLICY}:LossPolicy", "--warmup", "1", "--t-adapt", "1", "--out", str(plugin))
    assert result.exit_code == 0, result.output
    target = summary(plugin)["avg_p_post_warmup"]
    assert target is not None  # plug-in runs write the key random-budget reads
    matched = tmp_path / "matched"
    result = simulate("--algorithm", "random-budget", "--budget-from", str(plugin), "--warmup", "1", "--t-adapt",
                      "1", "--out", str(matched))
    assert result.exit_code == 0, result.output
    assert stored_config(matched)["algorithm_options"]["budget"] == pytest.approx(target)


def test_resume_and_report_read_a_plugin_run(tmp_path):
    out = tmp_path / "run"
    result = simulate("--algorithm", f"{POLICY}:LossPolicy", "--algo-opt", "warmup=1", "--checkpoint-every", "1",
                      "--out", str(out))
    assert result.exit_code == 0, result.output
    again = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert again.exit_code == 0, again.output  # its config.yaml names the plug-in and its options
    assert summary(out)["rounds"] == 3
    report = CliRunner().invoke(main, ["report", str(out)])
    assert report.exit_code == 0, report.output


def test_sweep_accepts_a_plugin(tmp_path):
    config = tmp_path / "sweep.yaml"
    config.write_text(yaml.safe_dump({"sweep": {"datasets": ["digits"], "algorithms": [f"{POLICY}:LossPolicy"],
                                                "seeds": [42]}, "algorithm_options": {"warmup": 1}}))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["sweep", str(config), "--rounds", "2", "--clients", "6",
                                       "--clients-per-round", "3", "--backend", "local", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert summary(out / "digits-LossPolicy-seed42")["rounds"] == 2
    bad = CliRunner().invoke(main, ["sweep", str(config), "--algorithms", f"{POLICY}:Nope", "--out", str(out)])
    assert bad.exit_code == 2 and "has no class 'Nope'" in bad.output
