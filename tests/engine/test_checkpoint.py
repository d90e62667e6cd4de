"""Checkpoints: atomic writes, the resume config check, and resumption (in process and after SIGKILL) ending
bit-identical to an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine import rundir as rundir_module
from hasfl_ray.engine.checkpoint import (Checkpoint, check_resume_config, checkpoint_path, config_differences,
                                         load_checkpoint, save_checkpoint)
from hasfl_ray.errors import ConfigError
from hasfl_ray.engine.records import TIMINGS

SMALL = dict(clients=8, clients_per_round=4, seed=11)


def metrics_without_timings(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


def a_checkpoint(round):
    history = [{**dict.fromkeys(rundir_module.METRIC_KEYS, 0.0), "round": r} for r in range(round)]  # one a round
    return Checkpoint(round=round, params={"w": torch.full((3,), float(round))}, algorithm_state={"r": round},
                      history=history, config=RunConfig(backend="local").to_dict(), elapsed_s=1.0)


def test_save_load_round_trip(tmp_path):
    save_checkpoint(str(tmp_path), a_checkpoint(4))
    loaded = load_checkpoint(str(tmp_path))
    assert loaded.round == 4 and torch.equal(loaded.params["w"], torch.full((3,), 4.0))
    assert loaded.algorithm_state == {"r": 4} and len(loaded.history) == 4
    assert load_checkpoint(str(tmp_path / "elsewhere")) is None


def test_a_crash_mid_write_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    save_checkpoint(str(tmp_path), a_checkpoint(2))

    def crash(fd):
        raise KeyboardInterrupt  # the process dies between writing the bytes and the rename

    monkeypatch.setattr(rundir_module.os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(str(tmp_path), a_checkpoint(3))
    monkeypatch.undo()
    assert load_checkpoint(str(tmp_path)).round == 2
    directory = os.path.dirname(checkpoint_path(str(tmp_path)))
    open(os.path.join(directory, ".tmp-left-by-sigkill"), "wb").close()
    save_checkpoint(str(tmp_path), a_checkpoint(5))
    assert os.listdir(directory) == ["latest.pt"] and load_checkpoint(str(tmp_path)).round == 5


def test_a_corrupt_checkpoint_is_one_sentence(tmp_path):
    os.makedirs(os.path.dirname(checkpoint_path(str(tmp_path))))
    with open(checkpoint_path(str(tmp_path)), "wb") as handle:
        handle.write(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_checkpoint(str(tmp_path))


def test_execution_fields_may_change_result_fields_may_not():
    stored = RunConfig(backend="local", checkpoint_every=5).to_dict()
    assert config_differences(stored, RunConfig(backend="ray", actors=3, checkpoint_every=1, data_dir="/x")) == []
    assert config_differences(stored, RunConfig(backend="local", lr=0.2, seed=1)) == ["seed 42 -> 1", "lr None -> 0.2"]
    del stored["synthetic_beta"]  # written before the field existed: its default stands in
    assert config_differences(stored, RunConfig(backend="local")) == []
    with pytest.raises(ConfigError, match=r"different config \(trainer_threads 1 -> 2\)"):
        check_resume_config("run", stored, RunConfig(backend="local", trainer_threads=2))


def test_resume_after_a_crash_in_process_is_bit_identical(tmp_path):
    config = RunConfig(backend="local", rounds=4, checkpoint_every=2, **SMALL)
    reference = Engine(config, out_dir=str(tmp_path / "reference")).run()

    crashed = Engine(config, out_dir=str(tmp_path / "run"))
    run_round = crashed.run_round

    def crash_in_round_3(t):
        if t == 3:
            raise KeyboardInterrupt
        return run_round(t)

    crashed.run_round = crash_in_round_3
    with pytest.raises(KeyboardInterrupt):
        crashed.run()
    assert len(metrics_without_timings(tmp_path / "run")) == 3  # rounds 0-2 written, checkpoint after round 1
    assert load_checkpoint(str(tmp_path / "run")).round == 2

    resumed = Engine(config, out_dir=str(tmp_path / "run"), resume=True).run()
    assert resumed["params_sha256"] == reference["params_sha256"]
    assert metrics_without_timings(tmp_path / "run") == metrics_without_timings(tmp_path / "reference")
    assert {k: v for k, v in resumed.items() if k not in TIMINGS} == {k: v for k, v in reference.items() if k not in TIMINGS}


def test_resume_refuses_another_config_unless_forced(tmp_path):
    out = str(tmp_path / "run")
    Engine(RunConfig(backend="local", rounds=2, **SMALL), out_dir=out).run()
    with pytest.raises(ConfigError, match=r"different config \(rounds 2 -> 3\)"):
        Engine(RunConfig(backend="local", rounds=3, **SMALL), out_dir=out, resume=True).prepare()
    extended = Engine(RunConfig(backend="local", rounds=3, **SMALL), out_dir=out, resume=True, force=True).run()
    assert extended["rounds"] == 3 and len(metrics_without_timings(out)) == 3


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path):
    args = ["simulate", "--backend", "local", "--rounds", "8", "--local-epochs", "1", "--clients", "8",
            "--clients-per-round", "4", "--seed", "11", "--checkpoint-every", "2", "--quiet"]
    killed = str(tmp_path / "killed")
    hasfl_ray = [sys.executable, "-c", "from hasfl_ray.cli.main import main; main()"]  # `hasfl-ray`
    process = subprocess.Popen(hasfl_ray + args + ["--out", killed],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = os.path.join(killed, "metrics.jsonl")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if os.path.exists(metrics) and sum(1 for _ in open(metrics, encoding="utf-8")) >= 3:
            break
        time.sleep(0.02)
    assert process.poll() is None, process.stderr.read().decode()
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    process.stderr.close()
    assert not os.path.exists(os.path.join(killed, "summary.json"))
    assert load_checkpoint(killed).round % 2 == 0  # lines past the checkpoint are redone

    runner = CliRunner()
    resumed = runner.invoke(main, ["simulate", "--out", killed, "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    reference = runner.invoke(main, args + ["--out", str(tmp_path / "reference")])
    assert reference.exit_code == 0, reference.output
    assert summary(killed)["params_sha256"] == summary(tmp_path / "reference")["params_sha256"]
    assert metrics_without_timings(killed) == metrics_without_timings(tmp_path / "reference")


class _RunsCodeWhenUnpickled:
    """A pickle payload that would create ``marker`` (a stand-in for os.system) if it were ever unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_checkpoint_is_refused_on_resume_without_running_its_code(tmp_path):
    out = str(tmp_path / "run")
    args = ["simulate", "--backend", "local", "--rounds", "2", "--clients", "8", "--clients-per-round", "4",
            "--checkpoint-every", "1", "--quiet", "--out", out]
    runner = CliRunner()
    assert runner.invoke(main, args).exit_code == 0
    marker = tmp_path / "code-ran"
    planted = {"format_version": 2, "round": 1, "params": {}, "algorithm_state": _RunsCodeWhenUnpickled(str(marker)),
               "history": [], "config": {}, "elapsed_s": 0.0}
    torch.save(planted, checkpoint_path(out))
    result = runner.invoke(main, args + ["--resume"])
    assert result.exit_code == 2, result.output
    assert not marker.exists()  # refused before any of its code ran
    message = result.output.strip()
    assert "cannot be read" in message and "Traceback" not in message and len(message.splitlines()) == 1


