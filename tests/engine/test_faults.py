"""Bad clients: a NaN/Inf update injected with --fault-inject is rejected before aggregation on every backend,
counted in metrics.jsonl, logged with client and round, and never reaches the global model or HAS-FL's estimates."""

import json
import logging

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.engine import sample_participants
from hasfl_ray.errors import ConfigError

SMALL = dict(rounds=3, clients=6, clients_per_round=3, seed=5, warmup=0, t_adapt=1)


def finite_params(engine):
    return all(bool(torch.isfinite(t).all()) for t in engine.backend.get_params().values())


@pytest.mark.parametrize("kind", ["nan-update", "inf-update"])
@pytest.mark.parametrize("batching", ["off", "on"])
def test_a_poisoned_update_is_rejected_counted_and_logged(tmp_path, caplog, kind, batching):
    config = RunConfig(**SMALL, backend="local", fault_inject=f"{kind}@1", client_batching=batching)
    engine = Engine(config, out_dir=str(tmp_path / "run"))
    with caplog.at_level(logging.WARNING):
        summary = engine.run()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["rejected_updates"] for line in lines] == [0, 1, 0]
    assert all(np.isfinite(line["test_loss"]) for line in lines) and finite_params(engine)
    poisoned = sample_participants(5, 1, 6, 3)[0]
    assert any("round 1: rejected" in r.getMessage() and str(poisoned) in r.getMessage() for r in caplog.records)
    assert np.isfinite(engine.algorithm.h_tilde()).all()
    assert summary["params_sha256"] != Engine(RunConfig(**SMALL, backend="local")).run()["params_sha256"]


def test_hasfl_does_not_take_the_rejected_clients_estimate(tmp_path):
    config = RunConfig(**SMALL, backend="local", fault_inject="nan-update@0")
    engine = Engine(config)
    engine.prepare()
    engine.backend.start(engine.config, engine.dataset, engine.model_name, engine.initial_params)
    poisoned = sample_participants(5, 0, 6, 3)[0]
    engine.run_round(0)
    assert engine.algorithm.h_tilde()[poisoned] == 1.0  # untouched: its Ĥ never entered the EMA
    others = [i for i in sample_participants(5, 0, 6, 3) if i != poisoned]
    assert all(engine.algorithm.h_tilde()[i] != 1.0 for i in others)
    engine.backend.shutdown()


def test_a_round_whose_every_update_is_rejected_leaves_the_model_unchanged(tmp_path, caplog):
    one = dict(clients=6, clients_per_round=1, seed=5, backend="local")
    after_round_0 = Engine(RunConfig(rounds=1, **one)).run()["params_sha256"]
    with caplog.at_level(logging.WARNING):
        summary = Engine(RunConfig(rounds=2, fault_inject="nan-update@1", **one)).run()
    assert summary["params_sha256"] == after_round_0
    assert any("every update was rejected, so the global model is unchanged" in r.getMessage()
               for r in caplog.records)


def test_fault_specs_are_validated():
    with pytest.raises(ConfigError, match="KIND@ROUND with KIND one of kill-trainer, nan-update, inf-update, trainer-error"):
        RunConfig(fault_inject="nan@2", backend="local")
    with pytest.raises(ConfigError, match="expected backend ray"):
        RunConfig(fault_inject="kill-trainer@2", backend="local")
    assert RunConfig(fault_inject="inf-update@2", backend="local").fault_inject == "inf-update@2"


def test_the_cli_flag_injects_on_the_local_backend(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "2", "--clients", "6",
                                       "--clients-per-round", "3", "--fault-inject", "nan-update@0", "--quiet",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["rejected_updates"] for line in lines] == [1, 0]


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_an_exception_in_a_trainer_is_one_sentence_with_the_traceback_in_the_log(tmp_path, backend):
    if backend == "ray":
        pytest.importorskip("ray", reason="needs Ray")
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", backend, "--rounds", "3", "--clients", "6",
                                       "--clients-per-round", "3", "--seed", "5", "--fault-inject",
                                       "trainer-error@1", "--quiet", "--out", str(out)])
    assert result.exit_code == 1, result.output
    message = result.output.strip()
    client = sample_participants(5, 1, 6, 3)[0]
    assert message == (f"Error: training client {client} of round 1 failed (RuntimeError: injected trainer failure "
                       "(--fault-inject trainer-error@1)); the trainer's traceback is in RUN/log.txt")
    log = (out / "log.txt").read_text()
    assert "injected trainer failure" in log and "training/trainer.py\", line" in log  # the trainer's frames
