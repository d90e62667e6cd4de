"""Resume is honest about what may change (issue 18 item 5): a test's --fault-inject is not run state (it does not
fire again on resume), and a run can change backend when resumed: a Ray run finished locally and a local run
finished on Ray give the params_sha256 of a run never interrupted."""

import json

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main

#: Every run here names its backend: the tests mind no Ray already running in this process, so the shared Ray of the
#: module before is kept into this one (tests/conftest.py).
RAY_MAY_ALREADY_RUN = True

RUN = ["simulate", "--rounds", "4", "--clients", "6", "--clients-per-round", "3", "--checkpoint-every", "1", "--quiet"]


def sha(out):
    return json.loads((out / "summary.json").read_text())["params_sha256"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    assert CliRunner().invoke(main, RUN + ["--backend", "local", "--out", str(out)]).exit_code == 0
    return sha(out)


def crash_then_resume(tmp_path, first, then):
    out = tmp_path / "run"
    crashed = CliRunner().invoke(main, RUN + first + ["--fault-inject", "trainer-error@2", "--out", str(out)])
    assert crashed.exit_code == 1 and "injected trainer failure" in crashed.output, crashed.output
    assert not (out / "summary.json").exists()
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet", *then])
    assert resumed.exit_code == 0, resumed.output  # the fault did not fire again
    return out


def test_a_local_run_resumed_locally_does_not_fire_its_fault_again(tmp_path, uninterrupted):
    out = crash_then_resume(tmp_path, ["--backend", "local"], [])
    assert sha(out) == uninterrupted


def test_a_ray_run_finished_locally_and_a_local_run_finished_on_ray_match(tmp_path, uninterrupted, ray_local):
    ray_then_local = crash_then_resume(tmp_path / "a", ["--backend", "ray", "--actors", "1"], ["--backend", "local"])
    assert sha(ray_then_local) == uninterrupted
    local_then_ray = crash_then_resume(tmp_path / "b", ["--backend", "local"], ["--backend", "ray", "--actors", "1"])
    assert sha(local_then_ray) == uninterrupted
