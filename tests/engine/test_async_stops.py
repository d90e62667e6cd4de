"""An asynchronous run stops on the first signal wherever it is (issue 49 item 3; hostile battery 5 problems 7, 11):
inside the scans of every client for one available (clients rarely on), between events without a server update
(clients that drop out), and in the last update's local-accuracy pass, each as SIGTERM with exit 143 and a
checkpoint that --resume finishes as a run never stopped. The signals are sent from inside the run (a patched
availability or dataset method), never by a timer."""

import csv
import json
import os
import signal

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.clock.availability import STOP_CHECK_EVERY, Availability, MarkovAvailability
from hasfl_ray.clock.clock import Clock
from hasfl_ray.data.synthetic import SyntheticFederatedDataset
from hasfl_ray.engine import Engine, RunConfig, evaluating
from hasfl_ray.engine.asynchronous import DRAWS, AsyncLoop
from hasfl_ray.errors import RoundInterrupted, RunInterrupted
from hasfl_ray.engine.records import TIMINGS

ASYNC = dict(backend="local", mode="async", devices="lognormal", clients=10, clients_per_round=4, concurrency=4,
             buffer_size=2, local_epochs=1, seed=5)


def records(out):
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]
    with open(out / "clients.csv", encoding="utf-8") as handle:
        return lines, list(csv.DictReader(handle))


def signal_on_call(patch, cls, name, call):
    """``cls.name`` sending this process SIGTERM at its ``call``-th call; returns the list of its calls."""
    calls = []
    original = getattr(cls, name)

    def signalling(self, *args):
        calls.append(args)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, *args)

    patch.setattr(cls, name, signalling)
    return calls


#: Clients on for a millisecond once in 10^9 s (battery 4's row 12, in async mode): nobody is ever available.
RARELY_ON = dict(ASYNC, dataset="synthetic", clients=3000, clients_per_round=4, availability="markov:0.001,1000000000",
                 rounds=3)


@pytest.mark.parametrize("scan, call", [
    ("window", DRAWS + 300),  # the dispatch's candidates all away: 300 clients into the scan of every client
    ("next_on", 2000),  # nobody available: 2000 clients into the scan for the first to come back
])
def test_the_first_sigterm_stops_the_scan_of_every_client(tmp_path, monkeypatch, scan, call):
    calls = signal_on_call(monkeypatch, MarkovAvailability, scan, call)
    with pytest.raises(RunInterrupted) as stop:
        Engine(RunConfig(**RARELY_ON), out_dir=str(tmp_path / "run")).run()
    assert stop.value.signal_number == signal.SIGTERM and stop.value.done == "0 server updates"
    assert call < len(calls) <= call + STOP_CHECK_EVERY  # stopped at the scan's next check, not at its end


def test_a_sigterm_without_server_updates_is_honoured_at_the_next_event(tmp_path, monkeypatch):
    """Every client drops out (battery 5: --dropout 0.9999999 ignored the first SIGTERM for minutes)."""
    calls = signal_on_call(monkeypatch, Availability, "window", 50)
    with pytest.raises(RunInterrupted) as stop:
        Engine(RunConfig(**{**ASYNC, "dropout": 0.9999999, "rounds": 3}), out_dir=str(tmp_path / "run")).run()
    assert stop.value.signal_number == signal.SIGTERM and stop.value.rounds_done == 0
    assert 50 <= len(calls) <= 51  # the dispatch under way, then the next event's check


#: Clients often away (on 1 s, off 6 s): dispatches find nobody, scan, and wait for the first to come back.
OFTEN_AWAY = dict(ASYNC, availability="markov:1,6", rounds=8, checkpoint_every=3, dropout=0.2)


@pytest.fixture(scope="module")
def often_away(tmp_path_factory):
    """The uninterrupted run, its records, and where its availability calls fall: the server updates recorded at
    each call, and the calls at which a scan of every client began (its first stop check)."""
    out = tmp_path_factory.mktemp("often-away") / "run"
    updates, scans = [], []
    engine = Engine(RunConfig(**OFTEN_AWAY), out_dir=str(out))
    with pytest.MonkeyPatch.context() as patch:
        window, every = MarkovAvailability.window, Clock._every_client
        patch.setattr(MarkovAvailability, "window",
                      lambda self, *args: updates.append(len(engine.history)) or window(self, *args))
        patch.setattr(Clock, "_every_client", lambda self: scans.append(len(updates)) or every(self))
        summary = engine.run()
    return summary, records(out), updates, scans


