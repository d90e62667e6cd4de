"""Numbers that are numbers (issue 37 item 6, the YAML part): scientific notation without a dot or an exponent sign
(``5e-2``, ``2.0e8``) is a float in every config file, as YAML 1.2 and every user reads it; PyYAML's YAML 1.1
resolver alone reads it as a string (so ``lr: 5e-2`` was refused and docs/clock.md's own device examples failed)."""

import pytest
import yaml

from hasfl_ray.config import RunConfig, load_yaml_config, strict_yaml_load


@pytest.mark.parametrize("text,value", [("5e-2", 0.05), ("2.0e8", 2.0e8), ("1E6", 1e6), ("-3e-1", -0.3),
                                        ("1.5e+3", 1500.0), ("6.25e4", 62500.0)])
def test_scientific_notation_is_a_float(text, value):
    loaded = strict_yaml_load(f"x: {text}\n")["x"]
    assert isinstance(loaded, float) and loaded == value


@pytest.mark.parametrize("text,value", [("12", 12), ("0.5", 0.5), ("5e", "5e"), ("e5", "e5"), ("1_000", 1000),
                                        ("true", True), ("'5e-2'", "5e-2")])
def test_everything_else_reads_as_before(text, value):
    assert strict_yaml_load(f"x: {text}\n")["x"] == value == yaml.safe_load(f"x: {text}\n")["x"]
    assert yaml.safe_load("x: 5e-2\n")["x"] == "5e-2"  # PyYAML's own loader is left as it is


def test_a_config_with_lr_5e_minus_2_and_the_documented_device_tiers_loads(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 5e-2\nbackend: local\ndevices:\n  tiers:\n"
                    "    - {width: 0.25, speed: 2.0e8, down: 2.5e5, up: 6.25e4, latency: 0.15}\n"
                    "    - {width: 0.5,  speed: 5.0e8, down: 1.25e6, up: 2.5e5, latency: 0.08}\n"
                    "    - {width: 0.75, speed: 1.0e9, down: 6.25e6, up: 1.25e6, latency: 0.04}\n"
                    "    - {width: 1.0,  speed: 3.0e9, down: 2.5e7, up: 6.25e6, latency: 0.02}\n")
    values = load_yaml_config(str(path))
    config = RunConfig.from_dict(values, str(path))
    assert config.lr == 0.05
    distribution = tmp_path / "dist.yaml"
    distribution.write_text("backend: local\ndevices:\n  distribution: lognormal\n  speed_median: 2.0e9\n")
    assert RunConfig.from_dict(load_yaml_config(str(distribution)), str(distribution)).devices is not None
