"""Without Ray: --backend ray is one sentence with the install command; the default falls back to local."""

import json
import os
import sys

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.simulation import RAY_INSTALL, ray_available


@pytest.fixture
def no_ray(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    assert not ray_available()


def simulate(tmp_path, *args):
    return CliRunner().invoke(main, ["simulate", "--rounds", "1", "--clients", "6", "--clients-per-round", "3",
                                     "--out", str(tmp_path / "run"), "--quiet", *args])


@pytest.mark.parametrize("args", [("--backend", "ray"), ("--actors", "2")])
def test_ray_requested_without_ray_gives_the_install_hint(no_ray, tmp_path, args):
    result = simulate(tmp_path, *args)
    assert result.exit_code == 2, result.output
    assert RAY_INSTALL in result.output and "--backend local" in result.output
    assert "Traceback" not in result.output and not os.path.exists(tmp_path / "run")


def test_default_backend_is_local_without_ray(no_ray, tmp_path):
    result = simulate(tmp_path)
    assert result.exit_code == 0, result.output
    assert "# backend: local" in (tmp_path / "run" / "config.yaml").read_text()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["rounds"] == 1
