"""The run directory: one run at a time (a lock), every file replaced whole, a failed write ending in one sentence
that leaves the previous checkpoint usable."""

import errno
import json
import os

from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import rundir as rundir_module
from hasfl_ray.engine.checkpoint import load_checkpoint
from hasfl_ray.engine.rundir import RunDirectory, RunLock

ARGS = ["simulate", "--backend", "local", "--rounds", "4", "--clients", "6", "--clients-per-round", "3",
        "--checkpoint-every", "2", "--quiet"]


def test_a_second_run_on_a_locked_directory_is_refused_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    with RunLock(str(out)):  # a run in progress (the lock is per open file, so this process counts as another)
        result = CliRunner().invoke(main, ARGS + ["--out", str(out), "--force"])
    assert result.exit_code == 2, result.output
    assert "is being written by another hasfl-ray run" in result.output and "Traceback" not in result.output
    assert os.listdir(out) == []
    assert CliRunner().invoke(main, ARGS + ["--out", str(out)]).exit_code == 0  # released: the next run goes


def test_metrics_lines_are_replaced_whole(tmp_path):
    directory = RunDirectory(str(tmp_path))
    directory.reset_metrics([{"round": 0}])
    directory.append_metrics({"round": 1})
    assert directory.read_metrics() == [{"round": 0}, {"round": 1}]
    assert sorted(os.listdir(tmp_path)) == ["metrics.csv", "metrics.jsonl"]  # no temporary file left behind


def test_a_full_disk_ends_in_one_sentence_and_the_checkpoint_survives(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_write = rundir_module.atomic_write
    writes = {"metrics": 0}

    def fill_the_disk(path, data):
        if path.endswith("metrics.jsonl"):
            writes["metrics"] += 1
            if writes["metrics"] == 5:  # reset + rounds 0, 1, 2: the 4th line (round 3) meets a full disk
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(path, data)

    monkeypatch.setattr(rundir_module, "atomic_write", fill_the_disk)
    result = CliRunner().invoke(main, ARGS + ["--out", str(out)])
    assert result.exit_code == 1, result.output
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert "could not write metrics.jsonl" in message and "No space left on device" in message
    assert "checkpoint after round 1 is intact" in message
    assert load_checkpoint(str(out)).round == 2
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3  # the last whole version
    assert not (out / "summary.json").exists()

    monkeypatch.setattr(rundir_module, "atomic_write", real_write)  # space freed: --resume finishes the run
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    reference = CliRunner().invoke(main, ARGS + ["--out", str(tmp_path / "reference")])
    assert reference.exit_code == 0
    assert json.loads((out / "summary.json").read_text())["params_sha256"] == \
        json.loads((tmp_path / "reference" / "summary.json").read_text())["params_sha256"]


def test_a_full_disk_before_any_checkpoint_says_the_run_starts_again(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_write = rundir_module.atomic_write

    def fill_the_disk(path, data):
        if path.endswith("metrics.jsonl") and b"round" in data:  # round 0's line, before the first checkpoint
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(path, data)

    monkeypatch.setattr(rundir_module, "atomic_write", fill_the_disk)
    result = CliRunner().invoke(main, ARGS + ["--out", str(out)])
    assert result.exit_code == 1, result.output
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert message.endswith("(No space left on device); no checkpoint was written yet, so --resume starts the run "
                            "again from round 0 once the problem is fixed"), message
    assert load_checkpoint(str(out)) is None

    monkeypatch.setattr(rundir_module, "atomic_write", real_write)
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 4


def test_run_directory_problems_are_one_sentence_before_anything_is_made(tmp_path, monkeypatch):
    from hasfl_ray.engine.rundir import check_run_directory
    from hasfl_ray.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile.txt").write_text("x")
    for path, words in [("afile.txt", "is a file"), ("afile.txt/run", "'afile.txt' is a file"),
                        ("afile.txt/a/b", "'afile.txt' is a file"), ("/proc/hasfl-ray-x/run", "cannot be made in"),
                        ("/dev/full", "is a device"), ("/", "root folder"), ("", "expected a folder path")]:
        try:
            check_run_directory(path)
        except ConfigError as error:
            assert words in str(error) and "\n" not in str(error), (path, str(error))
        else:
            raise AssertionError(f"{path!r} was accepted")
    check_run_directory("new/deep/run")  # a path that can be made passes, and the trial folder is gone
    check_run_directory(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["afile.txt"]


def test_a_run_directory_that_cannot_be_written_is_refused(tmp_path, monkeypatch):
    """Read-only folders (a normal user's view of /, a read-only mount): os.access says no, or the trial folder
    fails; as root os.access says yes, so the trial is what catches it here."""
    import tempfile

    from hasfl_ray.engine.rundir import check_run_directory
    from hasfl_ray.errors import ConfigError

    monkeypatch.setattr(os, "access", lambda path, mode: False)
    try:
        check_run_directory(str(tmp_path / "run"))
    except ConfigError as error:
        assert "cannot be made in" in str(error) and "permission denied" in str(error)
    else:
        raise AssertionError("an unwritable parent was accepted")
    monkeypatch.undo()

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    result = CliRunner().invoke(main, ARGS + ["--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "Read-only file system" in result.output, result.output
    assert result.output.strip().count("\n") == 0 and not (tmp_path / "run").exists()


def test_outputs_get_the_mode_the_umask_gives_not_0600(tmp_path):
    import stat

    from hasfl_ray.files import atomic_write

    old = os.umask(0o002)  # a shared group folder
    try:
        atomic_write(str(tmp_path / "shared.json"), b"{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "shared.json").st_mode) == 0o664


def test_a_plugin_file_without_classes_says_it_defines_none(tmp_path):
    (tmp_path / "p.py").write_text("x = 1\n")
    result = CliRunner().invoke(main, ARGS + ["--algorithm", f"{tmp_path / 'p.py'}:Nope", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "defines none" in result.output and "one of \n" not in result.output


def test_a_missing_class_among_many_names_some_of_them_not_simulate_help(tmp_path):
    (tmp_path / "p.py").write_text("".join(f"class C{i}:\n    pass\n" for i in range(15)))
    result = CliRunner().invoke(main, ARGS + ["--algorithm", f"{tmp_path / 'p.py'}:Nope", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "one of the 15 classes defined there, e.g. C0" in result.output
    assert "simulate --help" not in result.output
