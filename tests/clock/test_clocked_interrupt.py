"""A clocked run stopped in the middle of a round (a signal while its clients train) resumes on the same clock as a
run never stopped: the device clock moved past the round when its clients were invited, before they trained, and
the stop's checkpoint kept that move, so the resumed run counted the stopped round twice (its simulated time, each
invited client's busy and waiting seconds, and so wait_share and the league's time axis, off from there on)."""

import json
import os
import signal

import pytest

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.engine import Engine as EngineClass
from hasfl_ray.errors import RunInterrupted

KEYS = dict(backend="local", clients=6, clients_per_round=3, rounds=4, local_epochs=1, seed=5, checkpoint_every=0,
            devices="lognormal")


def read(out):
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    with open(os.path.join(out, "clients.csv"), encoding="utf-8") as handle:
        return [{k: v for k, v in line.items() if k != "wall_s"} for line in lines], handle.read()


@pytest.mark.parametrize("algorithm", ["heterofl", "fedavg"])
def test_a_round_stopped_while_its_clients_train_is_not_counted_twice_on_the_clock(tmp_path, monkeypatch,
                                                                                   algorithm):
    keys = dict(KEYS, algorithm=algorithm)
    plain = Engine(RunConfig(**keys), out_dir=str(tmp_path / "plain")).run()
    clocked_round = EngineClass._clocked_round
    sent = []

    def signalling(self, t, invitation, shapes):
        kept = clocked_round(self, t, invitation, shapes)  # the clock has moved past round t
        if t == 2 and not sent:  # the round's first client trains, then the backend sees the stop
            sent.append(os.kill(os.getpid(), signal.SIGTERM))
        return kept

    out = str(tmp_path / "stopped")
    monkeypatch.setattr(EngineClass, "_clocked_round", signalling)
    with pytest.raises(RunInterrupted) as stopped:
        Engine(RunConfig(**keys), out_dir=out).run()
    monkeypatch.undo()
    assert sent and stopped.value.rounds_done == 2  # stopped inside round 2: two rounds recorded
    resumed = Engine(RunConfig(**keys), out_dir=out, resume=True).run()
    assert resumed["params_sha256"] == plain["params_sha256"]
    assert resumed["sim_hours"] == plain["sim_hours"]
    assert read(out) == read(str(tmp_path / "plain"))  # every round's sim_time_s, each client's wait_share
