"""The bad-input battery, sweeps as they run (issue 24 rows 6, 9, 14, 31): cells running at once never share state
files, a cell given twice is refused, one SIGINT or SIGTERM stops the whole sweep with its running cells
checkpointed, and a second sweep into a folder being written is refused, each in one sentence."""

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from sweep_files import cells, sha
from hasfl_ray.engine.rundir import RunLock
from hasfl_ray.engine.signals import StopSignals
from hasfl_ray.files import claim_folder

TINY = {"rounds": 2, "clients": 6, "clients_per_round": 3}
HASFL_RAY = [sys.executable, "-c", "from hasfl_ray.cli.main import main; main()"]
needs_ray = pytest.mark.skipif(not __import__("importlib").util.find_spec("ray"), reason="needs Ray")


def write_sweep(path, block, **keys):
    path.write_text(yaml.safe_dump({"sweep": block, **TINY, **keys}))
    return str(path)


def sweep(*args):
    return CliRunner().invoke(main, ["sweep", *args], catch_exceptions=False)


def one_sentence(result, *words):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    for word in words:
        assert word in result.output, result.output


# ------------------------------------------------------------------------------------------------ row 6: CV dirs

def scaffold_alone(tmp_path, seed, cv):
    out = str(tmp_path / f"alone-{seed}")
    result = CliRunner().invoke(main, ["simulate", "--algorithm", "scaffold", "--seed", str(seed), "--rounds", "3",
                                       "--clients", "6", "--clients-per-round", "3", "--backend", "local", "--quiet",
                                       "--control-variates-dir", cv, "--out", out])
    assert result.exit_code == 0, result.output
    return sha(out)


def test_each_cell_keeps_its_control_variates_in_a_folder_of_its_own(tmp_path, monkeypatch):
    """issue 24 row 6: --control-variates-dir CV gives each cell CV/<cell name>; a single simulate keeps CV/."""
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"algorithms": ["scaffold"], "seeds": [42, 43]}, rounds=3)
    result = sweep(config, "--backend", "local", "--quiet", "--control-variates-dir", "cv", "--out", "out")
    assert result.exit_code == 0, result.output
    for seed in (42, 43):
        name = f"digits-scaffold-seed{seed}"
        assert any(f.startswith("client_") for f in os.listdir(os.path.join("cv", name)))
        assert yaml.safe_load(open(os.path.join("out", name, "config.yaml")))["control_variates_dir"] == \
            os.path.join("cv", name)
        assert sha(os.path.join("out", name)) == scaffold_alone(tmp_path, seed, f"alone-cv-{seed}")
    assert any(f.startswith("client_") for f in os.listdir("alone-cv-42"))  # simulate: the folder itself
    again = sweep(config, "--backend", "local", "--quiet", "--control-variates-dir", "cv", "--out", "out")
    assert again.exit_code == 0 and set(cells("out").values()) == {"skipped"}, again.output


@needs_ray
def test_ray_cells_running_at_once_do_not_share_control_variates(tmp_path, monkeypatch):
    """issue 24 row 6 (the original report): two SCAFFOLD cells as Ray tasks at once, one --control-variates-dir."""
    import ray

    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"algorithms": ["scaffold"], "seeds": [42, 43]}, rounds=3)
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 ** 2,
             logging_level="warning")
    try:
        result = sweep(config, "--backend", "ray", "--quiet", "--control-variates-dir", "cv", "--out", "out")
    finally:
        ray.shutdown()
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir("cv")) == ["digits-scaffold-seed42", "digits-scaffold-seed43"]
    for seed in (42, 43):
        assert sha(os.path.join("out", f"digits-scaffold-seed{seed}")) == scaffold_alone(tmp_path, seed, "alone")


