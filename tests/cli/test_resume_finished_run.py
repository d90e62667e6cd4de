"""``--resume`` of a run whose checkpoint holds every round started Ray and its actors for nothing (+9 s on
``--backend ray``), where the local backend writes the summary again from the checkpoint in this process. A finished
synchronous run is now finished here on any backend (``engine/finished_here.py``), saying so in one line, with the
same params_sha256, and config.yaml stays as the run wrote it (RELIABILITY path-s)."""

import json

import pytest

from sentences import invoke

TINY = ["--rounds", 2, "--clients", 6, "--clients-per-round", 3, "--quiet", "--dataset", "digits",
        "--checkpoint-every", 1]


def sha(out):
    return json.loads((out / "summary.json").read_text())["params_sha256"]


def test_resuming_a_finished_run_on_ray_never_starts_ray(tmp_path, monkeypatch, caplog):
    pytest.importorskip("ray", reason="needs Ray (the backend that must not start)")
    from hasfl_ray.simulation.backend import RayBackend

    started = []

    def refuse(name):  # raises, so that a regression fails at once instead of waiting on actors never made
        def called(self, *args):
            started.append(name)
            raise RuntimeError(f"RayBackend.{name} was called")
        return called

    monkeypatch.setattr(RayBackend, "warm_up", refuse("warm_up"))
    monkeypatch.setattr(RayBackend, "start", refuse("start"))
    out = tmp_path / "run"
    first = invoke("simulate", *TINY, "--backend", "local", "--out", out)
    assert first.exit_code == 0, first.output
    before, recorded = sha(out), (out / "config.yaml").read_text()
    again = invoke("simulate", "--out", out, "--resume", "--backend", "ray", "--actors", 2, "--quiet")
    assert again.exit_code == 0, again.output
    assert started == []
    said = [r.getMessage() for r in caplog.records if "holds a finished run" in r.getMessage()]
    assert said == [f"run directory {str(out)!r} holds a finished run (2 of 2 rounds); its summary is written again "
                    "here, without starting Ray"]
    assert sha(out) == before
    # nothing ran on Ray: config.yaml still says how the run ran (it had come to say backend ray with 2 actors)
    assert (out / "config.yaml").read_text() == recorded and "backend: local" in recorded


def test_a_finished_ray_runs_recorded_execution_is_kept(tmp_path):
    from hasfl_ray.engine.finished_here import stored_execution

    (tmp_path / "config.yaml").write_text("rounds: 2\n# execution (does not change results)\n# backend: ray\n"
                                          "# actors: 3\n# gpus_per_actor: 0.5\n# address: 10.0.0.1:6379\n")
    assert stored_execution(str(tmp_path)) == {"backend": "ray", "actors": 3, "gpus_per_actor": 0.5,
                                               "address": "10.0.0.1:6379"}
    (tmp_path / "config.yaml").write_text("rounds: 2\n# execution (does not change results)\n# backend: local\n")
    assert stored_execution(str(tmp_path)) == {"backend": "ray"}
