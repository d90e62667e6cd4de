"""The bad-input battery, the run directory (issue 24 rows 4, 5, 8, 28, 30): a new run goes only into a missing or
empty folder, ``--resume`` only into a run directory, ``--force`` deletes only the files a run writes by name, a
checkpoint's round, history and the config agree, ``--trainer-threads`` is bounded by the machine, and a start
refused with exit 2 leaves nothing it made. Each refusal is one sentence and leaves every file as it was."""

import os

import pytest
from click.testing import CliRunner

import hasfl_ray
from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, LocalBackend, RunConfig
from hasfl_ray.engine.checkpoint import load_checkpoint, save_checkpoint
from hasfl_ray.errors import ConfigError

TINY = ["--backend", "local", "--dataset", "digits", "--clients", "4", "--clients-per-round", "2", "--quiet"]
needs_ray = pytest.mark.skipif(not __import__("importlib").util.find_spec("ray"), reason="needs Ray")


def simulate(*args):
    return CliRunner().invoke(main, ["simulate", *TINY, *args])


def one_sentence(result):
    message = result.output.strip()
    assert result.exit_code == 2, message
    assert "Traceback" not in message and len(message.splitlines()) == 1 and message.startswith("Error: "), message
    assert len(message) < 300, message
    return message


def tree(root):
    """Every path under ``root`` with its bytes (folders as None)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(folder, name), root)] = None
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                found[os.path.relpath(os.path.join(folder, name), root)] = handle.read()
    return found


@pytest.fixture
def here(tmp_path, monkeypatch):
    """An empty working folder (relative --out paths, short sentences)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-round run directory (a checkpoint after every round), copied by each test that changes it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    result = CliRunner().invoke(main, ["simulate", *TINY, "--rounds", "4", "--checkpoint-every", "1", "--out",
                                       str(out)])
    assert result.exit_code == 0, result.output
    return out


def copy_of(run, where):
    import shutil

    shutil.copytree(run, where)
    return where


# -- row 4: a new run only into a missing or empty folder; --resume only into a run directory -----------------------

def test_a_new_run_refuses_a_folder_holding_files_and_overwrites_none(here):
    """# issue 24 row 4: summary.json and metrics.jsonl of the user's, no config.yaml."""
    (here / "D").mkdir()
    (here / "D" / "summary.json").write_text("mine\n")
    (here / "D" / "metrics.jsonl").write_text("mine\n")
    before = tree(here)
    message = one_sentence(simulate("--rounds", "1", "--out", "D"))
    assert "'D' holds metrics.jsonl, summary.json and no run" in message and "missing or empty folder" in message
    assert tree(here) == before
    with pytest.raises(ConfigError, match="holds metrics.jsonl, summary.json and no run"):  # the Python API too
        hasfl_ray.simulate({"rounds": 1, "clients": 4, "clients_per_round": 2, "backend": "local"}, out_dir="D")
    assert tree(here) == before


def test_a_new_run_goes_into_an_empty_folder(here):
    """# issue 24 row 4: an empty folder is a new run's (a missing one is made)."""
    (here / "E").mkdir()
    result = simulate("--rounds", "1", "--out", "E")
    assert result.exit_code == 0, result.output
    assert (here / "E" / "summary.json").exists()


def test_resume_refuses_a_sweeps_folder_and_a_folder_without_a_run(here):
    """# issue 24 row 4: --resume on a folder that is not a run directory."""
    (here / "S" / "digits-hasfl-seed42").mkdir(parents=True)
    (here / "S" / "sweep.json").write_text("{}\n")
    (here / "notes").mkdir()
    (here / "notes" / "todo.txt").write_text("x\n")
    before = tree(here)
    message = one_sentence(simulate("--out", "S", "--resume"))
    assert "--resume cannot continue 'S'" in message and "sweep's folder" in message
    message = one_sentence(simulate("--out", "notes", "--resume", "--force"))
    assert "--resume cannot continue 'notes'" in message and "not a run directory" in message
    assert tree(here) == before


# -- row 5: --force deletes only the files a run writes, by name ---------------------------------------------------

@pytest.mark.parametrize("planted", ["checkpoints/my-best.pt", "events/NOTES.txt", "checkpoints/old/latest.pt"])
def test_force_refuses_a_users_file_in_checkpoints_or_events_and_deletes_nothing(finished, tmp_path, planted):
    """# issue 24 row 5"""
    run = copy_of(finished, tmp_path / "run")
    (run / planted).parent.mkdir(parents=True, exist_ok=True)
    (run / planted).write_bytes((run / "checkpoints" / "latest.pt").read_bytes())
    before = tree(run)
    message = one_sentence(simulate("--rounds", "1", "--out", str(run), "--force"))
    shown = planted if planted.count("/") == 1 else os.path.dirname(planted) + "/"
    assert f"holds {shown}, which no run writes" in message
    assert tree(run) == before


def test_force_clears_what_a_run_writes_by_name(finished, tmp_path):
    """# issue 24 row 5: the checkpoint, TensorBoard's event files and temporary files go; the run starts again."""
    run = copy_of(finished, tmp_path / "run")
    (run / "events").mkdir(exist_ok=True)
    (run / "events" / "events.out.tfevents.1700000000.host.1.0").write_bytes(b"x")
    (run / "checkpoints" / ".tmp-half").write_bytes(b"x")
    result = simulate("--rounds", "1", "--out", str(run), "--force")
    assert result.exit_code == 0, result.output
    assert not (run / "events" / "events.out.tfevents.1700000000.host.1.0").exists()
    assert not (run / "checkpoints" / ".tmp-half").exists()
    assert load_checkpoint(str(run)).round == 1


