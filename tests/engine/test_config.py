"""RunConfig validation: every bad value is refused with one sentence naming it."""

import pytest

from hasfl_ray.engine.config import RunConfig, load_yaml_config
from hasfl_ray.errors import ConfigError


@pytest.mark.parametrize("values, message", [
    ({"rounds": 0}, "rounds is 0"),
    ({"rounds": -3}, "rounds is -3"),
    ({"clients": 5, "clients_per_round": 6}, "clients_per_round is 6 but clients is 5"),
    ({"alpha": 0}, "alpha is 0"),
    ({"alpha": -1.0}, "alpha is -1.0"),
    ({"p_min": 0.0}, "p_min is 0.0"),
    ({"p_min": 1.2}, "p_min is 1.2"),
    ({"beta": 1.5}, "beta is 1.5"),
    ({"lr": 0}, "lr is 0"),
    ({"batch_size": 0}, "batch_size is 0"),
    ({"seed": -1}, "seed is -1"),
    ({"backend": "mpi"}, "backend is 'mpi'"),
])
def test_bad_values_are_refused_in_one_sentence(values, message):
    with pytest.raises(ConfigError) as info:
        RunConfig(**values)
    text = str(info.value)
    assert message in text and "expected" in text and "\n" not in text


@pytest.mark.parametrize("values, message", [
    ({"dataset": "mnist"}, "dataset is 'mnist'; did you mean 'emnist'?"),
    ({"algorithm": "fedfoo"}, "algorithm is 'fedfoo'; did you mean 'fedprox'?"),
])
def test_unknown_names_are_refused_where_the_registry_resolves_them(values, message):
    RunConfig(**values)  # the config knows no algorithm or dataset; resolving it looks them up
    with pytest.raises(ConfigError) as info:
        RunConfig(**values).resolved()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unknown_key_is_refused():
    with pytest.raises(ConfigError, match="unknown key 'roundz'"):
        RunConfig.from_dict({"roundz": 3})


def test_resolved_takes_dataset_protocol_defaults():
    config = RunConfig(dataset="digits").resolved()
    assert config.rounds == 50 and config.batch_size == 32 and config.clip_norm == 10.0
    assert RunConfig(dataset="digits", rounds=7).resolved().rounds == 7


def test_yaml_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_yaml_config(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml_config(str(bad))
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="holds a list"):
        load_yaml_config(str(listy))


def test_device_auto_resolves_to_what_this_process_sees():
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert RunConfig().device == "auto"
    assert RunConfig().resolved().device == expected
    assert RunConfig(device="cpu").resolved().device == "cpu"
    with pytest.raises(ConfigError, match="device is 'tpu'"):
        RunConfig(device="tpu")
