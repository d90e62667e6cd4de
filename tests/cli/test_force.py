"""``--force`` deletes only what a run wrote: a folder holding anything else (a thesis), the root, the home folder
or the current folder is refused in one sentence, before anything runs, and every planted file survives."""

import os

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine.rundir import check_clearable, clear_run_directory, foreign_entries
from hasfl_ray.errors import ConfigError

RUN = ["simulate", "--backend", "local", "--dataset", "digits", "--rounds", "1", "--clients", "4",
       "--clients-per-round", "2", "--quiet"]


def tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, dirs, files in os.walk(root) for f in files + dirs)


def one_sentence(result):
    message = result.output.strip()
    assert result.exit_code == 2, message
    assert "Traceback" not in message and len(message.splitlines()) == 1 and message.startswith("Error: "), message
    return message


def test_force_on_a_folder_with_a_thesis_refuses_and_deletes_nothing(tmp_path):
    folder = tmp_path / "v"
    (folder / "sub").mkdir(parents=True)
    (folder / "thesis.tex").write_text("x\n")
    before = tree(folder)
    message = one_sentence(CliRunner().invoke(main, RUN + ["--out", str(folder), "--force"]))
    assert "no config.yaml" in message and str(folder) in message
    assert tree(folder) == before and (folder / "thesis.tex").read_text() == "x\n"


def test_force_on_a_run_directory_with_a_planted_file_names_it_and_keeps_everything(tmp_path):
    out = tmp_path / "run"
    assert CliRunner().invoke(main, RUN + ["--out", str(out)]).exit_code == 0
    (out / "thesis.tex").write_text("x\n")
    (out / "notes").mkdir()
    before = tree(out)
    message = one_sentence(CliRunner().invoke(main, RUN + ["--out", str(out), "--force"]))
    assert "thesis.tex" in message and "notes/" in message
    assert tree(out) == before


def test_force_clears_a_run_directory_and_runs_again(tmp_path):
    out = tmp_path / "run"
    assert CliRunner().invoke(main, RUN + ["--out", str(out)]).exit_code == 0
    (out / "checkpoints" / ".tmp-abc").write_text("half a write")
    first = (out / "metrics.jsonl").read_text()
    result = CliRunner().invoke(main, RUN + ["--out", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert (out / "metrics.jsonl").read_text().splitlines()[0].split('"wall_s"')[0] == \
        first.splitlines()[0].split('"wall_s"')[0]
    assert not (out / "checkpoints" / ".tmp-abc").exists()


@pytest.mark.parametrize("where", ["cwd", "home"])
def test_force_never_clears_the_current_or_home_folder_even_when_it_looks_like_a_run(tmp_path, monkeypatch, where):
    folder = tmp_path / "place"
    folder.mkdir()
    (folder / "config.yaml").write_text("dataset: digits\n")
    monkeypatch.setenv("HOME", str(folder) if where == "home" else str(tmp_path / "elsewhere"))
    monkeypatch.chdir(folder if where == "cwd" else tmp_path)
    out = "." if where == "cwd" else "~"
    with pytest.raises(ConfigError, match="current folder" if where == "cwd" else "home folder"):
        check_clearable(os.path.expanduser(out))
    assert (folder / "config.yaml").exists()


def test_force_never_clears_the_root():
    with pytest.raises(ConfigError, match="root folder"):
        check_clearable("/")


def test_a_folder_that_holds_the_current_folder_is_refused(tmp_path, monkeypatch):
    (tmp_path / "config.yaml").write_text("dataset: digits\n")
    (tmp_path / "checkpoints").mkdir()
    monkeypatch.chdir(tmp_path / "checkpoints")
    with pytest.raises(ConfigError, match="holds the current folder"):
        clear_run_directory(str(tmp_path))
    assert (tmp_path / "config.yaml").exists()


def test_foreign_entries_see_links_and_nested_folders(tmp_path):
    (tmp_path / "config.yaml").write_text("x")
    os.symlink("/etc", tmp_path / "log.txt")  # a run's name on something a run never makes
    (tmp_path / "checkpoints" / "deep").mkdir(parents=True)
    assert foreign_entries(str(tmp_path)) == ["checkpoints/deep/", "log.txt"]  # named inside the run's folder


def test_sweep_force_refuses_a_cell_folder_holding_foreign_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.yaml").write_text("dataset: digits\nrounds: 1\nclients: 4\nclients_per_round: 2\n"
                                         "backend: local\n")
    args = ["sweep", "plain.yaml", "--out", "sweep", "--seeds", "42", "--algorithms", "fedavg", "--quiet",
            "--backend", "local"]
    assert CliRunner().invoke(main, args).exit_code == 0
    cells = [d for d in os.listdir("sweep") if os.path.isdir(os.path.join("sweep", d))]
    assert len(cells) == 1
    (tmp_path / "sweep" / cells[0] / "thesis.tex").write_text("x\n")
    before = tree(tmp_path / "sweep")
    message = one_sentence(CliRunner().invoke(main, args + ["--rounds", "2", "--force"]))
    assert "thesis.tex" in message
    assert tree(tmp_path / "sweep") == before
