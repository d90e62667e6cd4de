"""The engine end to end on the embedded digits: learning, Proposition 1, determinism, the run directory."""

import csv
import json
import os

import numpy as np
import pytest
import torch
import yaml

from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.engine import initial_parameters, sample_participants
from hasfl_ray.models import build_model


class CappedAtHalf(Algorithm):
    """Every participant trains at min(0.5, p_max): the hypothesis of Proposition 1."""

    name = "capped"

    def allocate(self, round, participants):
        return {i: min(0.5, float(self.p_max[i])) for i in participants}


def test_short_run_learns_far_above_chance(tmp_path):
    summary = Engine(RunConfig(backend="local", rounds=12, seed=1), out_dir=str(tmp_path / "run")).run()
    assert summary["best_accuracy"] > 0.6  # chance is 0.1
    assert summary["rounds"] == 12


def test_proposition_1_uncovered_coordinates_stay_bit_identical():
    engine = Engine(RunConfig(backend="local", rounds=4, seed=3))
    engine.prepare()
    engine.algorithm = CappedAtHalf(engine.config, engine.p_max, engine.num_samples)
    engine.run()
    final = engine.backend.get_params()
    initial = engine.initial_params
    specs = build_model("digits").param_specs()
    from hasfl_ray.models import mask
    for name, spec in specs.items():
        outside = ~mask(spec, 0.5)
        assert torch.equal(final[name][outside], initial[name][outside]), name
    half = sum(s.numel(0.5) for s in specs.values())
    full = sum(s.numel(1.0) for s in specs.values())
    assert engine.history[-1]["frozen_fraction"] == pytest.approx(1 - half / full, abs=1e-12)
    assert all(line["avg_p"] <= 0.5 for line in engine.history)


def test_same_config_and_seed_is_bit_identical():
    first = Engine(RunConfig(backend="local", rounds=3, seed=5)).run()
    second_engine = Engine(RunConfig(backend="local", rounds=3, seed=5))
    second = second_engine.run()
    assert first["params_sha256"] == second["params_sha256"]
    assert Engine(RunConfig(backend="local", rounds=3, seed=6)).run()["params_sha256"] != first["params_sha256"]


def test_run_directory_contract(tmp_path):
    out = tmp_path / "run"
    summary = Engine(RunConfig(backend="local", rounds=3), out_dir=str(out)).run()
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["dataset"] == "digits" and config["rounds"] == 3 and config["lr"] is not None
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [0, 1, 2]
    for line in lines:
        assert set(line) >= {"round", "test_accuracy", "test_loss", "avg_p", "coverage", "frozen_fraction",
                             "mean_h", "rejected_updates", "wall_s"}
        assert line["rejected_updates"] == 0
        assert 0 <= line["coverage"] <= 1 and 0 <= line["frozen_fraction"] <= 1
    with open(out / "clients.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 20
    assert set(rows[0]) >= {"client", "num_samples", "p_max", "tv_distance", "h_tilde", "p_final"}
    assert sum(int(r["num_samples"]) for r in rows) == 1797 - 359  # the 80% training split of the 1,797 digits
    assert np.mean([float(r["p_max"]) for r in rows]) == pytest.approx(0.525)
    saved = json.loads((out / "summary.json").read_text())
    assert saved == summary
    assert set(saved) >= {"best_accuracy", "final_accuracy", "avg_p", "rounds", "params_sha256", "wall_s"}


def test_participants_are_seeded_uniform_and_sorted():
    rounds = [sample_participants(42, t, 20, 10) for t in range(200)]
    assert rounds[0] == sample_participants(42, 0, 20, 10)
    assert all(r == sorted(set(r)) and len(r) == 10 for r in rounds)
    counts = np.bincount(np.concatenate(rounds), minlength=20)
    assert counts.min() > 70 and counts.max() < 130  # 100 expected per client


def test_initial_parameters_do_not_touch_global_rng():
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    initial_parameters("digits", 42)
    assert torch.equal(torch.rand(1), expected)


def test_non_finite_update_is_rejected(tmp_path):
    from hasfl_ray.training.local import LocalObjective

    class Poisoned(LocalObjective):
        def finish(self, model, initial, steps, lr):
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
            return {}

    class PoisonClientZero(Algorithm):
        def objective(self, round, client, width):
            return Poisoned() if client == min(sample_participants(self.config.seed, round, 20, 10)) \
                else LocalObjective()

    engine = Engine(RunConfig(backend="local", rounds=2))
    engine.prepare()
    engine.algorithm = PoisonClientZero(engine.config, engine.p_max, engine.num_samples)
    engine.run()
    assert all(torch.isfinite(t).all() for t in engine.backend.get_params().values())


def test_server_keeps_only_the_test_split():
    from hasfl_ray.data import load_dataset
    from hasfl_ray.engine.server import Server

    dataset = load_dataset("digits", 20, 0.3, 42)
    server = Server("digits", initial_parameters("digits", 42), dataset)
    assert server.dataset.train_x.numel() == 0 and server.dataset.num_clients == 0
    assert dataset.train_x.numel() > 0 and dataset.num_clients == 20  # the trainers' dataset is untouched
    assert server.evaluate() == Server("digits", initial_parameters("digits", 42), dataset).evaluate()
    full_x = torch.cat([x for x, _ in dataset.test_batches(100)])
    view_x = torch.cat([x for x, _ in server.dataset.test_batches(100)])
    assert torch.equal(full_x, view_x)
