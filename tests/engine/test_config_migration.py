"""config_version 2 (the algorithm's options in algorithm_options) and the migration of version-1 run directories.

tests/engine/data/v1-runs/ holds two run directories written by hasfl-ray at commit 9338156 (config_version 1: every
built-in's options as flat keys), each stopped by ``--fault-inject trainer-error@2`` after checkpointing rounds 0
and 1 of 4 (digits, 6 clients, 3 a round, seed 5):

- fedprox: ``mu 0.3``;
- hasfl: ``p_min 0.3, gamma 0.3, beta 0.8, t_norm 2, warmup 1, t_adapt 1``.

The same commit ran each config uninterrupted to the params_sha256 in :data:`V1_UNINTERRUPTED`.
"""

import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import hasfl_ray
from hasfl_ray.cli.main import main
from hasfl_ray.engine.config import CONFIG_VERSION, LEGACY_OPTION_KEYS, RunConfig, migrate_config
from hasfl_ray.errors import ConfigError

V1_RUNS = Path(__file__).parent / "data" / "v1-runs"
COMMON = dict(rounds=4, clients=6, clients_per_round=3, seed=5, backend="local")
CONFIGS = {"fedprox": dict(algorithm="fedprox", mu=0.3),
           "hasfl": dict(algorithm="hasfl", p_min=0.3, gamma=0.3, beta=0.8, t_norm=2, warmup=1, t_adapt=1)}
#: params_sha256 of the uninterrupted runs, as commit 9338156 computed them.
V1_UNINTERRUPTED = {"fedprox": "54328afd0de73a6a901e9c8f5d4fafb6f236dfb9ffd8b7a4bf4b853829892da8",
                    "hasfl": "1366bcd1825cea30016c55a9a08760e08ae2caba9df7d8915afa1545beb897ac"}


def v1_config(name):
    with open(V1_RUNS / name / "config.yaml", encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def test_the_fixtures_are_version_1():
    for name in CONFIGS:
        stored = v1_config(name)
        assert "config_version" not in stored and set(LEGACY_OPTION_KEYS) <= set(stored)


def test_migration_keeps_the_algorithms_options_and_drops_the_others():
    fedprox = migrate_config(v1_config("fedprox"))
    assert fedprox["algorithm_options"] == {"mu": 0.3}
    assert not set(LEGACY_OPTION_KEYS) & set(fedprox)
    hasfl = migrate_config(v1_config("hasfl"))
    assert hasfl["algorithm_options"] == {"coverage": True, "p_min": 0.3, "gamma": 0.3, "beta": 0.8, "t_norm": 2,
                                          "epsilon": 1e-8}
    assert hasfl["warmup"] == 1 and hasfl["t_adapt"] == 1  # the schedule stays the protocol's
    # migrated, it builds the same resolved config as the options given today
    for name, values in CONFIGS.items():
        stored = RunConfig.from_dict(migrate_config(v1_config(name))).resolved().result_dict()
        today = RunConfig.from_dict({**COMMON, **values}).resolved().result_dict()
        assert {k: v for k, v in stored.items() if k != "fault_inject"} == today


def test_a_plugin_runs_options_were_always_in_algorithm_options():
    stored = {**v1_config("fedprox"), "algorithm": "examples/loss_policy.py:LossPolicy",
              "algorithm_options": {"gain": 0.5}}
    assert migrate_config(stored)["algorithm_options"] == {"gain": 0.5}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_version_1_run_resumes_bit_identical_to_an_uninterrupted_run(tmp_path, name):
    run = tmp_path / name
    shutil.copytree(V1_RUNS / name, run)
    result = CliRunner().invoke(main, ["simulate", "--out", str(run), "--resume", "--quiet"])
    assert result.exit_code == 0, result.output
    resumed = yaml.safe_load((run / "config.yaml").read_text())
    assert resumed["config_version"] == CONFIG_VERSION and not set(LEGACY_OPTION_KEYS) & set(resumed)
    straight = hasfl_ray.simulate({**COMMON, **CONFIGS[name]})
    import json

    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] == 4
    assert summary["params_sha256"] == straight["params_sha256"] == V1_UNINTERRUPTED[name]


def test_a_version_1_run_with_other_options_is_refused_naming_the_option(tmp_path):
    run = tmp_path / "fedprox"
    shutil.copytree(V1_RUNS / "fedprox", run)
    result = CliRunner().invoke(main, ["simulate", "--out", str(run), "--resume", "--mu", "0.5", "--quiet"])
    assert result.exit_code == 2 and "mu 0.3 -> 0.5" in result.output, result.output


def test_config_yaml_is_version_2_and_a_newer_version_is_refused(tmp_path):
    out = tmp_path / "run"
    hasfl_ray.simulate({**COMMON, "rounds": 1}, algorithm="fedprox", mu=0.2, out_dir=str(out))
    text = (out / "config.yaml").read_text()
    assert text.startswith(f"config_version: {CONFIG_VERSION}\n")
    stored = yaml.safe_load(text)
    assert stored["algorithm_options"] == {"mu": 0.2} and "mu" not in stored
    # the file is a config: simulate --config replays it
    again = CliRunner().invoke(main, ["simulate", "--config", str(out / "config.yaml"), "--out",
                                      str(tmp_path / "again"), "--quiet"])
    assert again.exit_code == 0, again.output
    stored["config_version"] = CONFIG_VERSION + 1
    with pytest.raises(ConfigError, match=f"config_version {CONFIG_VERSION + 1}; expected 1 to {CONFIG_VERSION}"):
        RunConfig.from_dict(stored)
