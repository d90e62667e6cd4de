"""--data-seed: the federation (the partition, the capacity tiers, the device population) drawn apart from --seed (the
initialisation, the sampling, the training), and unset by default, when it is the seed (issue 45 item 3)."""

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.config import RunConfig
from hasfl_ray.engine import Engine
from hasfl_ray.engine.checkpoint import config_differences
from hasfl_ray.errors import ConfigError

TINY = dict(backend="local", rounds=2, clients=6, clients_per_round=3)


def prepared(**values):
    engine = Engine(RunConfig(**TINY, **values))
    engine.prepare()
    return engine


def partition(engine):
    return [ix.tolist() for ix in engine.dataset.client_indices]


def same_params(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_data_seed_changes_the_partition_and_tiers_not_the_initialisation():
    base, other = prepared(seed=42), prepared(seed=42, data_seed=7)
    assert partition(base) != partition(other)
    assert base.p_max.tolist() != other.p_max.tolist() or base.num_samples.tolist() != other.num_samples.tolist()
    assert same_params(base.initial_params, other.initial_params)


def test_seed_with_the_data_seed_held_keeps_the_partition():
    first, second = prepared(seed=1, data_seed=7), prepared(seed=2, data_seed=7)
    assert partition(first) == partition(second) and first.p_max.tolist() == second.p_max.tolist()
    assert not same_params(first.initial_params, second.initial_params)
    assert partition(prepared(seed=7)) == partition(first)  # data seed 7 is what seed 7 alone draws


def test_the_device_population_follows_the_data_seed():
    first = prepared(seed=1, data_seed=7, devices="lognormal").clock.profiles
    second = prepared(seed=2, data_seed=7, devices="lognormal").clock.profiles
    third = prepared(seed=1, data_seed=8, devices="lognormal").clock.profiles
    assert first.latency.tolist() == second.latency.tolist() != third.latency.tolist()


def test_unset_is_the_seed_and_trains_bit_identically():
    """Every run of before keeps its params_sha256: no data_seed is the seed's own draw, to the bit."""
    unset = Engine(RunConfig(**TINY, seed=5)).run()
    given = Engine(RunConfig(**TINY, seed=5, data_seed=5)).run()
    assert unset["params_sha256"] == given["params_sha256"]
    assert RunConfig(seed=5).resolved().data_seed is None and RunConfig(seed=5).effective_data_seed == 5


def test_resume_compares_the_data_seed_as_drawn():
    """A stored run of before the key (no data_seed) drew its data from its seed: the same config resumes it, another
    data seed is a difference named in the sentence."""
    stored = RunConfig(**TINY, seed=5).resolved().to_dict()
    stored.pop("data_seed")
    assert config_differences(stored, RunConfig(**TINY, seed=5).resolved()) == []
    assert config_differences(stored, RunConfig(**TINY, seed=5, data_seed=5).resolved()) == []
    assert config_differences(stored, RunConfig(**TINY, seed=5, data_seed=6).resolved()) == ["data_seed 5 -> 6"]


@pytest.mark.parametrize("value", [-1, 1.5, True, "7"])
def test_a_bad_data_seed_is_one_sentence(value):
    with pytest.raises(ConfigError, match=r"^data_seed is .*; expected a non-negative integer"):
        RunConfig(data_seed=value)


def test_the_flag_reaches_the_run_and_a_bad_one_exits_2(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "1", "--clients", "6",
                                       "--clients-per-round", "3", "--quiet", "--data-seed", "9", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "data_seed: 9" in (out / "config.yaml").read_text()
    bad = CliRunner().invoke(main, ["simulate", "--data-seed", "-3", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "data_seed is -3" in bad.output and not (tmp_path / "bad").exists()
