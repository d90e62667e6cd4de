"""What a user names is what runs (issue 37 item 10): ``--backend ray`` given by name trains on Ray from its first
round, even in a run too short for the local-first hand-off to ever hand over (before, a 2-round ``--backend ray
--actors 2`` run never touched Ray and said so only as ``ray_from_round: null``). The hand-off stays the default
backend's choice: tests/simulation/test_ray_handoff.py and tests/simulation/test_ray_failures.py."""

import json

import pytest
from click.testing import CliRunner

ray = pytest.importorskip("ray", reason="needs Ray")

from hasfl_ray.cli.main import main  # noqa: E402
from hasfl_ray.simulation.backend import RayBackend  # noqa: E402


def test_backend_ray_given_by_name_trains_on_ray_from_the_first_round(tmp_path, monkeypatch):
    assert not ray.is_initialized()  # the run starts its own Ray, as a user's would
    monkeypatch.delenv("HASFL_HANDOFF_ROUND", raising=False)
    trained = []
    run_round = RayBackend.run_round

    def recorded(self, tasks, weights, server_lr):
        trained.append(tasks[0].round)
        return run_round(self, tasks, weights, server_lr)

    monkeypatch.setattr(RayBackend, "run_round", recorded)
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", "ray", "--actors", "2", "--rounds", "2", "--clients",
                                       "6", "--clients-per-round", "3", "--quiet", "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert trained == [0, 1]  # every round on Ray's actors
    summary = json.loads((out / "summary.json").read_text())
    assert "ray_from_round" not in summary  # no hand-off to report
    assert "handoff: false" in (out / "config.yaml").read_text()
    assert not ray.is_initialized()
