"""Every --algorithm: registered, configurable from the CLI, and learning far above chance in a few rounds."""

import json

import pytest
from click.testing import CliRunner

from algorithm_runs import LEARNING_RUN, recorded_run
from hasfl_ray.algorithms import ALGORITHMS, algorithm_class
from hasfl_ray.cli.main import main
from hasfl_ray.config import RunConfig
from hasfl_ray.errors import ConfigError

RUNS = [dict(algorithm=name) for name in ALGORITHMS if name != "random-budget"] + [
    dict(algorithm="random-budget", budget=0.42), dict(algorithm="hasfl", coverage=False)]


def test_every_algorithm_is_registered_under_its_name():
    assert set(ALGORITHMS) == {"hasfl", "heterofl", "fjord", "uniform", "random-budget", "fedavg", "fedprox",
                               "scaffold", "fedrolex", "fluid", "depthfl", "scalefl", "fiarse",
                               "fedgmr"}
    for name in ALGORITHMS:
        assert algorithm_class(name).name == name


@pytest.mark.parametrize("overrides", RUNS, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_each_algorithm_learns_far_above_chance(overrides):
    run = recorded_run(**overrides, **LEARNING_RUN)
    best = max(line["test_accuracy"] for line in run.history)
    assert best > 0.4, best  # ten classes: chance is 0.1


@pytest.mark.parametrize("values, needle", [
    ({"algorithm": "fedprox", "mu": -1.0}, "mu is -1.0"),
    ({"algorithm": "random-budget", "budget": 0.0}, "budget is 0.0"),
    ({"algorithm": "random-budget", "budget": 1.5}, "budget is 1.5"),
    ({"algorithm": "random-budget", "budget_from": ""}, "budget_from is ''"),
    ({"algorithm": "heterofl", "heterofl_weighting": "equal"}, "heterofl_weighting is 'equal'"),
    ({"algorithm": "fjord", "fjord_distill_weight": -0.5}, "fjord_distill_weight is -0.5"),
    ({"algorithm": "scaffold", "scaffold_global_lr": 0}, "scaffold_global_lr is 0"),
    ({"algorithm": "fedrolex", "rolex_step": -1}, "rolex_step is -1"),
    ({"algorithm": "hasfl", "t_norm": 0}, "t_norm is 0"),
    ({"algorithm": "fiarse", "algorithm_options": {"fiarse_size": "cube"}}, "fiarse_size is 'cube'"),
    ({"algorithm": "fiarse", "algorithm_options": {"fiarse_scope": "layer"}}, "fiarse_scope is 'layer'"),
    ({"algorithm": "fedgmr", "algorithm_options": {"fedgmr_restore_every": 0}}, "fedgmr_restore_every is 0"),
    ({"algorithm": "hasfl", "coverage": "yes"}, "coverage is 'yes'"),
    ({"algorithm": "hasfl", "algorithm_options": {"beta": 1.5}}, "beta is 1.5"),
    ({"momentum": 1.5}, "momentum is 1.5"),
    ({"algorithm": "hasfl", "mu": 0.5}, "mu is 0.5 but algorithm 'hasfl' takes no option 'mu'"),
])
def test_bad_algorithm_options_are_one_sentence(values, needle):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({"backend": "local", **values})
    assert needle in str(info.value) and "expected" in str(info.value) and "\n" not in str(info.value)


def test_cli_flags_reach_the_config(tmp_path):
    hasfl_run = tmp_path / "hasfl"
    hasfl_run.mkdir()
    (hasfl_run / "summary.json").write_text(json.dumps({"avg_p": 0.47}))
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--algorithm", "random-budget",
                                       "--budget-from", str(hasfl_run), "--rounds", "1", "--clients-per-round", "3", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    config = (out / "config.yaml").read_text()
    assert "budget: 0.47" in config and "algorithm: random-budget" in config
    both = CliRunner().invoke(main, ["simulate", "--algorithm", "random-budget", "--budget", "0.5",
                                     "--budget-from", str(hasfl_run), "--out", str(tmp_path / "x")])
    assert both.exit_code == 2 and "both given" in both.output
    missing = CliRunner().invoke(main, ["simulate", "--algorithm", "random-budget", "--budget-from",
                                        str(tmp_path / "nope"), "--out", str(tmp_path / "y")])
    assert missing.exit_code == 2 and "has no summary.json" in missing.output
    assert not (tmp_path / "y").exists()