def test_numpy_algorithm_state_round_trips_bit_for_bit_through_the_safe_loader(tmp_path):
    import numpy as np

    state = {"p_current": np.array([0.25, 1 / 3, 0.7]), "h": np.arange(4, dtype=np.float64) / 7,
             "mask": np.array([True, False]), "count": np.int64(3), "nested": [(1, np.float32(0.5))], "none": None}
    checkpoint = Checkpoint(round=0, params={"w": torch.zeros(2)}, algorithm_state=state, history=[],
                            config=RunConfig(backend="local").to_dict(), elapsed_s=0.0)
    save_checkpoint(str(tmp_path), checkpoint)
    loaded = load_checkpoint(str(tmp_path)).algorithm_state
    assert loaded["p_current"].dtype == np.float64 and np.array_equal(loaded["p_current"], state["p_current"])
    assert loaded["h"].tobytes() == state["h"].tobytes() and loaded["mask"].tolist() == [True, False]
    assert loaded["count"] == 3 and loaded["nested"] == [(1, 0.5)] and loaded["none"] is None


# ---- a checkpoint is checked before it is used (issue 18 item 4) ---------------------------------------------------

RUN_ARGS = ["simulate", "--backend", "local", "--rounds", "2", "--clients", "4", "--clients-per-round", "2",
            "--checkpoint-every", "1", "--quiet"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A real two-round run with a checkpoint after each round (copied by each test before it tampers)."""
    out = tmp_path_factory.mktemp("checkpointed") / "run"
    result = CliRunner().invoke(main, RUN_ARGS + ["--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def snapshot(directory):
    """Every entry under ``directory``: its bytes (or link target) and modification time."""
    state = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                state[os.path.relpath(path, directory)] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    state[os.path.relpath(path, directory)] = (handle.read(), os.stat(path).st_mtime_ns)
            else:
                state[os.path.relpath(path, directory)] = ("dir",)
    return state


def tampered(values, how):
    """``values`` (a checkpoint as torch.load reads it) changed as ``how`` says."""
    first = next(iter(values["params"]))
    state = values["algorithm_state"]
    if how == "wrong shape":
        values["params"][first] = values["params"][first][:1].clone()
    elif how == "wrong dtype":
        values["params"][first] = values["params"][first].double()
    elif how == "missing parameter":
        del values["params"][first]
    elif how == "NaN parameter":
        values["params"][first].view(-1)[0] = float("nan")
    elif how == "infinite parameter":
        values["params"][first].view(-1)[-1] = float("inf")
    elif how == "state without a key":
        del state["h"]
    elif how == "state with an unknown key":
        state["surprise"] = 1
    elif how == "state array of the wrong shape":
        state["h"] = {"__ndarray__": torch.ones(3, dtype=torch.float64)}
    elif how == "state array of the wrong kind":
        state["h"] = {"__ndarray__": torch.ones(4, dtype=torch.int64)}
    elif how == "state value of the wrong type":
        state["p_current"] = "wide"
    elif how == "NaN in the state":
        state["p_current"]["__ndarray__"][0] = float("nan")
    elif how == "state not a mapping":
        values["algorithm_state"] = [1, 2]
    elif how != "untouched":
        raise AssertionError(how)
    return values


@pytest.mark.parametrize("how, words", [
    ("wrong shape", ["does not match this run", "parameter 'features.0.weight' is float32 [1, 1, 3, 3]",
                     "not the model's float32 [32, 1, 3, 3]"]),
    ("wrong dtype", ["parameter 'features.0.weight' is float64 [32, 1, 3, 3]", "not the model's float32"]),
    ("missing parameter", ["lacks parameter 'features.0.weight'"]),
    ("NaN parameter", ["parameter 'features.0.weight' holds 1 NaN or infinite values"]),
    ("infinite parameter", ["holds 1 NaN or infinite values"]),
    ("state without a key", ["algorithm_state lacks 'h'"]),
    ("state with an unknown key", ["algorithm_state has an unknown 'surprise'"]),
    ("state array of the wrong shape", ["algorithm_state['h'] is float64 [3], not float64 [4]"]),
    ("state array of the wrong kind", ["algorithm_state['h'] is int64 [4], not float64 [4]"]),
    ("state value of the wrong type", ["algorithm_state['p_current'] is a str, not an array"]),
    ("NaN in the state", ["algorithm_state['p_current'] holds NaN or infinite values"]),
    ("state not a mapping", ["its algorithm_state is a list"]),
])
def test_a_tampered_checkpoint_is_refused_in_one_sentence_and_nothing_changes(finished_run, tmp_path, how, words):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    path = checkpoint_path(str(out))
    torch.save(tampered(torch.load(path, weights_only=True), how), path)
    before = snapshot(out)
    result = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    message = result.output.strip()
    assert result.exit_code == 2, message
    assert len(message.splitlines()) == 1 and message.startswith("Error: ") and "Traceback" not in message, message
    assert f"checkpoint {path!r}" in message and "--force without --resume" in message, message
    for word in words:
        assert word in message, (word, message)
    assert snapshot(out) == before  # refused before anything was written


def test_the_untouched_checkpoint_resumes(finished_run, tmp_path):
    """The battery's control: the same copy, rewritten by torch.save without a change, resumes (exit 0)."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    path = checkpoint_path(str(out))
    torch.save(tampered(torch.load(path, weights_only=True), "untouched"), path)
    result = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert result.exit_code == 0, result.output
    assert summary(out)["params_sha256"] == summary(finished_run)["params_sha256"]


@pytest.mark.parametrize("keep", [0, 100, 0.5, -1])
def test_a_truncated_checkpoint_says_so_in_one_sentence(finished_run, tmp_path, keep):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    path = checkpoint_path(str(out))
    data = open(path, "rb").read()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep if keep >= 0 else len(data) + keep
    with open(path, "wb") as handle:
        handle.write(data[:cut])
    before = snapshot(out)
    result = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    message = result.output.strip()
    assert result.exit_code == 2, message
    assert len(message.splitlines()) == 1 and "Traceback" not in message and "Errno" not in message, message
    assert f"checkpoint {path!r} cannot be read (it is truncated or corrupt: {cut:,} bytes" in message, message
    assert "--force without --resume to start again" in message and "miniz" not in message, message
    assert snapshot(out) == before


# ---- run files are never followed through a link (issue 18 item 4) -------------------------------------------------

@pytest.mark.parametrize("name", ["log.txt", "metrics.jsonl", "config.yaml", "summary.json", "clients.csv",
                                  "checkpoints/latest.pt"])
def test_a_run_file_that_is_a_link_is_refused_on_resume(finished_run, tmp_path, name):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    target = tmp_path / "precious.txt"
    target.write_bytes((out / name).read_bytes())
    (out / name).unlink()
    os.symlink(target, out / name)
    before, precious = snapshot(out), target.read_bytes()
    result = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    message = result.output.strip()
    assert result.exit_code == 2, message
    assert len(message.splitlines()) == 1 and message.startswith("Error: ") and "Traceback" not in message, message
    assert name in message and "link" in message and str(target) in message, message
    assert snapshot(out) == before and target.read_bytes() == precious


def test_a_new_run_never_writes_its_log_through_a_link(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    os.symlink(target, out / "log.txt")
    result = CliRunner().invoke(main, RUN_ARGS + ["--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "has log.txt as a link" in result.output and result.output.strip().count("\n") == 0
    assert sorted(os.listdir(out)) == ["log.txt"] and target.read_text() == "keep me\n"


def test_a_link_planted_on_log_txt_after_prepare_is_not_followed(tmp_path):
    """The race: prepare() found no link; one appears before run() opens log.txt (O_NOFOLLOW refuses it)."""
    out = tmp_path / "run"
    engine = Engine(RunConfig(backend="local", rounds=1, clients=4, clients_per_round=2), out_dir=str(out))
    engine.prepare()
    out.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    os.symlink(target, out / "log.txt")
    with pytest.raises(ConfigError, match="has log.txt as a link"):
        engine.run()
    assert target.read_text() == "keep me\n" and sorted(os.listdir(out)) == ["log.txt"]
