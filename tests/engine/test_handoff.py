"""Local first, Ray takes over (issue 24 item 8): HandoffBackend trains in this process, starts the backend it hands
over to in the background once the first round ran, and switches at a round boundary; the result is that of a run on
one backend alone, whichever round the switch comes at, and a start that fails or a stop while it waits changes
nothing of that.
Here a second local backend whose start waits (or fails) stands in for Ray; tests/simulation/test_ray_handoff.py hands
over to Ray itself."""

import json
import os
import signal
import threading
import time

import pytest

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine import handoff
from hasfl_ray.engine.backend import LocalBackend
from hasfl_ray.engine.checkpoint import load_checkpoint
from hasfl_ray.engine.handoff import HandoffBackend
from hasfl_ray.errors import ConfigError, RunInterrupted
from hasfl_ray.engine.records import TIMINGS

SMALL = dict(backend="local", rounds=4, clients=6, clients_per_round=3, seed=5)
EXECUTION = {"backend": "stand-in", "actors": 2}


class StandIn(LocalBackend):
    """Ray's stand-in: a local backend whose start waits for ``go`` (Ray's takes seconds), or fails with ``error``."""

    def __init__(self, error=None):
        self.go, self.error = threading.Event(), error
        self.warmed, self.rounds, self.shut = None, [], False

    def warm_up(self, config):
        self.warmed = config

    def wait_started(self):
        self.go.wait()
        if self.error is not None:
            raise self.error

    def run_round(self, tasks, weights, server_lr, optimizer=None):
        self.rounds.append(tasks[0].round)
        return super().run_round(tasks, weights, server_lr, optimizer)

    def shutdown(self):
        self.shut = True


def lines(out):
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


def run(tmp_path, name, backend=None, **kw):
    out = str(tmp_path / name)
    summary = Engine(RunConfig(**{**SMALL, **kw}), out_dir=out, backend=backend).run()
    return summary, lines(out)


@pytest.mark.parametrize("algorithm", ["hasfl", "scaffold", "fedrolex"])
def test_a_takeover_at_round_2_of_4_gives_the_run_of_one_backend(algorithm, tmp_path):
    # issue 24 item 8: the server's whole state is its parameters; SCAFFOLD's variates and FedRolex's windows live
    # in the algorithm, in this process, so the handover copies everything there is
    local, local_lines = run(tmp_path, "local", algorithm=algorithm)
    inner = StandIn()
    inner.go.set()
    backend = HandoffBackend(lambda: inner, EXECUTION, takeover_round=2)
    summary, handed_lines = run(tmp_path, "handoff", backend, algorithm=algorithm)
    assert inner.rounds == [2, 3] and inner.warmed is not None and inner.shut
    assert summary.pop("ray_from_round") == 2
    assert handed_lines == local_lines
    assert {k: v for k, v in summary.items() if k not in TIMINGS} == {k: v for k, v in local.items() if k not in TIMINGS}
    assert "# backend: stand-in\n# actors: 2\n" in (tmp_path / "handoff" / "config.yaml").read_text()


def test_a_start_that_fails_leaves_the_run_in_this_process_with_one_warning(tmp_path, caplog):
    # issue 24 item 8: Ray failing to start once the local rounds began does not stop the run
    inner = StandIn(ConfigError("Ray could not start on this machine (boom); expected a machine where `ray start "
                                "--head` works, or --backend local"))
    inner.go.set()
    summary, handed_lines = run(tmp_path, "failed", HandoffBackend(lambda: inner, EXECUTION, takeover_round=1))
    local, local_lines = run(tmp_path, "local")
    assert summary["ray_from_round"] is None and inner.rounds == [] and inner.shut
    assert (summary["params_sha256"], handed_lines) == (local["params_sha256"], local_lines)
    warning = ("Ray could not start on this machine (boom); the run continues in this process, results are "
               "identical")
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [warning]
    assert warning in (tmp_path / "failed" / "log.txt").read_text()


def test_a_run_whose_rounds_left_are_short_never_starts_the_backend_it_would_hand_over_to(tmp_path):
    # issue 24 item 8: 4 rounds of a fraction of a second are far below MIN_REMAINING_S: starting Ray would only
    # take CPU from them and the run would end before it was ready
    made = []
    summary, handed_lines = run(tmp_path, "short", HandoffBackend(lambda: made.append(1) or StandIn(), EXECUTION))
    assert made == [] and summary["ray_from_round"] is None
    assert handed_lines == run(tmp_path, "local")[1]


def test_a_run_that_ends_before_the_start_stays_local_and_waits_for_it_a_bounded_time(tmp_path, monkeypatch):
    monkeypatch.setattr(handoff, "START_WAIT_S", 0.2)
    monkeypatch.setattr(handoff, "MIN_REMAINING_S", 0.0)  # start after the first round, however short the run
    inner = StandIn()  # never ready
    try:
        summary, _ = run(tmp_path, "never", HandoffBackend(lambda: inner, EXECUTION))
    finally:
        inner.go.set()
    assert summary["ray_from_round"] is None and inner.rounds == [] and inner.shut
    assert summary["params_sha256"] == run(tmp_path, "local")[0]["params_sha256"]


def test_a_stop_while_the_takeover_round_waits_for_the_start_checkpoints_and_stops(tmp_path, monkeypatch):
    # issue 24 item 8: Ctrl-C / SIGTERM during the handoff stops the run as always (the stop reaches the wait)
    monkeypatch.setattr(handoff, "START_WAIT_S", 0.2)
    inner = StandIn()  # not ready when round 2 waits for it
    metrics = tmp_path / "stopped" / "metrics.jsonl"

    def stop_after_round_1():  # SIGTERM once two lines are written: round 2 waits for the start then
        while not inner.go.is_set():
            if metrics.exists() and len(metrics.read_text().splitlines()) == 2:
                return os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.02)

    stopper = threading.Thread(target=stop_after_round_1, daemon=True)
    stopper.start()
    try:
        with pytest.raises(RunInterrupted):
            run(tmp_path, "stopped", HandoffBackend(lambda: inner, EXECUTION, takeover_round=2), checkpoint_every=1)
    finally:
        inner.go.set()
        stopper.join(30)
    assert load_checkpoint(str(tmp_path / "stopped")).round == 2 and inner.rounds == [] and inner.shut


def test_the_start_begins_once_the_first_round_ran_so_a_one_round_run_never_starts_it(tmp_path):
    # issue 24 item 8: the first round takes no CPU from the start (nor from Ray's import)
    made = []
    inner = StandIn()
    inner.go.set()
    summary, _ = run(tmp_path, "one", HandoffBackend(lambda: made.append(inner) or inner, EXECUTION), rounds=1)
    assert made == [] and summary["ray_from_round"] is None and not inner.shut
    two = HandoffBackend(lambda: made.append(inner) or inner, EXECUTION, takeover_round=1)
    summary, _ = run(tmp_path, "two", two, rounds=2)
    assert made == [inner] and summary["ray_from_round"] == 1 and inner.rounds == [1] and inner.shut
    assert inner.should_stop == two.should_stop  # the engine's stop request reaches the backend handed over to
