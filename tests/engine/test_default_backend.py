"""One default-backend rule for the command line, the Python API and RunConfig: ``auto`` is Ray where it is
installed, else local (hasfl_ray.config.default_backend)."""

import sys

import pytest
import yaml
from click.testing import CliRunner

import hasfl_ray
from hasfl_ray.cli.main import main
from hasfl_ray.cli.simulate import build_config
from hasfl_ray.config import RunConfig, default_backend
from hasfl_ray.errors import RAY_INSTALL, ConfigError
from hasfl_ray.simulation import ray_available

TINY = dict(rounds=1, clients=6, clients_per_round=3, seed=5)


def test_the_rule_is_ray_where_ray_is_installed():
    assert RunConfig().backend == "auto"
    assert default_backend() == ("ray" if ray_available() else "local")
    assert RunConfig().resolved().backend == default_backend()


def test_the_cli_and_the_api_resolve_auto_the_same_way(monkeypatch):
    for rule in ("local", "ray"):
        monkeypatch.setattr("hasfl_ray.config.runconfig.default_backend", lambda rule=rule: rule)
        assert build_config(None, {}).resolved().backend == rule  # hasfl-ray simulate without --backend
        assert RunConfig.from_dict({}).resolved().backend == rule  # hasfl_ray.simulate without backend=


def test_without_ray_both_run_locally_and_ray_options_ask_for_ray(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError; find_spec says no Ray
    assert default_backend() == "local"
    summary = hasfl_ray.simulate(TINY, out_dir=str(tmp_path / "api"))
    assert summary["rounds"] == 1
    result = CliRunner().invoke(main, ["simulate", "--rounds", "1", "--clients", "6", "--clients-per-round", "3",
                                       "--seed", "5", "--out", str(tmp_path / "cli"), "--quiet"])
    assert result.exit_code == 0, result.output
    for name in ("api", "cli"):
        text = (tmp_path / name / "config.yaml").read_text()
        assert yaml.safe_load(text)["backend"] == "local" and "# backend: local" in text
    assert result.output.count(summary["params_sha256"]) == 1  # the same run either way
    with pytest.raises(ConfigError, match=f"actors is 2 but Ray is not installed; install it with `{RAY_INSTALL}`"):
        RunConfig(actors=2).resolved()
