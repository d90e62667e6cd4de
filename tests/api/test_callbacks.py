"""Callbacks, early stopping and the result object (hasfl_ray/callbacks.py, hasfl_ray/results.py; issue 45 item 4):
called once per round (per server update in async mode) with the recorded line, results unchanged by them, a Stop
ending the run after that round with a checkpoint and ``stopped_early`` in the summary, and the run folder read back
by ``load_run`` (history, clients, the global model at any width)."""

import json
import os

import pytest
import torch

import hasfl_ray
from hasfl_ray.callbacks import Callback, EarlyStopping, Stop
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import extract

SMALL = dict(backend="local", clients=6, clients_per_round=3, seed=7, local_epochs=1, progress=False)


class Recorder(Callback):
    def __init__(self, stop_at=None):
        self.calls, self.stop_at = [], stop_at

    def on_run_start(self, run):
        self.calls.append(("start", len(run.history)))

    def on_round_end(self, line, run):
        self.calls.append(("round", line["round"], len(run.history)))
        return Stop("round budget") if line["round"] == self.stop_at else None

    def on_update(self, line, run):
        self.calls.append(("update", line["round"], len(run.history)))
        return Stop("update budget") if line["round"] == self.stop_at else None

    def on_run_end(self, summary, run):
        self.calls.append(("end", summary["rounds"]))


def test_callbacks_see_every_round_after_it_is_recorded_and_change_no_result(tmp_path):
    recorder = Recorder()
    watched = hasfl_ray.simulate(rounds=3, callbacks=[recorder], out_dir=str(tmp_path / "a"), **SMALL)
    plain = hasfl_ray.simulate(rounds=3, out_dir=str(tmp_path / "b"), **SMALL)
    assert recorder.calls == [("start", 0), ("round", 0, 1), ("round", 1, 2), ("round", 2, 3), ("end", 3)]
    assert watched["params_sha256"] == plain["params_sha256"]
    assert "stopped_early" not in watched


def test_a_stop_ends_the_run_after_that_round_as_if_it_had_that_many_rounds(tmp_path):
    out = str(tmp_path / "stopped")
    stopped = hasfl_ray.simulate(rounds=6, callbacks=[Recorder(stop_at=1)], out_dir=out, **SMALL)
    short = hasfl_ray.simulate(rounds=2, out_dir=str(tmp_path / "short"), **SMALL)
    assert stopped["stopped_early"] == {"round": 1, "reason": "round budget"}
    assert stopped["rounds"] == 2 and len(stopped.history) == 2
    assert stopped["params_sha256"] == short["params_sha256"]
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        assert json.load(handle)["stopped_early"]["round"] == 1
    assert os.path.isfile(os.path.join(out, "checkpoints", "latest.pt"))  # kept although 2 is no checkpoint round
    assert torch.equal(next(iter(hasfl_ray.load_run(out).params().values())),
                       next(iter(hasfl_ray.load_run(str(tmp_path / "short")).params().values())))


def test_async_runs_call_on_update_once_per_server_update_and_stop_there(tmp_path):
    recorder = Recorder(stop_at=2)
    result = hasfl_ray.simulate(rounds=8, mode="async", devices="lognormal", buffer_size=2,
                                callbacks=[recorder], out_dir=str(tmp_path / "async"), **SMALL)
    updates = [call for call in recorder.calls if call[0] == "update"]
    assert [call[1] for call in updates] == [0, 1, 2] and not [c for c in recorder.calls if c[0] == "round"]
    assert result["stopped_early"]["round"] == 2 and result["server_updates"] == 3


def test_early_stopping_counts_only_evaluated_rounds_without_improvement():
    stop = EarlyStopping(patience=2, min_delta=0.01)
    lines = [0.5, None, 0.505, 0.6, 0.59, None, 0.595]
    answers = [stop.on_round_end({"round": k, "test_accuracy": a}, None) for k, a in enumerate(lines)]
    assert answers[:6] == [None] * 6 and isinstance(answers[6], Stop)
    assert "0.6" in answers[6].reason and stop.best == 0.6
    with pytest.raises(ValueError, match="patience is 0"):
        EarlyStopping(patience=0)


@pytest.mark.parametrize("bad", [object(), Callback, "print"])
def test_something_that_is_no_callback_is_refused_in_one_sentence(bad):
    with pytest.raises(ConfigError, match=r"^callbacks\[0\] is .*; expected an object with on_round_end"):
        hasfl_ray.simulate(rounds=1, callbacks=[bad], **SMALL)


def test_the_result_and_the_folder_read_back_agree(tmp_path):
    out = str(tmp_path / "run")
    result = hasfl_ray.simulate(rounds=2, out_dir=out, **SMALL)
    assert isinstance(result, dict) and result["rounds"] == 2 and result.out_dir == out
    run = hasfl_ray.load_run(out)
    assert run.history == result.history and run.summary == json.loads(json.dumps(result.summary))
    assert [row["client"] for row in run.clients] == list(range(6))
    assert all(0 <= row["p_max"] <= 1 for row in run.clients)
    params = run.params()
    for width in (1.0, 0.5):
        model = run.model(width)
        specs = model.param_specs()
        for name, tensor in model.state_dict().items():
            if name in specs:
                assert torch.equal(tensor, extract(params[name], specs[name], width)), name
        assert not model.training
    with pytest.raises(ConfigError, match="^width is 2; expected a number in"):
        run.model(2)
    with pytest.raises(ConfigError, match="is not a folder; expected the out_dir of a hasfl-ray run"):
        hasfl_ray.load_run(str(tmp_path / "missing"))


def test_the_history_frame_has_a_row_per_round():
    pandas = pytest.importorskip("pandas", reason="needs pandas (frame() is pandas's view of .history)")
    result = hasfl_ray.simulate(rounds=2, **SMALL)
    frame = result.frame()
    assert isinstance(frame, pandas.DataFrame) and list(frame["round"]) == [0, 1]
    assert list(frame["test_accuracy"]) == [line["test_accuracy"] for line in result.history]
