"""A checkpoint's device clock is checked whole on --resume, as its parameters are (issue 37 item 5): a negative,
NaN, missing or malformed clock state is refused in one sentence and nothing is written; a clocked run is never
resumed into negative simulated time or restarted at 0."""

import shutil

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine.checkpoint import checkpoint_path

from test_checkpoint import RUN_ARGS, snapshot, summary

CLOCKED = RUN_ARGS + ["--devices", "lognormal"]


@pytest.fixture(scope="module")
def clocked_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("clocked") / "run"
    result = CliRunner().invoke(main, CLOCKED + ["--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def arrays(clock):
    return clock["busy"]["__ndarray__"] if isinstance(clock["busy"], dict) else clock["busy"]


@pytest.mark.parametrize("how, words", [
    ("negative time", "its clock's simulated time is -5.0"),
    ("NaN time", "its clock's simulated time is nan"),
    ("missing key", "its clock state lacks waiting"),
    ("no clock", "it holds no clock state"),
    ("negative busy", "its clock's busy holds a negative or non-finite time"),
    ("wrong length", "its clock's invited has shape (2,) for 4 clients"),
    ("not a mapping", "its clock state is a list"),
])
def test_a_bad_clock_state_is_refused_in_one_sentence_and_nothing_changes(clocked_run, tmp_path, how, words):
    out = tmp_path / "run"
    shutil.copytree(clocked_run, out)
    path = checkpoint_path(str(out))
    values = torch.load(path, weights_only=True)
    clock = values["clock"]
    if how == "negative time":
        clock["now"] = -5.0
    elif how == "NaN time":
        clock["now"] = float("nan")
    elif how == "missing key":
        del clock["waiting"]
    elif how == "no clock":
        values["clock"] = None
    elif how == "negative busy":
        arrays(clock)[0] = -1.0
    elif how == "wrong length":
        invited = clock["invited"]
        clock["invited"] = {"__ndarray__": invited["__ndarray__"][:2]} if isinstance(invited, dict) else invited[:2]
    elif how == "not a mapping":
        values["clock"] = [1, 2]
    torch.save(values, path)
    before = snapshot(out)
    result = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    message = result.output.strip()
    assert result.exit_code == 2, message
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert f"checkpoint {path!r} does not match this run" in message and words in message, message
    assert snapshot(out) == before


def test_the_untouched_clocked_checkpoint_resumes(clocked_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(clocked_run, out)
    result = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert result.exit_code == 0, result.output
    assert summary(out)["params_sha256"] == summary(clocked_run)["params_sha256"]
