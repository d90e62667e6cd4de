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

SMALL = dict(clients=8, clients_per_round=4, seed=11)


def metrics_without_timings(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)


def a_checkpoint(round):
    return Checkpoint(round=round, params={"w": torch.full((3,), float(round))}, algorithm_state={"r": round},
                      history=[{"round": r} for r in range(round)], config=RunConfig().to_dict(), elapsed_s=1.0)


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
    assert config_differences(stored, RunConfig(lr=0.2, seed=1)) == ["seed 42 -> 1", "lr None -> 0.2"]
    del stored["synthetic_beta"]  # written before the field existed: its default stands in
    assert config_differences(stored, RunConfig()) == []
    with pytest.raises(ConfigError, match=r"different config \(trainer_threads 1 -> 2\)"):
        check_resume_config("run", stored, RunConfig(trainer_threads=2))


def test_resume_after_a_crash_in_process_is_bit_identical(tmp_path):
    config = RunConfig(rounds=4, checkpoint_every=2, **SMALL)
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
    assert {k: v for k, v in resumed.items() if k != "wall_s"} == {k: v for k, v in reference.items()
                                                                   if k != "wall_s"}


def test_resume_refuses_another_config_unless_forced(tmp_path):
    out = str(tmp_path / "run")
    Engine(RunConfig(rounds=2, **SMALL), out_dir=out).run()
    with pytest.raises(ConfigError, match=r"different config \(rounds 2 -> 3\)"):
        Engine(RunConfig(rounds=3, **SMALL), out_dir=out, resume=True).prepare()
    extended = Engine(RunConfig(rounds=3, **SMALL), out_dir=out, resume=True, force=True).run()
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
    checkpoint = Checkpoint(round=1, params={"w": torch.zeros(2)}, algorithm_state=state, history=[],
                            config=RunConfig().to_dict(), elapsed_s=0.0)
    save_checkpoint(str(tmp_path), checkpoint)
    loaded = load_checkpoint(str(tmp_path)).algorithm_state
    assert loaded["p_current"].dtype == np.float64 and np.array_equal(loaded["p_current"], state["p_current"])
    assert loaded["h"].tobytes() == state["h"].tobytes() and loaded["mask"].tolist() == [True, False]
    assert loaded["count"] == 3 and loaded["nested"] == [(1, 0.5)] and loaded["none"] is None
