"""Deterministic torch settings: applied by apply_determinism, by the Engine in the driver, by the actor classes,
reported by `hasfl-ray info --json`, and switched off by --fast-nondeterministic."""

import json
import os

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.training.determinism import (CUBLAS_WORKSPACE, apply_determinism, determinism_state, set_tf32,
                                            tf32_state)


@pytest.fixture(autouse=True)
def restore_settings(monkeypatch):
    """Each test may flip process-wide switches; put them back (and the environment, through monkeypatch)."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    tf32 = tf32_state()
    yield
    set_tf32(tf32["cudnn_conv_tf32"])
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]


def test_apply_sets_every_switch_and_the_opt_out_clears_them():
    state = apply_determinism(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
    assert not torch.backends.cudnn.benchmark
    assert state == determinism_state() and state["deterministic"] is True
    # exact float32: no TF32 in cuDNN convolutions and RNNs or in cuBLAS matmuls
    assert state["exact_float32"] is True
    assert not state["cudnn_conv_tf32"] and not state["cudnn_rnn_tf32"] and not state["matmul_tf32"]
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        assert torch.backends.cudnn.conv.fp32_precision == "ieee" and torch.backends.cuda.matmul.fp32_precision == "ieee"

    state = apply_determinism(False)
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
    assert torch.backends.cudnn.benchmark and state["deterministic"] is False
    assert state["cudnn_conv_tf32"] is True and state["exact_float32"] is False  # torch's default: TF32 cuDNN
    assert torch.get_float32_matmul_precision() == "highest"  # no mix of torch's old and new switches


def test_a_users_own_deterministic_workspace_is_kept(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert apply_determinism(True)["cublas_workspace_config"] == ":16:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")  # not a deterministic setting: replaced
    assert apply_determinism(True)["cublas_workspace_config"] == CUBLAS_WORKSPACE


def test_the_engine_applies_the_run_setting_in_the_driver():
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    Engine(RunConfig(rounds=1, clients=4, clients_per_round=2, backend="local"))
    assert determinism_state()["deterministic"] is True
    Engine(RunConfig(rounds=1, clients=4, clients_per_round=2, backend="local", deterministic=False))
    assert determinism_state()["deterministic"] is False and torch.backends.cudnn.benchmark


def test_deterministic_must_be_a_boolean():
    with pytest.raises(ConfigError, match="deterministic is 'yes'; expected true or false"):
        RunConfig(backend="local", deterministic="yes")


def test_info_json_reports_the_settings_runs_apply():
    result = CliRunner().invoke(main, ["info", "--json"])
    assert result.exit_code == 0, result.output
    settings = json.loads(result.output)["determinism"]
    assert settings["deterministic"] is True and settings["cublas_workspace_config"] == CUBLAS_WORKSPACE
    assert settings["cudnn_deterministic"] and not settings["cudnn_benchmark"]
    assert settings["exact_float32"] is True and not settings["cudnn_conv_tf32"] and not settings["matmul_tf32"]
    assert "--fast-nondeterministic" in settings["opt_out"]


def test_fast_nondeterministic_is_recorded_in_config_yaml(tmp_path):
    out = tmp_path / "fast"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "1", "--clients", "4",
                                       "--clients-per-round", "2", "--quiet", "--fast-nondeterministic",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "deterministic: false" in (out / "config.yaml").read_text()


def test_actor_classes_apply_the_setting_in_their_process():
    pytest.importorskip("ray", reason="needs Ray (the actor classes import it)")
    from hasfl_ray.data import load_dataset
    from hasfl_ray.engine.backend import optimizer_settings
    from hasfl_ray.engine.engine import initial_parameters
    from hasfl_ray.simulation.actors import ServerActor, TrainerActor

    config = RunConfig(backend="local", clients=4, clients_per_round=2).resolved()
    dataset = load_dataset("digits", 4, 0.3, 0)
    torch.use_deterministic_algorithms(False)
    set_tf32(True)
    TrainerActor(dataset, "digits", optimizer_settings(config), "cpu", 1)
    assert determinism_state()["deterministic"] is True and determinism_state()["exact_float32"] is True
    ServerActor("digits", initial_parameters("digits", 0), dataset.test_view(), 100, "auto", "cpu", 1,
                deterministic=False)
    assert determinism_state()["deterministic"] is False