def test_a_second_run_on_a_control_variates_dir_in_use_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    """Two runs (not cells of one sweep) pointed at one --control-variates-dir at once: the second is refused in one
    sentence and writes nothing, the first one's c_i files untouched; once the first ends, the folder serves
    again."""
    monkeypatch.chdir(tmp_path)
    cv = tmp_path / "cv"
    claim_folder(str(cv), "control variates")  # the first run made and marked it (issue 37 item 2)
    (cv / "client_0.pt").write_bytes(b"the first run's")
    with RunLock(str(cv), "control_variates_dir", "run"):  # a run writing there holds this lock (Engine.run)
        result = CliRunner().invoke(main, ["simulate", "--algorithm", "scaffold", "--rounds", "2", "--clients", "6",
                                           "--clients-per-round", "3", "--backend", "local", "--quiet",
                                           "--control-variates-dir", str(cv), "--out", "second"])
    one_sentence(result, "control_variates_dir", str(cv), "another hasfl-ray run", "choose another "
                 "--control-variates-dir")
    assert not os.path.exists("second")
    assert (cv / "client_0.pt").read_bytes() == b"the first run's"
    scaffold_alone(tmp_path, 42, str(cv))  # the lock released: a run uses the folder (and succeeds)
    assert len([f for f in os.listdir(cv) if f.startswith("client_")]) > 1


# --------------------------------------------------------------------------------------------- row 9: duplicates

@pytest.mark.parametrize("block, words", [
    # a list's repeated entry: named by the list (h66 late-a), before any cell name is made
    ({"seeds": [42, 42]}, ["seed 42 twice in sweep.seeds", "expected distinct seeds"]),
    ({"algorithms": ["fedavg", "fedavg"]}, ["algorithm 'fedavg' twice in sweep.algorithms", "distinct algorithms"]),
    ({"datasets": ["digits", "digits"]}, ["dataset 'digits' twice in sweep.datasets", "distinct datasets"]),
    # random-budget brings a HAS-FL cell with coverage on; a variant called hasfl (coverage off) has its name
    ({"algorithms": ["hasfl", "random-budget"], "variants": {"hasfl": {"algorithm": "hasfl", "coverage": False}}},
     ["gives sweep cell 'digits-hasfl-seed42' twice", "expected each dataset, algorithm and seed once"]),
])
def test_a_cell_given_twice_is_refused_before_anything_runs(tmp_path, block, words):
    """issue 24 row 9: never two runs in one cell folder (a cell left 'running', a real cell cancelled)."""
    config = write_sweep(tmp_path / "s.yaml", block)
    result = sweep(config, "--backend", "local", "--quiet", "--out", str(tmp_path / "out"))
    one_sentence(result, *words)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("where, block, keys, words", [
    ("variant", {"algorithms": ["good", "bad"], "variants": {"good": {"algorithm": "heterofl"},
                                                             "bad": {"algorithm": "fiarse", "alpha": -1}}}, {},
     "alpha is -1 (config file '{config}' sweep variant 'bad'); expected a number > 0"),
    ("shared", {"algorithms": ["fedavg"]}, {"momentum": 7},
     "momentum is 7 (config file '{config}'); expected a number in [0, 1]"),
    ("option", {"algorithms": ["bad"], "variants": {"bad": {"algorithm": "fiarse", "fiarse_scope": "nonsense"}}}, {},
     "fiarse_scope is 'nonsense' (sweep cell digits-bad-seed42); expected global"),
])
def test_a_bad_value_in_a_sweep_file_names_the_variant_or_cell_holding_it(tmp_path, where, block, keys, words):
    """A bad value in one of a sweep file's variants ("alpha is -1; expected a number > 0") did not say which of
    them holds it: the league's configs have 88. The sentence now names the layer of the file (or the cell, for an
    algorithm's option, checked as each cell is planned), before anything runs."""
    config = write_sweep(tmp_path / "s.yaml", {"seeds": [42], **block}, **keys)
    result = sweep(config, "--backend", "local", "--quiet", "--out", str(tmp_path / "out"))
    one_sentence(result, words.format(config=config))
    assert not os.path.exists(tmp_path / "out")


