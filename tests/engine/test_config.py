"""RunConfig validation: every bad value is refused with one sentence naming it."""

import re

import pytest

from hasfl_ray.config import RunConfig, load_yaml_config
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
        RunConfig.from_dict(values)
    text = str(info.value)
    assert message in text and "expected" in text and "\n" not in text


@pytest.mark.parametrize("values, message", [
    ({"dataset": "mnist"}, "dataset is 'mnist'; did you mean 'emnist'?"),
    ({"algorithm": "fedfoo"}, "algorithm is 'fedfoo'; did you mean 'fedprox'?"),
])
def test_unknown_names_are_refused_where_the_registry_resolves_them(values, message):
    RunConfig(backend="local", **values)  # the config knows no algorithm or dataset; resolving it looks them up
    with pytest.raises(ConfigError) as info:
        RunConfig(backend="local", **values).resolved()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unknown_key_is_refused():
    with pytest.raises(ConfigError, match="unknown key 'roundz'"):
        RunConfig.from_dict({"roundz": 3})


def test_resolved_takes_dataset_protocol_defaults():
    config = RunConfig(backend="local", dataset="digits").resolved()
    assert config.rounds == 50 and config.batch_size == 32 and config.clip_norm == 10.0
    assert RunConfig(backend="local", dataset="digits", rounds=7).resolved().rounds == 7


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
    assert RunConfig(backend="local").device == "auto"
    assert RunConfig(backend="local").resolved().device == expected
    assert RunConfig(backend="local", device="cpu").resolved().device == "cpu"
    with pytest.raises(ConfigError, match="device is 'tpu'"):
        RunConfig(backend="local", device="tpu")


def _real_fields():
    """Every RunConfig field that holds a real number (float or Optional[float])."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(RunConfig)
    return [f.name for f in dataclasses.fields(RunConfig) if float in (hints[f.name], *typing.get_args(hints[f.name]))]


def test_every_real_field_is_covered():
    assert {"alpha", "lr", "weight_decay", "clip_norm", "gpus_per_actor", "synthetic_alpha"} <= set(_real_fields())
    assert {("hasfl", "gamma"), ("fedprox", "mu"), ("scaffold", "scaffold_global_lr"), ("hasfl", "epsilon"),
            ("random-budget", "budget")} <= set(_real_options())


def _real_options():
    """(built-in algorithm, option) for every option of a built-in's options dataclass that holds a real number."""
    import dataclasses
    import typing

    from hasfl_ray.algorithms import ALGORITHMS, algorithm_class

    out = []
    for name in ALGORITHMS:
        options_class = algorithm_class(name).options_class
        if options_class is None:
            continue
        hints = typing.get_type_hints(options_class)
        out += [(name, f.name) for f in dataclasses.fields(options_class)
                if float in (hints[f.name], *typing.get_args(hints[f.name]))]
    return out


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e39, 10 ** 400])
@pytest.mark.parametrize("algorithm, name", _real_options())
def test_every_real_option_of_a_builtin_refuses_nan_infinity_and_float32_overflow(algorithm, name, value):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_dict({"algorithm": algorithm, name: value})
    text = str(info.value)
    assert text.startswith(f"{name} is ") and "expected" in text and "finite" in text and "\n" not in text and \
        len(text) < 200, text


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e39, 10 ** 400])
@pytest.mark.parametrize("name", _real_fields())
def test_every_real_field_refuses_nan_infinity_and_float32_overflow(name, value):
    extra = {"backend": "ray"} if name == "gpus_per_actor" else {}
    with pytest.raises(ConfigError) as info:
        RunConfig(**{"backend": "local", name: value, **extra})
    text = str(info.value)
    assert text.startswith(f"{name} is ") and "expected" in text and "\n" not in text and len(text) < 200, text


def test_lr_has_a_float32_safe_maximum():
    assert RunConfig(backend="local", lr=1000.0).lr == 1000.0
    with pytest.raises(ConfigError, match=r"^lr is 1000.5; expected a number > 0 and at most 1000 \(a larger step "
                                          r"overflows float32 weights\)$"):
        RunConfig(backend="local", lr=1000.5)


def test_a_repeated_key_is_refused_by_name_at_any_depth(tmp_path):
    from hasfl_ray.config import strict_yaml_load

    config = tmp_path / "c.yaml"
    config.write_text("dataset: digits\nlr: 0.05\nrounds: 2\nlr: 5.0\n")
    with pytest.raises(ConfigError, match=r"^config file '.*c.yaml' gives the key 'lr' twice at line 4; expected "
                                          r"each key once$"):
        load_yaml_config(str(config))
    config.write_text("per_dataset:\n  digits: {rounds: 2, rounds: 3}\n")
    with pytest.raises(ConfigError, match="gives the key 'rounds' twice at line 2"):
        load_yaml_config(str(config))
    # a merge may still be overridden: that is YAML's own rule, not a repeat
    assert strict_yaml_load("a: &x {b: 1}\nc:\n  <<: *x\n  b: 2\n") == {"a": {"b": 1}, "c": {"b": 2}}
    config.write_text("lr: 0.05\nrounds: 2\n")
    assert load_yaml_config(str(config)) == {"lr": 0.05, "rounds": 2}


