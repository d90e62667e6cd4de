"""The fourth battery, item 2 (issue 37): every folder hasfl-ray writes is checked like `simulate --out`, under one
ownership rule (hasfl_ray.files.ownership_problem): a missing or empty folder, or one hasfl-ray marked for that
kind of file; anything else is one sentence, exit 2, nothing of the user's touched. `--control-variates-dir`,
`report --out` and `plot --out`."""

import os

import pytest

from hasfl_ray.engine.rundir import RunLock
from hasfl_ray.files import OWNER_MARK, claim_folder, folder_owner, ownership_problem
from sentences import invoke, refused

SCAFFOLD = ["simulate", "--algorithm", "scaffold", "--rounds", "1", "--clients", "4", "--clients-per-round", "2",
            "--backend", "local", "--quiet"]


# --------------------------------------------------------------------------------------------- the one rule

def test_the_ownership_rule(tmp_path):
    folder = str(tmp_path / "f")
    assert ownership_problem(folder, "report") is None  # missing
    os.mkdir(folder)
    assert ownership_problem(folder, "report") is None  # empty
    (tmp_path / "f" / "table.md").write_text("mine")
    assert "table.md" in ownership_problem(folder, "report")
    claim = claim_folder(str(tmp_path / "g" / "h"), "report")
    assert folder_owner(claim.path) == "report" and claim.made == [str(tmp_path / "g"), str(tmp_path / "g" / "h")]
    (tmp_path / "g" / "h" / "table.md").write_text("ours")
    assert ownership_problem(claim.path, "report") is None
    assert "report folder" in ownership_problem(claim.path, "control variates")
    (tmp_path / "g" / "h" / OWNER_MARK).write_text('{"written_by": "someone"}')  # not our mark
    assert ownership_problem(claim.path, "report") is not None
    claim.undo()  # the claim made both folders: its files go, then they
    assert not (tmp_path / "g").exists()


# ----------------------------------------------------------------------------------------- report and plot

@pytest.mark.parametrize("command", ["report", "plot"])
def test_an_out_holding_the_users_files_is_refused_and_untouched(run, command):
    os.mkdir("mine")
    for name in ("table.md", "digits-convergence.png"):
        with open(os.path.join("mine", name), "w") as handle:
            handle.write("the user's")
    refused(invoke(command, run, "--out", "mine"), "output folder", "'mine'", "no hasfl-ray mark", "--out")
    assert sorted(os.listdir("mine")) == ["digits-convergence.png", "table.md"]
    for name in os.listdir("mine"):
        assert open(os.path.join("mine", name)).read() == "the user's"


def test_a_folder_report_made_is_written_again_by_report_and_plot(run):
    assert invoke("report", run, "--out", "rep").exit_code == 0
    assert folder_owner("rep") == "report" and os.path.isfile("rep/table.md")
    assert invoke("report", run, "--out", "rep").exit_code == 0  # its own files: written again
    assert invoke("plot", run, "--out", "rep").exit_code == 0
    os.mkdir("empty")
    assert invoke("plot", run, "--out", "empty").exit_code == 0  # an empty folder is taken, and marked
    assert folder_owner("empty") == "report"


def test_report_refuses_a_control_variates_folder(run):
    claim_folder("cv", "control variates")
    open("cv/client_0.pt", "wb").close()
    refused(invoke("report", run, "--out", "cv"), "control variates folder", "not its report folder")
    assert sorted(os.listdir("cv")) == [OWNER_MARK, "client_0.pt"]


# ------------------------------------------------------------------------------------- --control-variates-dir

def test_a_users_client_file_is_never_replaced(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("cv")
    with open("cv/client_0.pt", "w") as handle:
        handle.write("the user's")
    refused(invoke(*SCAFFOLD, "--control-variates-dir", "cv", "--out", "run"), "control_variates_dir", "'cv'",
            "client_0.pt", "--control-variates-dir")
    assert os.listdir("cv") == ["client_0.pt"] and open("cv/client_0.pt").read() == "the user's"
    assert not os.path.exists("run")


@pytest.mark.parametrize("target, words", [
    ("/dev/full", ["'/dev/full'", "is a device"]),
    ("afile", ["'afile'", "is a file"]),
    ("run", ["'run'", "is the run directory"]),
    ("run/cv", ["'run/cv'", "inside the run directory"]),
])
def test_a_control_variates_dir_that_cannot_be_ours_is_one_sentence_naming_it(tmp_path, monkeypatch, target, words):
    """/dev/full and a file were the algorithm's FileExistsError; the run's own folder was "another run"."""
    monkeypatch.chdir(tmp_path)
    open("afile", "w").close()
    message = refused(invoke(*SCAFFOLD, "--control-variates-dir", target, "--out", "run"), "control_variates_dir",
                      *words)
    assert "scaffold" not in message and "another hasfl-ray run" not in message
    assert sorted(os.listdir(".")) == ["afile"]


def test_a_refused_start_leaves_no_control_variates_folder(tmp_path, monkeypatch):
    """The run directory is being written by another run: the start is refused after prepare, and the folder
    (with its parents) that prepare made is gone again."""
    monkeypatch.chdir(tmp_path)
    with RunLock("run"):
        refused(invoke(*SCAFFOLD, "--control-variates-dir", "cvs/inner", "--out", "run"), "another hasfl-ray run")
    assert not os.path.exists("cvs")


def test_the_folder_a_run_made_serves_the_next_run_and_its_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert invoke(*SCAFFOLD, "--control-variates-dir", "cv", "--out", "one").exit_code == 0
    assert folder_owner("cv") == "control variates" and any(f.startswith("client_") for f in os.listdir("cv"))
    assert invoke(*SCAFFOLD, "--control-variates-dir", "cv", "--out", "two").exit_code == 0
    result = invoke(*SCAFFOLD[:2], "scaffold", "--rounds", "2", *SCAFFOLD[5:], "--control-variates-dir", "cv",
                    "--out", "two", "--resume", "--force")  # one more round from its checkpoint
    assert result.exit_code == 0, result.output
    os.mkdir("empty")
    assert invoke(*SCAFFOLD, "--control-variates-dir", "empty", "--out", "three").exit_code == 0
    assert folder_owner("empty") == "control variates"
