"""Fixtures of the CLI tests: one finished run, made once a module, and a copy of it per test (a module that
defines its own ``finished`` uses that one)."""

import shutil

import pytest

from hasfl_ray.engine import Engine, RunConfig


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished run (2 rounds, 6 clients, 3 a round, local), made once for the module and copied per test."""
    path = tmp_path_factory.mktemp("finished") / "run-a"
    Engine(RunConfig(backend="local", rounds=2, clients=6, clients_per_round=3), out_dir=str(path)).run()
    return path


@pytest.fixture
def run(finished, tmp_path, monkeypatch):
    """A copy of the finished run at runs/run-a, in a working directory of its own (short paths in sentences)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(finished, "runs/run-a")
    return "runs/run-a"