def test_a_cell_refused_as_it_starts_is_not_told_to_retry(tmp_path):
    """A cell refused as it starts (a width FIARSE keeps nothing of: the model is needed to see it, so the plan
    cannot) failed alone while the others finished, and the sweep ended "run the same command again to retry them",
    which fails the same way until its config changes. It now says the cell was refused and that its config needs
    changing; a cell that failed while it ran keeps the retry line (tests/cli/test_sweep.py)."""
    config = write_sweep(tmp_path / "s.yaml", {"seeds": [42], "algorithms": ["good", "bad"], "variants": {
        "good": {"algorithm": "heterofl"}, "bad": {"algorithm": "fiarse", "widths": [0.001, 1.0]}}})
    result = CliRunner().invoke(main, ["sweep", config, "--backend", "local", "--quiet", "--out",
                                       str(tmp_path / "out")])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "digits-bad-seed42: failed: width 0.001 gives fiarse model size 1e-06" in result.stdout
    assert result.stderr.strip() == (
        "Error: 1 of 2 cells was refused as it started, for bad input (digits-bad-seed42: the sentence above); "
        "expected a config it accepts: change it, then run the same command again (finished cells are skipped)")
    assert os.path.exists(tmp_path / "out" / "digits-good-seed42" / "summary.json")


# ------------------------------------------------------------------------------------ row 14: one signal stops all