def stop_points(updates, scans):
    """Availability calls to send SIGTERM at, after the first server update and before the last: three calls
    before a scan's first check (the dispatch under way is undone), and just after an update (the next event's
    check: the checkpoint holds what is in flight and buffered)."""
    inside = [call - 2 for call in scans if 0 < updates[call - 3] < OFTEN_AWAY["rounds"] - 1]
    after = updates.index(1) + 1
    return {"inside a dispatch": inside[0], "inside a later dispatch": inside[-1], "after an update": after}


@pytest.mark.parametrize("where", ["inside a dispatch", "inside a later dispatch", "after an update"])
def test_a_stop_between_server_updates_resumes_as_never_stopped(tmp_path, often_away, where):
    summary, (lines, rows), updates, scans = often_away
    call = stop_points(updates, scans)[where]
    out = tmp_path / "run"
    undone = []
    with pytest.MonkeyPatch.context() as patch:
        signal_on_call(patch, MarkovAvailability, "window", call)
        fill = AsyncLoop.fill

        def watched(self):
            try:
                fill(self)
            except RoundInterrupted:
                undone.append(self.state.dispatches)
                raise

        patch.setattr(AsyncLoop, "fill", watched)
        with pytest.raises(RunInterrupted) as stop:
            Engine(RunConfig(**OFTEN_AWAY), out_dir=str(out)).run()
    assert stop.value.signal_number == signal.SIGTERM and stop.value.rounds_done == updates[call - 1] > 0
    assert bool(undone) == where.startswith("inside")  # the scan's check stopped the dispatch, which was undone
    resumed = Engine(RunConfig(**OFTEN_AWAY), out_dir=str(out), resume=True).run()
    assert resumed["params_sha256"] == summary["params_sha256"]
    assert resumed["clients_dispatched"] == summary["clients_dispatched"]
    assert records(out) == (lines, rows)


SYNTHETIC = dict(ASYNC, dataset="synthetic", clients=400, rounds=3, checkpoint_every=1, local_eval_clients="all")
SYNTHETIC_FLAGS = ["simulate", "--backend", "local", "--mode", "async", "--devices", "lognormal", "--dataset",
                   "synthetic", "--clients", "400", "--clients-per-round", "4", "--concurrency", "4", "--buffer-size",
                   "2", "--local-epochs", "1", "--seed", "5", "--rounds", "3", "--checkpoint-every", "1",
                   "--local-eval-clients", "all", "--quiet"]


def test_a_sigterm_in_the_last_updates_local_pass_exits_143_and_resume_finishes_it(tmp_path, monkeypatch):
    """Battery 5 problem 11: the pass stopped, the update was recorded, then the end of the run asked for the pass
    again and EvaluationInterrupted escaped (exit 1). Now as in rounds: exit 143 with the resume line, and
    --resume computes the pass and ends as a run never stopped."""
    runner = CliRunner()
    plain = runner.invoke(main, SYNTHETIC_FLAGS + ["--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0, plain.output
    monkeypatch.setattr(evaluating, "LOCAL_CHUNK", 40)
    chunks = signal_on_call(monkeypatch, SyntheticFederatedDataset, "client_label_histograms", 2)
    out = tmp_path / "stopped"
    stopped = runner.invoke(main, SYNTHETIC_FLAGS + ["--out", str(out)])
    assert stopped.exit_code == 143, stopped.output
    assert "Stopped by SIGTERM after 3 server updates (checkpoint written); resume with:" in stopped.output
    assert len(chunks) == 2 and not (out / "summary.json").exists()
    lines, _ = records_without_clients(out)
    assert len(lines) == 3 and "local_accuracy_mean" not in lines[-1]
    monkeypatch.undo()
    resumed = runner.invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert records(out) == records(tmp_path / "plain")
    with open(out / "summary.json", encoding="utf-8") as a, open(tmp_path / "plain" / "summary.json") as b:
        ours, theirs = json.load(a), json.load(b)
    assert {k: v for k, v in ours.items() if k not in TIMINGS} == {k: v for k, v in theirs.items() if k not in TIMINGS}


def records_without_clients(out):
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle], None