def test_a_config_file_that_is_not_text_is_one_sentence(tmp_path):
    config = tmp_path / "noise.yaml"
    config.write_bytes(bytes([0xc3, 0x28, 0xa0, 0xa1]) + bytes(range(200)))
    with pytest.raises(ConfigError, match=r"^config file '.*noise.yaml' is not UTF-8 text \(byte 0xc3 at offset "
                                          r"0\); expected a YAML file of config keys$"):
        load_yaml_config(str(config))


def test_plug_in_float_options_refuse_nan_and_infinity():
    from dataclasses import dataclass

    from hasfl_ray.registry import check_options

    @dataclass
    class Options:
        gain: float = 0.5
        steps: int = 1

    assert check_options("algorithm", "mine", Options, {"gain": 2, "steps": 3}) == {"gain": 2.0, "steps": 3}
    for value, shown in ((float("nan"), "nan"), (float("inf"), "inf"), (1e39, "1e+39"), (10 ** 50, "1" + "0" * 19)):
        with pytest.raises(ConfigError, match=rf"^algorithm option 'gain' is {re.escape(shown)}.*; expected a finite"):
            check_options("algorithm", "mine", Options, {"gain": value})


def test_a_client_count_beyond_memory_is_one_sentence_with_the_estimate(monkeypatch):
    from hasfl_ray.data import memory

    monkeypatch.setattr(memory, "physical_memory", lambda: 176 * 10 ** 8)
    memory.check_client_memory(100_000_000)  # 17.6 GB exactly: fits
    with pytest.raises(ConfigError, match=r"^clients is 100000001, which needs about 17.6 GB of memory \(176 bytes "
                                          r"a client\) but this machine has 17.6 GB; expected at most about "
                                          r"100,000,000 clients$"):
        memory.check_client_memory(100_000_001)


def test_the_client_memory_estimate_is_the_measured_one_with_a_clock_and_async():
    """Battery 5's smaller notes (A181, A183, A184): the estimate assumed 64 bytes a client while 10^7 synthetic
    clients took 1.66 GB (166 bytes a client) without a clock, 2.52 GB with --devices lognormal and 3.08 GB
    asynchronous with Markov availability; it is now at least each measurement."""
    from hasfl_ray.engine.preparing import bytes_per_client

    plain = RunConfig(backend="local", dataset="synthetic")
    clocked = RunConfig(backend="local", dataset="synthetic", devices="lognormal")
    asynchronous = RunConfig(backend="local", dataset="synthetic", devices="lognormal", mode="async",
                             clients_per_round=4, concurrency=4, buffer_size=2)
    for config, measured in ((plain, 1.66e9), (clocked, 2.52e9), (asynchronous, 3.08e9)):
        assert measured <= bytes_per_client(config) * 10 ** 7 <= 1.25 * measured, config.mode


def test_a_device_this_machine_lacks_is_refused_before_a_run_directory_exists(tmp_path, monkeypatch):
    import torch

    from hasfl_ray.engine import Engine

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    engine = Engine(RunConfig(device="cuda", backend="local", rounds=1), out_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"^device is 'cuda' but torch finds no GPU on this machine"):
        engine.prepare()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    engine = Engine(RunConfig(device="cuda:1", backend="local", rounds=1), out_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"^device is 'cuda:1' but this machine has 1 GPU\(s\); expected cuda:0"):
        engine.prepare()
    assert not (tmp_path / "run").exists()


def test_flat_option_keys_and_algorithm_options_layer_like_every_other_key():
    from hasfl_ray.config import merge_layers

    with pytest.raises(ConfigError, match=r"gives 'mu' both as a key \(0.5\) and in algorithm_options \(0.3\)"):
        RunConfig.from_dict({"algorithm": "fedprox", "mu": 0.5, "algorithm_options": {"mu": 0.3}})
    # a flag over a file's mapping wins key by key; the file's other options stay
    merged = merge_layers([({"algorithm": "hasfl", "algorithm_options": {"p_min": 0.3, "gamma": 0.1}}, "drop"),
                           ({"p_min": 0.35}, "refuse")])
    assert merged["algorithm_options"] == {"p_min": 0.35, "gamma": 0.1}
    # a layer naming another algorithm keeps its flat keys that the final one takes, never its options mapping
    merged = merge_layers([({"algorithm": "random-budget", "p_min": 0.3, "algorithm_options": {"budget": 0.5}},
                            "drop"), ({"algorithm": "hasfl"}, "refuse")])
    assert merged == {"algorithm": "hasfl", "algorithm_options": {"p_min": 0.3}}
    with pytest.raises(ConfigError, match="mu is 0.5 but algorithm 'hasfl' takes no option 'mu'"):
        merge_layers([({"mu": 0.5}, "refuse")])
    assert merge_layers([({"mu": 0.5}, "drop")]) == {}
