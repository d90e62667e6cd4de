"""A run's history kept compactly (hasfl_ray/engine/history.py, issue 46 item 4): every line but the last pickled, read
back equal; the last completed in place; the coverage streak counted from the new lines only."""

import math
import pickle

import pytest

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.coverage import frozen_streak_start, streak_after
from hasfl_ray.engine.history import History


def line(t, frozen=0.0):
    return {"round": t, "test_accuracy": 0.1 * t, "accuracy_at_width": {0.25: 0.5, 1.0: 0.75},
            "train_loss_by_client": {"3": 1.5}, "frozen_fraction": frozen, "test_loss": math.nan if t == 2 else 1.0}


def test_a_history_reads_back_the_lines_appended_and_keeps_the_older_ones_pickled():
    lines = [line(t) for t in range(5)]
    history = History()
    for t, kept in enumerate(lines):
        history.append(dict(kept))
        assert len(history) == t + 1 and history[-1] is not None
    assert len(history._packed) == 4 and all(isinstance(packed, bytes) for packed in history._packed)
    assert history.packed_bytes == sum(len(pickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL)) for kept in lines[:4])
    same = [{**kept, "test_loss": "nan"} if kept["round"] == 2 else kept for kept in lines]  # NaN != NaN
    read = [{**got, "test_loss": "nan"} if got["round"] == 2 else got for got in history]
    assert read == same and history[1] == lines[1] and history[-5] == lines[0]
    assert [got["round"] for got in history[1:4]] == [1, 2, 3] and [got["round"] for got in reversed(history)] == \
        [4, 3, 2, 1, 0]
    assert math.isnan(history[2]["test_loss"]) and history[0]["accuracy_at_width"] == {0.25: 0.5, 1.0: 0.75}
    with pytest.raises(IndexError, match="history index 5 out of range for 5 lines"):
        history[5]
    history[0]["round"] = 99  # an older line read back is a copy: nothing kept changes
    assert history[0]["round"] == 0
    history[-1].update(local_accuracy_mean=0.5)  # the last is the line itself, completed in place
    history.append(line(5))
    assert history[4]["local_accuracy_mean"] == 0.5 and History(lines[:2]) == lines[:2] and not History()


def test_the_coverage_streak_is_counted_from_the_new_lines_as_from_them_all():
    fractions = [0.5, 0.0, 0.2, 0.3, 0.0, 0.4, 0.4, 0.4]
    history, counted = History(), (0, None)
    for t, fraction in enumerate(fractions):
        history.append(line(t, fraction))
        counted = streak_after(history, *counted)
        assert counted == (t + 1, frozen_streak_start([line(k, f) for k, f in enumerate(fractions[:t + 1])]))
    assert counted == (8, 5)
    assert streak_after(History([line(0, 0.3)]), *counted) == (1, 0)  # another, shorter history: read it all


def test_an_engines_history_is_compact_and_its_checkpoint_holds_every_line(tmp_path):
    engine = Engine(RunConfig(backend="local", rounds=3, clients=6, clients_per_round=3, checkpoint_every=3),
                    out_dir=str(tmp_path))
    engine.run()
    assert isinstance(engine.history, History) and len(engine.history._packed) == 2
    assert [got["round"] for got in engine.history] == [0, 1, 2]
    resumed = Engine(RunConfig(backend="local", rounds=4, clients=6, clients_per_round=3, checkpoint_every=3),
                     out_dir=str(tmp_path), resume=True, force=True)
    resumed.run()
    assert isinstance(resumed.history, History) and [got["round"] for got in resumed.history] == [0, 1, 2, 3]
    assert resumed.history[:3] == list(engine.history)