def start_sweep(config, out, backend="local"):
    return subprocess.Popen(HASFL_RAY + ["sweep", config, "--backend", backend, "--quiet", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_round(process, metrics, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.exists() and metrics.read_text().strip():
            return
        time.sleep(0.05)
    raise AssertionError(f"no round written: {process.communicate(timeout=60)}")


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_one_signal_stops_the_whole_local_sweep_and_a_rerun_resumes_it(tmp_path, number):
    """issue 24 row 14: the running cell checkpoints, the next never starts, exit 130/143, none 'failed'."""
    config = write_sweep(tmp_path / "s.yaml", {"seeds": [42, 43]}, rounds=12, checkpoint_every=1)
    out = tmp_path / "out"
    process = start_sweep(config, out)
    wait_for_round(process, out / "digits-hasfl-seed42" / "metrics.jsonl")
    os.kill(process.pid, number)
    stdout, stderr = process.communicate(timeout=120)
    name = signal.Signals(number).name
    assert process.returncode == 128 + number, stdout + stderr
    assert "Traceback" not in stderr and "failed" not in stdout + stderr
    assert f"Stopped by {name}" in stderr and "run the same command again to resume them" in stderr
    assert f"sweep stopped by {name}: 1 interrupted, 1 pending" in stdout
    assert cells(out) == {"digits-hasfl-seed42": "interrupted", "digits-hasfl-seed43": "pending"}
    assert os.path.exists(out / "digits-hasfl-seed42" / "checkpoints" / "latest.pt")
    assert not os.path.exists(out / "digits-hasfl-seed43")  # never started
    if number == signal.SIGTERM:
        return  # the same stop: its resume is SIGINT's
    again = sweep(config, "--backend", "local", "--quiet", "--out", str(out))
    assert again.exit_code == 0, again.output
    assert cells(out) == {"digits-hasfl-seed42": "resumed", "digits-hasfl-seed43": "done"}
    alone = sweep(config, "--backend", "local", "--quiet", "--seeds", "42", "--out", str(tmp_path / "alone"))
    assert alone.exit_code == 0, alone.output
    assert sha(out / "digits-hasfl-seed42") == sha(tmp_path / "alone" / "digits-hasfl-seed42")


def test_a_signal_between_cells_stops_the_next_one_before_it_runs():
    """issue 24 row 14, its cousin: a signal caught by the sweep (between cells, or while a cell loads its data)
    reaches the run that starts next, and a run's signal reaches the sweep."""
    with StopSignals() as outer:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        with StopSignals() as inner:
            assert inner.signal_number == signal.SIGTERM
    with StopSignals() as outer:
        with StopSignals() as inner:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        assert outer.signal_number == signal.SIGINT


@needs_ray
def test_one_signal_stops_the_whole_ray_sweep_with_its_cells_checkpointed(tmp_path):
    """issue 24 row 14 on Ray: the driver's SIGINT stops every running task at the end of its client."""
    # 150 rounds of a fraction of a second: the cell is still running when the cancel reaches its task
    config = write_sweep(tmp_path / "s.yaml", {"seeds": [42, 43]}, rounds=150, checkpoint_every=1)
    out = tmp_path / "out"
    process = start_sweep(config, out, backend="ray")
    wait_for_round(process, out / "digits-hasfl-seed42" / "metrics.jsonl")
    os.kill(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stdout + stderr
    assert "Stopped by SIGINT" in stderr and "Traceback" not in stderr
    statuses = cells(out)
    assert statuses["digits-hasfl-seed42"] == "interrupted" and "failed" not in statuses.values()
    assert os.path.exists(out / "digits-hasfl-seed42" / "checkpoints" / "latest.pt")
    assert not os.path.exists(out / "digits-hasfl-seed42" / "summary.json")
    again = sweep(config, "--backend", "local", "--quiet", "--seeds", "42", "--out", str(out))  # resumed here
    assert again.exit_code == 0 and cells(out)["digits-hasfl-seed42"] == "resumed", again.output
    alone = sweep(config, "--backend", "local", "--quiet", "--seeds", "42", "--out", str(tmp_path / "alone"))
    assert alone.exit_code == 0, alone.output
    assert sha(out / "digits-hasfl-seed42") == sha(tmp_path / "alone" / "digits-hasfl-seed42")


# ------------------------------------------------------------------------------------- row 31: one sweep a folder

def test_a_second_sweep_into_a_folder_being_written_is_refused(tmp_path):
    """issue 24 row 31: the second sweep is one sentence at its start; the first ends with sweep.json right."""
    config = write_sweep(tmp_path / "s.yaml", {"seeds": [42, 43]}, rounds=8)
    out = tmp_path / "out"
    first = start_sweep(config, out)
    wait_for_round(first, out / "digits-hasfl-seed42" / "metrics.jsonl")
    second = sweep(config, "--backend", "local", "--quiet", "--out", str(out))
    assert first.poll() is None  # the refusal came while the first one ran
    one_sentence(second, f"sweep folder {str(out)!r} is being written by another hasfl-ray sweep")
    stdout, stderr = first.communicate(timeout=240)
    assert first.returncode == 0, stdout + stderr
    assert cells(out) == {"digits-hasfl-seed42": "done", "digits-hasfl-seed43": "done"}


def test_a_locked_sweep_folder_is_left_as_it_was(tmp_path):
    """issue 24 row 31: nothing of the folder is touched by the refused sweep (sweep.json included)."""
    config = write_sweep(tmp_path / "s.yaml", {"seeds": [42]})
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.json").write_text("{}\n")
    with RunLock(str(out)):  # another sweep at work (the lock is per open file: this process counts as another)
        result = sweep(config, "--backend", "local", "--quiet", "--out", str(out))
    one_sentence(result, "is being written by another hasfl-ray sweep", "one sweep per folder at a time")
    assert os.listdir(out) == ["sweep.json"] and (out / "sweep.json").read_text() == "{}\n"


@needs_ray
def test_a_ray_cell_asking_for_more_cpus_than_any_node_has_is_refused(tmp_path, monkeypatch):
    """issue 24 row 28's cousin on Ray sweeps: a cell's task asking for more CPUs than the largest node has would be
    queued for ever; one sentence before any cell is submitted, nothing made."""
    import ray

    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"algorithms": ["hasfl"], "seeds": [42]}, trainer_threads=3)
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=256 * 1024 ** 2,
             logging_level="warning")
    try:
        result = sweep(config, "--backend", "ray", "--quiet", "--out", "out")
    finally:
        ray.shutdown()
    one_sentence(result, "trainer_threads 3", "has 2 CPUs")
    assert not os.path.exists("out")


def test_top_level_ray_keys_of_a_sweep_config_are_named_not_dropped_without_a_word(tmp_path):
    """A sweep config's top-level ``fault_inject`` (or ``actors``: keys `simulate --config` takes from the same file)
    was dropped from every cell without a word; the sweep now says which keys its cells run without."""
    config = write_sweep(tmp_path / "faults.yaml", {"datasets": ["digits"], "algorithms": ["hasfl"], "seeds": [0]},
                         fault_inject="trainer-error@1", actors=2)
    result = CliRunner().invoke(main, ["sweep", config, "--out", str(tmp_path / "out"), "--backend", "local"])
    assert result.exit_code == 0, result.output
    assert ("note: the config's actors 2, fault_inject 'trainer-error@1' apply to `simulate --config` only; every "
            "sweep cell runs the local backend") in result.output
    assert "done" in result.output.splitlines()[-2]