# -- row 8: a checkpoint's round, its history and the config agree -------------------------------------------------

def test_resume_force_with_fewer_rounds_than_the_checkpoint_is_refused(finished, tmp_path):
    """# issue 24 row 8: a finished 4-round run resumed with --force --rounds 2 keeps its result and config."""
    run = copy_of(finished, tmp_path / "run")
    before = tree(run)
    message = one_sentence(CliRunner().invoke(main, ["simulate", "--out", str(run), "--resume", "--force",
                                                     "--rounds", "2", "--quiet"]))
    assert "holds 4 completed rounds but rounds is 2" in message and "at least 4 rounds" in message
    assert tree(run) == before


@pytest.mark.parametrize("tamper, words", [
    (lambda c: setattr(c, "round", 1), "its round is 1 but its history holds 4 rounds"),
    (lambda c: c.history.extend(dict(c.history[-1], round=r) for r in (4, 5, 6, 7)),
     "its round is 4 but its history holds 8 rounds"),
    (lambda c: c.history.__setitem__(0, {}), "its history line 0 has no 'round'"),
    (lambda c: c.history[2].update(test_accuracy="high"), "its history line 2 has test_accuracy 'high', not a number"),
    (lambda c: c.history[1].update(round=3), "its history line 1 is of round 3"),
])
def test_a_checkpoint_whose_round_and_history_disagree_is_refused(finished, tmp_path, tamper, words):
    """# issue 24 row 8: a tampered checkpoint is one sentence, never a KeyError or a longer result."""
    run = copy_of(finished, tmp_path / "run")
    checkpoint = load_checkpoint(str(run))
    tamper(checkpoint)
    save_checkpoint(str(run), checkpoint)
    before = tree(run)
    message = one_sentence(CliRunner().invoke(main, ["simulate", "--out", str(run), "--resume", "--quiet"]))
    assert words in message and "cannot be used" in message
    assert tree(run) == before


# -- row 28: --trainer-threads bounded by the machine ---------------------------------------------------------------

def test_trainer_threads_beyond_the_machine_are_refused_on_the_local_backend(here):
    """# issue 24 row 28: before anything is written (was libgomp out of memory, then a segfault)."""
    message = one_sentence(simulate("--rounds", "1", "--trainer-threads", "100000", "--out", "run"))
    assert f"trainer_threads is 100000, which needs 100000 CPUs, but this machine has {os.cpu_count()}" in message
    assert f"expected at most {os.cpu_count()}" in message
    assert os.listdir(here) == []


# -- row 30: a start refused with exit 2 leaves nothing it made ----------------------------------------------------

@pytest.mark.parametrize("out, words", [
    ("long/" + "x" * 300, "its folder name 'xxxxxxxxxx"),
    ("/".join(["y" * 210] * 20), "is a path of 4219 bytes"),
])
def test_an_out_that_cannot_be_made_leaves_none_of_its_folders(here, out, words):
    """# issue 24 row 30: a folder name over the filesystem's limit, or a path too long for the run's files."""
    message = one_sentence(simulate("--rounds", "1", "--out", out))
    assert words in message and "(choose another --out)" in message
    assert os.listdir(here) == []


class RefusingBackend(LocalBackend):
    """A backend whose start is refused, as Ray's is when it cannot start or the placement does not fit."""

    def start(self, *args):
        raise ConfigError("Ray could not start on this machine (a test); expected --backend local")


def test_a_refused_backend_start_removes_the_folders_and_log_it_made(here):
    """# issue 24 row 30: no RUN/ with an empty log.txt, no parents, only what this start made."""
    config = RunConfig(backend="local", rounds=1, clients=4, clients_per_round=2)
    with pytest.raises(ConfigError, match="Ray could not start"):
        Engine(config, out_dir="a/b/run", backend=RefusingBackend()).run()
    assert os.listdir(here) == []
    (here / "mine").mkdir()  # a folder of the user's, empty: it stays, empty
    with pytest.raises(ConfigError, match="Ray could not start"):
        Engine(config, out_dir="mine/run", backend=RefusingBackend()).run()
    assert tree(here) == {"mine": None}


@pytest.fixture(scope="module")
def ray_local():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=128 * 1024 ** 2,
             logging_level="warning")
    yield
    ray.shutdown()


@needs_ray
@pytest.mark.parametrize("flags, words", [
    (["--actors", "1000"], "actors is 1000 with trainer_threads 1, which needs 1000 CPUs"),
    (["--trainer-threads", "100000"], "trainer_threads is 100000, which needs 100000 CPUs"),
])
def test_a_ray_placement_refused_leaves_no_run_directory(ray_local, here, flags, words):
    """# issue 24 row 30: the placement is refused after Ray started; RUN/ and its log.txt go with it."""
    result = CliRunner().invoke(main, ["simulate", "--backend", "ray", "--rounds", "1", "--clients", "4",
                                       "--clients-per-round", "2", *flags, "--out", "run/inner", "--quiet"])
    assert words in one_sentence(result)
    assert os.listdir(here) == []
