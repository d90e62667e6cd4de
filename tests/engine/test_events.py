"""TensorBoard events (hasfl_ray/engine/events.py): every run writes RUN/events/ when tensorboard imports, one step per
round, a resumed run's steps replacing the interrupted run's, results unchanged; nothing at all without tensorboard."""

import json
import os
import sys

import pytest

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.events import SCALAR_KEYS, tensorboard_available

needs_tensorboard = pytest.mark.skipif(not tensorboard_available(), reason="needs tensorboard")

SMALL = dict(clients=8, clients_per_round=4, seed=11, local_epochs=1)


def events_of(run_dir):
    """(scalar values per tag as [(step, value)], histogram steps per tag) read back with TensorBoard's reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(os.path.join(run_dir, "events"), size_guidance={"scalars": 0, "histograms": 0})
    reader.Reload()
    scalars = {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}
    histograms = {tag: [e.step for e in reader.Histograms(tag)] for tag in reader.Tags()["histograms"]}
    return scalars, histograms


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


@needs_tensorboard
def test_every_round_is_one_step_of_each_scalar_and_histogram(tmp_path):
    out = str(tmp_path / "run")
    Engine(RunConfig(backend="local", rounds=3, **SMALL), out_dir=out).run()
    scalars, histograms = events_of(out)
    assert sorted(scalars) == sorted(SCALAR_KEYS)  # HAS-FL has H̃: mean_h too
    assert sorted(histograms) == ["h_tilde", "p"]
    lines = metrics(out)
    for key in SCALAR_KEYS:
        assert [step for step, _ in scalars[key]] == [0, 1, 2], key
        assert [value for _, value in scalars[key]] == pytest.approx([line[key] for line in lines], rel=1e-6), key
    assert histograms == {"h_tilde": [0, 1, 2], "p": [0, 1, 2]}


@needs_tensorboard
def test_an_algorithm_without_estimates_has_no_mean_h_and_no_h_tilde(tmp_path):
    out = str(tmp_path / "run")
    Engine(RunConfig(backend="local", rounds=2, algorithm="heterofl", **SMALL), out_dir=out).run()
    scalars, histograms = events_of(out)
    assert sorted(scalars) == sorted(k for k in SCALAR_KEYS if k != "mean_h")
    assert list(histograms) == ["p"] and histograms["p"] == [0, 1]


@needs_tensorboard
def test_events_change_no_result(tmp_path, monkeypatch):
    config = RunConfig(backend="local", rounds=2, **SMALL)
    watched = Engine(config, out_dir=str(tmp_path / "watched")).run()
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    unwatched = Engine(config, out_dir=str(tmp_path / "unwatched")).run()
    assert os.path.isdir(tmp_path / "watched" / "events") and not os.path.exists(tmp_path / "unwatched" / "events")
    assert watched["params_sha256"] == unwatched["params_sha256"]
    strip = lambda lines: [{k: v for k, v in line.items() if k != "wall_s"} for line in lines]  # noqa: E731
    assert strip(metrics(tmp_path / "watched")) == strip(metrics(tmp_path / "unwatched"))


@needs_tensorboard
def test_a_resumed_run_shows_one_value_per_round(tmp_path):
    """Crash in round 3 with a checkpoint after round 1: events for rounds 0-2 are on disk; the resumed run writes
    rounds 2-3 into a second event file, and TensorBoard shows each round once, with the resumed run's values."""
    out = str(tmp_path / "run")
    config = RunConfig(backend="local", rounds=4, checkpoint_every=2, **SMALL)
    crashed = Engine(config, out_dir=out)
    run_round = crashed.run_round

    def crash_in_round_3(t):
        if t == 3:
            raise KeyboardInterrupt
        return run_round(t)

    crashed.run_round = crash_in_round_3
    with pytest.raises(KeyboardInterrupt):
        crashed.run()
    assert [step for step, _ in events_of(out)[0]["test_accuracy"]] == [0, 1, 2]

    Engine(config, out_dir=out, resume=True).run()
    assert len(os.listdir(os.path.join(out, "events"))) == 2  # the first run's file and the resumed run's
    scalars, histograms = events_of(out)
    lines = metrics(out)
    for key in SCALAR_KEYS:
        assert [step for step, _ in scalars[key]] == [0, 1, 2, 3], key
        assert [value for _, value in scalars[key]] == pytest.approx([line[key] for line in lines], rel=1e-6), key
    assert histograms["p"] == [0, 1, 2, 3]


def test_without_tensorboard_nothing_is_written_and_nothing_said(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` raises ImportError
    assert not tensorboard_available()
    out = tmp_path / "run"
    with caplog.at_level("INFO", logger="hasfl_ray"):
        Engine(RunConfig(backend="local", rounds=2, **SMALL), out_dir=str(out)).run()
    assert not os.path.exists(out / "events")
    assert sorted(os.listdir(out)) == ["checkpoints", "clients.csv", "config.yaml", "log.txt", "metrics.csv",
                                       "metrics.jsonl", "summary.json"]
    assert not [r for r in caplog.records if "ensorboard" in r.getMessage() or "events" in r.getMessage()]


@needs_tensorboard
def test_a_failed_event_write_warns_once_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    from torch.utils.tensorboard import SummaryWriter

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SummaryWriter, "add_histogram", full_disk)
    out = str(tmp_path / "run")
    with caplog.at_level("WARNING", logger="hasfl_ray"):
        summary = Engine(RunConfig(backend="local", rounds=3, **SMALL), out_dir=out).run()
    assert summary["rounds"] == 3 and len(metrics(out)) == 3
    warnings = [r.getMessage() for r in caplog.records if "TensorBoard" in r.getMessage()]
    assert len(warnings) == 1 and "stop after round 0" in warnings[0] and "No space left" in warnings[0], warnings


@needs_tensorboard
def test_force_clears_the_events_with_the_run(tmp_path):
    out = str(tmp_path / "run")
    Engine(RunConfig(backend="local", rounds=2, **SMALL), out_dir=out).run()
    Engine(RunConfig(backend="local", rounds=2, **SMALL), out_dir=out, force=True).run()
    assert len(os.listdir(os.path.join(out, "events"))) == 1
    assert [step for step, _ in events_of(out)[0]["avg_p"]] == [0, 1]
